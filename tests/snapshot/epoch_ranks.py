"""One rank of tests/snapshot/test_snapshot_epochs.py (RANK, WORLD_SIZE, MASTER_* from the
test; a node of its own: LOCAL_WORLD_SIZE=1, its own snapshot directory): DDP over gloo with
AdamW, a script whose step is an epoch of UPDATES optimizer steps, `step_done(epoch, ...)`
once per epoch, as a user adopts the library in the README's few lines.

    epoch_ranks.py DIR fail [PARALLEL]
                                  PARALLEL: ddp (default), fsdp2 (FSDP2 without a ring
                                  replica: each rank copies its shard) or fsdp2-ring (the
                                  ring replica every step: its copies are the ones saved);
                                  three epochs, then a failure halfway through the fourth
                                  (an exception leaves `with snap:`, as a collective whose
                                  peer is gone raises); a fresh model restored; halfway
                                  through its next epoch a failure again; restored again.
                                  Prints one JSON line.
    epoch_ranks.py DIR train      epochs until stopped (SIGTERM), each optimizer step
                                  followed by SLEEP s of "work"; prints
                                  `[epoch] step=<n> digest=<d>` after each step_done
    epoch_ranks.py DIR restore    a fresh model restored; prints
                                  `[epoch] restored step=<n> source=<s> digest=<d>`
    epoch_ranks.py DIR per-step   a script that marks every optimizer step, with two
                                  optimizers (each steps once per step): prints one JSON line
"""

from __future__ import annotations

import json
import os
import sys
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from elastic_snapshot import Snapshots
from torch import nn
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor
from torch.nn.parallel import DistributedDataParallel

UPDATES = 4  # optimizer steps per epoch (fail)
TRAIN_UPDATES = 60  # per epoch (train): 3 s of an epoch, beyond consistent_timeout (2 s)
SLEEP = 0.05


def build(parallel: str = "ddp") -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    layers = nn.Sequential(nn.Linear(7, 13), nn.Tanh(), nn.Linear(13, 1))
    if parallel == "ddp":
        net: nn.Module = DistributedDataParallel(layers)
    else:
        for layer in layers:
            if isinstance(layer, nn.Linear):
                fully_shard(layer)
        net = fully_shard(layers)
    return net, torch.optim.AdamW(net.parameters(), lr=0.05)


def local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if isinstance(t, DTensor) else t


def update(net: nn.Module, optim: torch.optim.Optimizer, epoch: int, i: int) -> None:
    gen = torch.Generator().manual_seed(1000 * epoch + 10 * i + dist.get_rank())
    optim.zero_grad()
    net(torch.randn(4, 7, generator=gen)).square().mean().backward()
    optim.step()


def state(net: nn.Module, optim: torch.optim.Optimizer) -> list[torch.Tensor]:
    """This rank's parameters and optimizer state, copied, in a fixed order."""
    out = [local(p).detach().clone() for p in net.parameters()]
    for p in net.parameters():
        out += [local(v).clone() for _, v in sorted(optim.state[p].items())]
    return out


def digest(net: nn.Module, optim: torch.optim.Optimizer) -> str:
    total = sum(float(t.double().abs().sum()) for t in state(net, optim))
    return f"{total:.17e}"


def same(now: list[torch.Tensor], then: list[torch.Tensor] | None) -> bool:
    return then is not None and len(now) == len(then) and all(map(torch.equal, now, then))


def snapshots(
    directory: Path, net: nn.Module, optim: torch.optim.Optimizer, parallel: str = "ddp"
) -> Snapshots:
    every = 1 if parallel == "fsdp2-ring" else 0
    return Snapshots(net, optim, directory=directory, job="epochs", replicate_every=every)


def fail(directory: Path, parallel: str = "ddp") -> None:
    """A failure halfway through an epoch saves the state of the last step_done, exactly;
    the process restored from it keeps copying from its first step."""
    net, optim = build(parallel)
    snap = snapshots(directory, net, optim, parallel)
    snap.restore()
    kept = {}
    try:
        with snap:
            for epoch in range(1, 5):
                for i in range(UPDATES if epoch < 4 else UPDATES // 2):
                    update(net, optim, epoch, i)
                if epoch == 4:
                    raise RuntimeError("a peer is gone (the test's stand-in)")
                snap.step_done(epoch, {"epoch": epoch})
                kept[epoch] = state(net, optim)
    except RuntimeError:
        pass
    stats = snap.stats()
    snap.close()
    dist.barrier()
    again, again_optim = build(parallel)
    second = snapshots(directory, again, again_optim, parallel)
    restored = second.restore()
    exact = same(state(again, again_optim), kept.get(restored.step))
    # Halfway through the next epoch, before any step_done of this process: lost again.
    try:
        with second:
            for i in range(UPDATES // 2):
                update(again, again_optim, restored.step + 1, i)
            raise RuntimeError("a peer is gone again")
    except RuntimeError:
        pass
    second.close()
    dist.barrier()
    third, third_optim = build(parallel)
    last = snapshots(directory, third, third_optim, parallel)
    then = last.restore()
    # A restore offers the ring its new replica at once (sharded state): its exchange must
    # end before the process group does.
    last.close()
    print(
        json.dumps(
            {
                "rank": dist.get_rank(),
                "step": restored.step,
                "source": restored.source,
                "data_position": restored.data_position,
                "exact": exact,
                "copies": stats.get("step_copies", 0),
                "again": [then.step, then.source, then.data_position],
                "again_exact": same(state(third, third_optim), kept.get(then.step)),
            }
        ),
        flush=True,
    )


def train(directory: Path) -> None:
    net, optim = build()
    snap = snapshots(directory, net, optim)
    snap.restore()
    with snap:
        for epoch in range(1, 1000):
            for i in range(TRAIN_UPDATES):
                update(net, optim, epoch, i)
                time.sleep(SLEEP)
            snap.step_done(epoch, {"epoch": epoch})
            print(f"[epoch] step={epoch} digest={digest(net, optim)}", flush=True)


def restore(directory: Path) -> None:
    net, optim = build()
    restored = snapshots(directory, net, optim).restore()
    print(
        f"[epoch] restored step={restored.step} source={restored.source} "
        f"digest={digest(net, optim)}",
        flush=True,
    )


def per_step(directory: Path) -> None:
    """Two optimizers, each stepping once per step (a GAN's pattern): no copy is made."""
    torch.manual_seed(0)
    net = DistributedDataParallel(nn.Sequential(nn.Linear(7, 13), nn.Tanh(), nn.Linear(13, 1)))
    first, second = net.module[0], net.module[2]
    optims = [torch.optim.SGD(first.parameters(), lr=0.1), torch.optim.SGD(second.parameters())]
    snap = Snapshots(net, optims, directory=directory, job="per-step")
    snap.restore()
    with snap:
        for step in range(1, 6):
            for optim in optims:
                optim.zero_grad()
            net(torch.ones(4, 7) * step).square().mean().backward()
            for optim in optims:
                optim.step()
            snap.step_done(step, step)
    print(json.dumps({"stats": sorted(snap.stats())}), flush=True)


def main() -> None:
    directory = Path(sys.argv[1]) / f"node-{os.environ['RANK']}"
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    if sys.argv[2] == "fail":
        fail(directory, *sys.argv[3:])
    else:
        {"train": train, "restore": restore, "per-step": per_step}[sys.argv[2]](directory)
    dist.barrier()
    dist.destroy_process_group()
    # The results are printed: end as train.py does, without the interpreter's teardown,
    # where torch's gloo threads of the ring's own group can abort the process (-6,
    # "terminate called without an active exception") after everything above passed.
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
