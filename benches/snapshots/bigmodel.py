"""A model of 100M+ parameters (an MLP of `depth` square layers) trained for a few steps
under torchrun, with or without elastic-snapshot: rank 0 prints one JSON line, the median
seconds of a whole step (forward, backward, optimizer, step_done: a wait for the ring's
copy or exchange shows in the step) and the library's costs (Snapshots.stats).

With --updates-per-step N > 1 a step is N optimizer steps, as a script whose step is an
epoch has it: the library then copies the state at each step_done (its cost in the stats).

With --restore, then: every rank saves its snapshot to memory as a loss would make it,
the last rank's node forgets its own (a new node), and a fresh model and optimizer are
restored from memory (the agreement, the holder's broadcast or the shards, the load), then
from a torch.distributed.checkpoint of the same step on disk (--checkpoint-dir): the seconds
of each, the restore a loss costs beside the checkpoint load it replaces.

    torchrun --nnodes=3 --nproc-per-node=1 ... -m benches.snapshots.bigmodel \\
        --parallel fsdp2 --replicate-every 1 [--no-snapshots] --width 3584 --depth 8 \\
        [--updates-per-step N]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from elastic_snapshot import Snapshots
from torch import nn
from torch.distributed.fsdp import fully_shard
from torch.nn.parallel import DistributedDataParallel

WARMUP = 2  # steps left out: the first allocates the optimizer state and the buffers


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--parallel", choices=("ddp", "fsdp2"), required=True)
    parser.add_argument("--snapshots", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--replicate-every", type=int, default=1)
    parser.add_argument("--width", type=int, default=3584)
    parser.add_argument("--depth", type=int, default=8)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--updates-per-step", type=int, default=1)
    parser.add_argument("--restore", action="store_true")
    parser.add_argument("--checkpoint-dir", default=os.environ.get("CHECKPOINT_DIR", "/tmp"))
    args = parser.parse_args()
    dist.init_process_group("gloo", timeout=timedelta(seconds=600))
    model, optim = build(args)
    params = args.depth * (args.width * args.width + args.width)
    snap = None
    if args.snapshots:
        snap = Snapshots(model, optim, replicate_every=args.replicate_every)
        snap.restore()
    took = []
    for step in range(1, args.steps + 1):
        began = time.perf_counter()
        for _ in range(args.updates_per_step):
            optim.zero_grad()
            model(torch.randn(args.batch, args.width)).square().mean().backward()
            optim.step()
        if snap is not None:
            snap.step_done(step)
        took.append(time.perf_counter() - began)
    restore: dict[str, Any] = {}
    if args.restore and snap is not None:
        restore = restore_seconds(args, model, optim, snap)
    if dist.get_rank() == 0:
        line = {
            **restore,
            "params": params,
            "parallel": args.parallel,
            "snapshots": args.snapshots,
            "replicate_every": args.replicate_every if args.snapshots else 0,
            "updates_per_step": args.updates_per_step,
            "world": dist.get_world_size(),
            "step_seconds": round(statistics.median(took[WARMUP:]), 4),
            "stats": snap.stats() if snap is not None else {},
            "load_average": round(os.getloadavg()[0], 1),
        }
        print(f"BIGMODEL {json.dumps(line)}", flush=True)
    dist.barrier()
    os._exit(0)  # no teardown: nothing of it is measured


def build(args: argparse.Namespace) -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(1)
    net = nn.Sequential(
        *[nn.Sequential(nn.Linear(args.width, args.width), nn.ReLU()) for _ in range(args.depth)]
    )
    if args.parallel == "fsdp2":
        for layer in net:
            fully_shard(layer)
        fully_shard(net)
        return net, torch.optim.AdamW(net.parameters(), lr=1e-4)
    model = DistributedDataParallel(net)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-4)


def restore_seconds(
    args: argparse.Namespace, model: nn.Module, optim: torch.optim.Optimizer, snap: Snapshots
) -> dict[str, Any]:
    """Seconds to restore this state from memory and from a DCP checkpoint, fresh objects."""
    from torch.distributed.checkpoint.state_dict import (  # noqa: PLC0415
        get_state_dict,
        set_state_dict,
    )
    from torch.distributed.checkpoint.state_dict_loader import load  # noqa: PLC0415
    from torch.distributed.checkpoint.state_dict_saver import save  # noqa: PLC0415

    path = f"{args.checkpoint_dir}/bigmodel-{os.environ.get('TORCHELASTIC_RUN_ID', 'x')}"
    msd, osd = get_state_dict(model, optim)
    save({"model": msd, "optim": osd}, checkpoint_id=path)
    began = time.perf_counter()
    saved = snap.save("bench: a loss", timeout=10)
    save_s = time.perf_counter() - began
    if dist.get_rank() == dist.get_world_size() - 1:
        for file in saved:
            file.unlink()  # a new node: it holds nothing
    dist.barrier()
    fresh, fresh_optim = build(args)
    again = Snapshots(fresh, fresh_optim, replicate_every=0)
    dist.barrier()
    began = time.perf_counter()
    restored = again.restore()
    memory_s = time.perf_counter() - began
    if again.released is not None:  # the files' memory, freed in a thread: not in the way
        again.released.join()  # of the checkpoint load timed next
    release_s = time.perf_counter() - began - memory_s
    other, other_optim = build(args)
    dist.barrier()
    began = time.perf_counter()
    msd, osd = get_state_dict(other, other_optim)
    load({"model": msd, "optim": osd}, checkpoint_id=path)
    set_state_dict(other, other_optim, model_state_dict=msd, optim_state_dict=osd)
    dist.barrier()
    checkpoint_s = time.perf_counter() - began
    return {
        "save_to_memory_s": round(save_s, 3),
        "restore_from_memory_s": round(memory_s, 3),
        "restored_source": restored.source,
        "release_after_restore_s": round(release_s, 3),
        "load_checkpoint_s": round(checkpoint_s, 3),
    }


if __name__ == "__main__":
    main()
