"""One rank of tests/snapshot/test_snapshot_restore.py (RANK, WORLD_SIZE, MASTER_* from
the test; a node of its own: LOCAL_WORLD_SIZE=1, its own snapshot directory): FSDP2 with
uneven shards and AdamW, three steps with snapshots and the ring replica, a save as a loss
makes it, the last rank's files gone (a new node), then a fresh model restored in the same
world. Prints one JSON line: what it restored and what it checked."""

from __future__ import annotations

import json
import os
import sys
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from elastic_snapshot import Snapshots
from torch import nn
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor


def build() -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(7, 13), nn.Tanh(), nn.Linear(13, 5), nn.Tanh(), nn.Linear(5, 1))
    for layer in net:
        if isinstance(layer, nn.Linear):
            fully_shard(layer)
    fully_shard(net)
    return net, torch.optim.AdamW(net.parameters(), lr=0.1)


def local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if isinstance(t, DTensor) else t


def state(net: nn.Module, optim: torch.optim.Optimizer) -> list[torch.Tensor]:
    """This rank's parameters and optimizer state, copied, in a fixed order."""
    out = [local(p).detach().clone() for p in net.parameters()]
    for p in net.parameters():
        out += [local(v).clone() for _, v in sorted(optim.state[p].items())]
    return out


def main() -> None:
    directory = Path(sys.argv[1]) / f"node-{os.environ['RANK']}"
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    rank = dist.get_rank()
    net, optim = build()
    snap = Snapshots(net, optim, directory=directory, job="ranks", replicate_every=1)
    snap.restore()
    kept = {}
    for step in range(1, 4):
        optim.zero_grad()
        net(torch.ones(4, 7) * step).square().mean().backward()
        optim.step()
        snap.step_done(step)
        kept[step] = state(net, optim)
    saved = snap.save("test: a loss", timeout=10)
    if rank == dist.get_world_size() - 1:
        for file in saved:
            file.unlink()  # a new node: it holds nothing
    dist.barrier()
    fresh, fresh_optim = build()
    again = Snapshots(fresh, fresh_optim, directory=directory, job="ranks", replicate_every=0)
    restored = again.restore()
    now, then = state(fresh, fresh_optim), kept[restored.step]
    exact = len(now) == len(then) and all(map(torch.equal, now, then))
    # The optimizer keeps what it is given: its state must own its memory, not view a
    # snapshot file or a buffer the restore received into.
    moments = [local(v) for s in fresh_optim.state.values() for v in s.values() if v.dim() > 0]
    owned = all(m.untyped_storage().nbytes() == m.nbytes for m in moments)
    assert again.released is not None
    again.released.join(30)
    left = sorted(p.name for p in directory.rglob("*") if p.is_file())
    optim_step = int(local(next(iter(fresh_optim.state.values()))["step"]))
    fresh(torch.ones(4, 7)).square().mean().backward()
    fresh_optim.step()  # trains on from what it loaded
    print(
        json.dumps(
            {
                "rank": rank,
                "step": restored.step,
                "source": restored.source,
                "exact": exact,
                "owned": owned,
                "moments": len(moments),
                "optim_step": optim_step,
                "left": left,
            }
        ),
        flush=True,
    )
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
