"""A user's own training script that adopts elastic_snapshot in a few lines (the lines
marked `# elastic_snapshot`): DDP, or FSDP2 (--fsdp), over gloo with Adam, a fixed global
batch per step split across the ranks, its own DCP checkpoint every K steps. It prints
nothing of elastic-job's. Used by tests/snapshot, the e2e scenarios (mounted into the pods
at /opt/user-script) and benches/snapshots. Every rank prints, flushed:

    [snap] start step=<s> source=<source> lost=<n|-> rank=<r> world=<w> digest=<d>
    [snap] step=<n> rank=<r> world=<w> digest=<d>

`digest` is a sum over this rank's parameters and optimizer state (its shards with
--fsdp), computed without a collective, so that a step line is printed exactly when this
rank completed that step: a restore that loaded step s exactly gives start digests whose
sum over the ranks is the sum of the step lines' digests of step s (with DDP every rank's
digest is the whole state's).

    [snap] done step=<n> rank=<r> step_seconds=<median> stats=<the library's costs, JSON>

    torchrun ... snap_train.py --steps N [--fsdp] [--step-seconds S] [--checkpoint-dir D]
        [--checkpoint-every K] [--replicate-every R] [--no-snapshots]

--no-snapshots: the same script resuming from its checkpoint alone (the baseline).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from elastic_snapshot import Snapshots
from torch import nn
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor
from torch.nn.parallel import DistributedDataParallel

GLOBAL_BATCH = 12  # divides among 1, 2, 3, 4 and 6 ranks


def model() -> nn.Module:
    torch.manual_seed(0)
    # Odd sizes: FSDP2's shards are uneven, some ranks hold fewer rows than others.
    return nn.Sequential(nn.Linear(7, 13), nn.Tanh(), nn.Linear(13, 5), nn.Tanh(), nn.Linear(5, 1))


def batch(step: int, rank: int, world: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(step)
    x = torch.randn(GLOBAL_BATCH, 7, generator=gen)
    y = x.sum(dim=1, keepdim=True).sin()
    per = GLOBAL_BATCH // world
    return x[rank * per : (rank + 1) * per], y[rank * per : (rank + 1) * per]


def digest(net: nn.Module, optim: torch.optim.Optimizer) -> str:
    tensors = list(net.parameters())
    for state in optim.state.values():
        tensors += [v for v in state.values() if isinstance(v, torch.Tensor) and v.dim() > 0]
    total = torch.zeros(1, dtype=torch.float64)
    for t in tensors:
        local = t.to_local() if isinstance(t, DTensor) else t
        total += local.detach().double().abs().sum()
    return f"{total.item():.17e}"


def latest(root: Path | None) -> int | None:
    if root is None or not (root / "latest").exists():
        return None
    return int(json.loads((root / "latest").read_text())["step"])


def save_checkpoint(root: Path, step: int, net: nn.Module, optim: torch.optim.Optimizer) -> None:
    msd, osd = get_state_dict(net, optim)
    dcp.save({"model": msd, "optim": osd}, checkpoint_id=str(root / f"step-{step}"))
    dist.barrier()
    if dist.get_rank() == 0:
        (root / ".latest").write_text(json.dumps({"step": step}))
        os.replace(root / ".latest", root / "latest")
        for old in root.glob("step-*"):
            if old.name != f"step-{step}":
                shutil.rmtree(old, ignore_errors=True)


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--fsdp", action="store_true")
    parser.add_argument("--step-seconds", type=float, default=0.0)
    parser.add_argument(
        "--checkpoint-dir",
        type=Path,
        default=os.environ.get("CHECKPOINT_DIR"),
        help="shared checkpoint directory (default: $CHECKPOINT_DIR)",
    )
    parser.add_argument("--checkpoint-every", type=int, default=0)
    parser.add_argument("--replicate-every", type=int, default=1)
    parser.add_argument("--snapshots", action=argparse.BooleanOptionalAction, default=True)
    return parser.parse_args()


def wrapped(fsdp: bool) -> nn.Module:
    net = model()
    if fsdp:
        for layer in net:
            if isinstance(layer, nn.Linear):
                fully_shard(layer)
        fully_shard(net)
        return net
    return DistributedDataParallel(net)


def main() -> None:
    args = parse()
    dist.init_process_group("gloo", timeout=timedelta(seconds=30))
    rank, world = dist.get_rank(), dist.get_world_size()
    net = wrapped(args.fsdp)
    optim = torch.optim.Adam(net.parameters(), lr=0.01)

    def load(step: int) -> int:
        msd, osd = get_state_dict(net, optim)
        path = str(args.checkpoint_dir / f"step-{step}")
        dcp.load({"model": msd, "optim": osd}, checkpoint_id=path)
        set_state_dict(net, optim, model_state_dict=msd, optim_state_dict=osd)
        return step * GLOBAL_BATCH

    if args.snapshots:
        snap = Snapshots(net, optim, replicate_every=args.replicate_every)  # elastic_snapshot
        start = snap.restore(latest(args.checkpoint_dir), load)  # elastic_snapshot
        first, source, lost = start.step, start.source, "-" if start.lost is None else start.lost
    else:
        ckpt = torch.tensor([latest(args.checkpoint_dir) or 0])
        dist.broadcast(ckpt, src=0)  # rank 0's view of `latest`
        first, source, lost = int(ckpt.item()), "checkpoint" if ckpt.item() else "none", "-"
        if first:
            load(first)
    print(
        f"[snap] start step={first} source={source} lost={lost} rank={rank} "
        f"world={world} digest={digest(net, optim)}",
        flush=True,
    )
    took: list[float] = []
    with snap if args.snapshots else contextlib.nullcontext():  # elastic_snapshot
        for step in range(first + 1, args.steps + 1):
            began = time.perf_counter()
            x, y = batch(step, rank, world)
            optim.zero_grad()
            nn.functional.mse_loss(net(x), y).backward()
            optim.step()
            if args.snapshots:
                snap.step_done(step, step * GLOBAL_BATCH)  # elastic_snapshot
            took.append(time.perf_counter() - began)
            d = digest(net, optim)
            print(f"[snap] step={step} rank={rank} world={world} digest={d}", flush=True)
            if args.checkpoint_every and step % args.checkpoint_every == 0:
                save_checkpoint(args.checkpoint_dir, step, net, optim)
            time.sleep(args.step_seconds)
    stats = json.dumps(snap.stats() if args.snapshots else {}, separators=(",", ":"))
    median = sorted(took)[len(took) // 2] if took else 0.0
    print(
        f"[snap] done step={args.steps} rank={rank} step_seconds={median:.6f} stats={stats}",
        flush=True,
    )


if __name__ == "__main__":
    main()
