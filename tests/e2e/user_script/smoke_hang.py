import os, threading, time, sys
import torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("gloo")
rank = dist.get_rank()
model = DDP(torch.nn.Linear(8, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
path = "/checkpoints/ckpt.pt"
start = 0
if os.path.exists(path):
    start = torch.load(path)["step"]
for step in range(start, 60):
    if step == 15 and rank == 1 and not os.path.exists("/checkpoints/hung"):
        open("/checkpoints/hung", "w").close()
        print(f"rank {rank} hangs at step {step}", flush=True)
        threading.Event().wait()
    opt.zero_grad()
    model(torch.ones(4, 8)).sum().backward()
    opt.step()
    time.sleep(0.2)
    if rank == 0 and step % 5 == 0:
        torch.save({"step": step + 1}, path + ".tmp")
        os.replace(path + ".tmp", path)
        print(f"step {step}", flush=True)
dist.destroy_process_group()
