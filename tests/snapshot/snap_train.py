"""The snapshot tests' training script: DDP, or FSDP2 (--fsdp), over gloo with Adam, a
fixed global batch per step split across the ranks, a DCP checkpoint every K steps, and
elastic_snapshot adopted as a user would. Every rank prints, flushed:

    [snap] start step=<s> source=<source> lost=<n|-> rank=<r> world=<w> digest=<d>
    [snap] step=<n> rank=<r> world=<w> digest=<d>

`digest` is a sum over this rank's parameters and optimizer state (its shards with
--fsdp), computed without a collective, so that a step line is printed exactly when this
rank completed that step: a restore that loaded step s exactly gives start digests whose
sum over the ranks is the sum of the step lines' digests of step s (with DDP every rank's
digest is the whole state's).

    torchrun ... snap_train.py --steps N [--fsdp] [--step-seconds S] [--checkpoint-dir D]
        [--checkpoint-every K] [--replicate-every R]
"""

from __future__ import annotations

import argparse
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


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--fsdp", action="store_true")
    parser.add_argument("--step-seconds", type=float, default=0.0)
    parser.add_argument("--checkpoint-dir", type=Path)
    parser.add_argument("--checkpoint-every", type=int, default=0)
    parser.add_argument("--replicate-every", type=int, default=1)
    args = parser.parse_args()

    dist.init_process_group("gloo", timeout=timedelta(seconds=30))
    rank, world = dist.get_rank(), dist.get_world_size()
    net = model()
    if args.fsdp:
        for layer in net:
            if isinstance(layer, nn.Linear):
                fully_shard(layer)
        fully_shard(net)
    else:
        net = DistributedDataParallel(net)
    optim = torch.optim.Adam(net.parameters(), lr=0.01)

    def load(step: int) -> int:
        msd, osd = get_state_dict(net, optim)
        path = str(args.checkpoint_dir / f"step-{step}")
        dcp.load({"model": msd, "optim": osd}, checkpoint_id=path)
        set_state_dict(net, optim, model_state_dict=msd, optim_state_dict=osd)
        return step * GLOBAL_BATCH

    snap = Snapshots(net, optim, replicate_every=args.replicate_every)
    start = snap.restore(latest(args.checkpoint_dir), load)
    lost = "-" if start.lost is None else start.lost
    print(
        f"[snap] start step={start.step} source={start.source} lost={lost} rank={rank} "
        f"world={world} digest={digest(net, optim)}",
        flush=True,
    )
    with snap:
        for step in range(start.step + 1, args.steps + 1):
            x, y = batch(step, rank, world)
            optim.zero_grad()
            nn.functional.mse_loss(net(x), y).backward()
            optim.step()
            snap.step_done(step, step * GLOBAL_BATCH)
            d = digest(net, optim)
            print(f"[snap] step={step} rank={rank} world={world} digest={d}", flush=True)
            if args.checkpoint_every and step % args.checkpoint_every == 0:
                save_checkpoint(args.checkpoint_dir, step, net, optim)
            time.sleep(args.step_seconds)
    print(f"[snap] done step={args.steps} stats={json.dumps(snap.stats())}", flush=True)


if __name__ == "__main__":
    main()
