"""A user's own DDP script, in the style of pytorch/examples' distributed DDP example
(ddp-tutorial-series/multinode.py), where one rank stalls: it hangs, or is only slow.

gloo on CPU, no process-group timeout (gloo's default: 30 min), torch.optim.SGD, RANK,
WORLD_SIZE and LOCAL_RANK from torchrun's environment, a checkpoint in a directory shared
by every node (written by global rank 0 through a temporary file), resumed from on every
start. It prints nothing of elastic-job's: each step a line of its own through logging,
stamped with the time (the e2e tests read the stall's length from the stamps).

`--stall` says how rank `--stall-rank` stalls at step `--stall-step`:

- `outside`: blocks forever outside any collective (a data loader whose read never
  returns), while its peers wait for it in DDP's gradient all-reduce;
- `side-collective`: blocks forever inside an all-reduce on a group of its own and one
  peer, made by every rank at the start, that the peer never calls (a metrics reduction
  only one rank reaches), while its peers wait in DDP's all-reduce;
- `slow`: one step 10 times as long as the others, once;
- `first-step`: a first step of `--first-step-seconds` (data loading, compilation) before
  the first optimizer step of every start; `--stall-rank -1`: on every rank.

The hangs and the slow step happen once per job: a marker in the checkpoint directory,
made before the stall, keeps the resumed run from stalling again.

    torchrun ... stalls.py TOTAL_STEPS SAVE_EVERY --checkpoint-dir DIR [--step-seconds S]
        [--stall {outside,side-collective,slow,first-step} --stall-rank R --stall-step N]
        [--first-step-seconds S]
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import threading
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

STALLS = ("outside", "side-collective", "slow", "first-step")


def log(rank: int, text: str) -> None:
    logging.info("[GPU%d] %s", rank, text)


class Stall:
    """What this rank does at the step it stalls at (nothing on the other ranks)."""

    def __init__(self, args: argparse.Namespace, rank: int, world_size: int) -> None:
        self.how: str | None = args.stall
        self.rank = rank
        self.step = args.stall_step
        self.step_seconds = args.step_seconds
        self.first_step_seconds = args.first_step_seconds
        self.mine = args.stall_rank in (rank, -1)
        self.marker = os.path.join(args.checkpoint_dir, f"stalled-{self.how}")
        # Every rank reads the marker before any of them can stall: all agree whether the
        # side group is needed, and every rank must take part in making it.
        self.done = os.path.exists(self.marker)
        self.side: dist.ProcessGroup | None = None
        if self.how == "side-collective" and not self.done and args.stall_rank < world_size:
            peer = (args.stall_rank + 1) % world_size
            self.side = dist.new_group(ranks=sorted({args.stall_rank, peer}))

    def before_step(self, step: int, first: bool) -> None:
        if self.how == "first-step":
            if first and self.mine:
                log(self.rank, f"warming up for {self.first_step_seconds:.0f} s")
                time.sleep(self.first_step_seconds)
            return
        if self.how is None or self.done or not self.mine or step != self.step:
            return
        with open(self.marker, "w") as f:
            f.write(f"rank {self.rank} step {step}\n")
        self.done = True
        if self.how == "outside":
            log(self.rank, f"reading the batch of step {step}")
            threading.Event().wait()  # a read that never returns
        elif self.how == "side-collective":
            log(self.rank, f"reducing the metrics of step {step}")
            assert self.side is not None
            dist.all_reduce(torch.ones(1), group=self.side)  # the peer never calls it
        elif self.how == "slow":
            log(self.rank, f"step {step} is slow")
            time.sleep(10 * self.step_seconds)


def load(path: str, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> int:
    if not os.path.exists(path):
        return 0
    ckpt = torch.load(path, map_location="cpu")
    model.load_state_dict(ckpt["MODEL_STATE"])
    optimizer.load_state_dict(ckpt["OPTIMIZER_STATE"])
    return int(ckpt["STEPS_RUN"])


def save(path: str, model: torch.nn.Module, optimizer: torch.optim.Optimizer, steps: int) -> None:
    ckpt = {
        "MODEL_STATE": model.state_dict(),
        "OPTIMIZER_STATE": optimizer.state_dict(),
        "STEPS_RUN": steps,
    }
    torch.save(ckpt, f"{path}.tmp")
    os.replace(f"{path}.tmp", path)


def main(args: argparse.Namespace) -> None:
    dist.init_process_group(backend="gloo")
    rank = int(os.environ["RANK"])
    world_size = int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ["LOCAL_RANK"])
    os.makedirs(args.checkpoint_dir, exist_ok=True)
    path = os.path.join(args.checkpoint_dir, "checkpoint.pt")

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(20, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    start = load(path, model, optimizer)
    if start:
        log(rank, f"Resuming training from checkpoint at step {start}")
    ddp = DDP(model)
    stall = Stall(args, rank, world_size)
    log(rank, f"local rank {local_rank} of world size {world_size}, from step {start + 1}")

    for step in range(start + 1, args.total_steps + 1):
        stall.before_step(step, first=step == start + 1)
        batch = torch.Generator().manual_seed(1000 * step + rank)  # this rank's shard
        source, targets = torch.rand(32, 20, generator=batch), torch.rand(32, 1, generator=batch)
        optimizer.zero_grad()
        loss = F.mse_loss(ddp(source), targets)
        loss.backward()  # type: ignore[no-untyped-call]
        optimizer.step()
        log(rank, f"step {step} loss {loss.item():.4f}")
        time.sleep(args.step_seconds)  # stands in for the step's real work
        if rank == 0 and step % args.save_every == 0:
            save(path, model, optimizer, step)
            log(rank, f"step {step} | checkpoint saved at {path}")
    log(rank, f"done at step {args.total_steps}")
    dist.destroy_process_group()


def cli() -> None:
    logging.basicConfig(stream=sys.stdout, level=logging.INFO, format="%(asctime)s %(message)s")
    parser = argparse.ArgumentParser(description="a DDP job where one rank stalls")
    parser.add_argument("total_steps", type=int, help="optimizer steps to train")
    parser.add_argument("save_every", type=int, help="checkpoint every this many steps")
    parser.add_argument("--checkpoint-dir", default="checkpoints", help="shared by every node")
    parser.add_argument("--step-seconds", default=0.5, type=float, help="sleep per step")
    parser.add_argument("--stall", choices=STALLS, default=None)
    parser.add_argument("--stall-rank", default=1, type=int, help="-1: every rank")
    parser.add_argument("--stall-step", default=13, type=int)
    parser.add_argument("--first-step-seconds", default=40.0, type=float)
    main(parser.parse_args())


if __name__ == "__main__":
    cli()
