"""A model of 100M+ parameters (an MLP of `depth` square layers) trained for a few steps
under torchrun, with or without elastic-snapshot: rank 0 prints one JSON line, the median
seconds of a whole step (forward, backward, optimizer, step_done: a wait for the ring's
copy or exchange shows in the step) and the library's costs (Snapshots.stats).

    torchrun --nnodes=3 --nproc-per-node=1 ... -m benches.snapshots.bigmodel \\
        --parallel fsdp2 --replicate-every 1 [--no-snapshots] --width 3584 --depth 8
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from datetime import timedelta

import torch
import torch.distributed as dist
from elastic_snapshot import Snapshots
from torch import nn
from torch.distributed.fsdp import fully_shard
from torch.nn.parallel import DistributedDataParallel

WARMUP = 2  # steps left out: the first allocates the optimizer state and the buffers


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--parallel", choices=("ddp", "fsdp2"), required=True)
    parser.add_argument("--snapshots", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--replicate-every", type=int, default=1)
    parser.add_argument("--width", type=int, default=3584)
    parser.add_argument("--depth", type=int, default=8)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--steps", type=int, default=8)
    args = parser.parse_args()
    dist.init_process_group("gloo", timeout=timedelta(seconds=600))
    torch.manual_seed(0)
    net = nn.Sequential(
        *[nn.Sequential(nn.Linear(args.width, args.width), nn.ReLU()) for _ in range(args.depth)]
    )
    params = sum(p.numel() for p in net.parameters())
    if args.parallel == "fsdp2":
        for layer in net:
            fully_shard(layer)
        fully_shard(net)
        model: nn.Module = net
    else:
        model = DistributedDataParallel(net)
    optim = torch.optim.AdamW(model.parameters(), lr=1e-4)
    snap = None
    if args.snapshots:
        snap = Snapshots(model, optim, replicate_every=args.replicate_every)
        snap.restore()
    took = []
    for step in range(1, args.steps + 1):
        began = time.perf_counter()
        optim.zero_grad()
        model(torch.randn(args.batch, args.width)).square().mean().backward()
        optim.step()
        if snap is not None:
            snap.step_done(step)
        took.append(time.perf_counter() - began)
    if dist.get_rank() == 0:
        line = {
            "params": params,
            "parallel": args.parallel,
            "snapshots": args.snapshots,
            "replicate_every": args.replicate_every if args.snapshots else 0,
            "world": dist.get_world_size(),
            "step_seconds": round(statistics.median(took[WARMUP:]), 4),
            "stats": snap.stats() if snap is not None else {},
            "load_average": round(os.getloadavg()[0], 1),
        }
        print(f"BIGMODEL {json.dumps(line)}", flush=True)
    dist.barrier()
    os._exit(0)  # no teardown: nothing of it is measured


if __name__ == "__main__":
    main()
