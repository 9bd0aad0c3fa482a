"""A user's DDP script (gloo, CPU) whose end blocks in its teardown on one rank, as a
script does that a plain `torchrun` leaves hanging; it prints nothing of ours.

- Rank 1 leaves a non-daemon thread running (a metrics uploader never told to stop): at
  its end the interpreter waits for that thread before anything else, forever. Nothing
  destroys its process group.
- The other ranks end as a user's DDP script does: the last metric's all_reduce started
  (async_op, waited for by nobody: rank 1 joins it 2 s later), `destroy_process_group()`,
  return. Under `python -u` they end at once; in a warm child whose default group's last
  owner was DDP's Reducer they hung in ~ProcessGroupGloo (issue 24; warm/child.py).

Under `python -u` rank 1 never ends; the job must end anyway.

    torchrun ... teardown_blocks.py EPOCHS [--epoch-seconds S]
"""

from __future__ import annotations

import argparse
import os
import threading
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def uploader() -> None:
    while True:  # never told to stop
        time.sleep(1)


def main(epochs: int, epoch_seconds: float) -> None:
    dist.init_process_group(backend="gloo")
    rank = int(os.environ["RANK"])
    model = DDP(torch.nn.Linear(20, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    for epoch in range(epochs):
        for _ in range(4):
            optimizer.zero_grad()
            model(torch.rand(8, 20)).pow(2).mean().backward()
            optimizer.step()
        print(f"[GPU{rank}] Epoch {epoch}", flush=True)
        time.sleep(epoch_seconds)
    metric = torch.ones(1)
    if rank == 1:
        time.sleep(2)
        dist.all_reduce(metric)
        threading.Thread(target=uploader, name="uploader").start()
        print(f"[GPU{rank}] done", flush=True)
        return
    dist.all_reduce(metric, async_op=True)  # logged by nobody: still running at the return
    print(f"[GPU{rank}] done", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="a DDP job whose teardown blocks")
    parser.add_argument("epochs", type=int)
    parser.add_argument("--epoch-seconds", default=0.5, type=float)
    args = parser.parse_args()
    main(args.epochs, args.epoch_seconds)
