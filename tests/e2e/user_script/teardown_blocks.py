"""A user's DDP script (gloo, CPU) whose end blocks in its teardown on one rank, as a
script does that a plain `torchrun` leaves hanging; it prints nothing of ours.

- Nothing destroys the process group: its ProcessGroupGloo is left alive for the
  interpreter's exit (where it is freed, its worker threads joined).
- Rank 1 leaves a non-daemon thread running (a metrics uploader never told to stop): at
  its end the interpreter waits for that thread before anything else, forever.

The other ranks end at once. Under `python -u` rank 1 never ends; the job must end anyway.

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
    if rank == 1:
        threading.Thread(target=uploader, name="uploader").start()
    print(f"[GPU{rank}] done", flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="a DDP job whose teardown blocks")
    parser.add_argument("epochs", type=int)
    parser.add_argument("--epoch-seconds", default=0.5, type=float)
    args = parser.parse_args()
    main(args.epochs, args.epoch_seconds)
