"""A rank of a real gloo job for tests/worker/recovery/test_hangs.py: the probe installed
as a warm child installs it (rankprobe.install), SGD steps with an all_reduce each, then
at HANG_AT the rank HANG_RANK hangs as HANG_HOW says while the others go on into their
next all_reduce and wait there:

- `outside`: blocks forever outside any collective (threading.Event().wait());
- `side`: blocks in an all_reduce on a group every rank created that nobody else enters;
- `io`: keeps writing to a file (a long checkpoint: it moves, it is not hung).
"""

from __future__ import annotations

import os
import sys
import threading

import torch
import torch.distributed as dist
from elastic_worker import rankprobe

rankprobe.install(os.environ)
dist.init_process_group("gloo")
rank = dist.get_rank()
side = dist.new_group(list(range(dist.get_world_size())))
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
hang_at, hang_rank, how = (
    int(os.environ["HANG_AT"]),
    int(os.environ["HANG_RANK"]),
    os.environ["HANG_HOW"],
)
for step in range(10**9):
    if step == hang_at and rank == hang_rank:
        print(f"rank {rank} hangs ({how})", flush=True)
        if how == "outside":
            threading.Event().wait()
        elif how == "side":
            dist.all_reduce(torch.ones(1), group=side)
        else:
            with open(os.environ["HANG_FILE"], "wb") as f:
                while True:
                    f.write(b"x" * (1 << 20))
                    f.flush()
                    os.fsync(f.fileno())
    opt.zero_grad()
    loss = model(torch.ones(1, 4)).sum()
    loss.backward()
    for p in model.parameters():
        dist.all_reduce(p.grad)
    opt.step()
sys.exit(0)
