"""multinode.py (pytorch/examples' DDP tutorial) adopting elastic-snapshot in the README's
few lines (marked `# elastic_snapshot`), with an epoch as its step: `step_done` once per
epoch, after the epoch's optimizer steps (512 samples in batches of 32 per rank: 6 steps
per epoch at three ranks, 8 at two). Its own checkpoint, every SAVE_EVERY epochs on the
shared path, is the fallback. `--batch-seconds` stands in for each batch's work.

Local rank 0 prints the reference script's optional `[train]` lines (docs/contracts.md),
so that the local run can time a fault by epoch and count what a re-form lost:

    [train] step=<epochs done> world_size=<w> digest=<d>      after each epoch's step_done
    [train] resumed step=<epochs done> source=<s> digest=<d>  after a restore (not the first start)
    [train] checkpoint step=<epochs done>                     global rank 0, its own checkpoint

`digest` sums the parameters' magnitudes (the same on every rank: DDP): a restore that loaded
epoch e exactly prints the digest of epoch e's step line.

    torchrun ... epoch_snapshots.py TOTAL_EPOCHS SAVE_EVERY [--batch_size N] \\
        [--checkpoint-path PATH] [--batch-seconds S]
"""

from __future__ import annotations

import argparse
import os
import time

import multinode
import torch
import torch.nn.functional as F
from elastic_snapshot import Snapshots
from torch.distributed import destroy_process_group, get_rank, get_world_size, init_process_group
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data.distributed import DistributedSampler


def say(line: str) -> None:
    if os.environ.get("LOCAL_RANK") == "0":
        print(f"[train] {line}", flush=True)


def digest(model: torch.nn.Module) -> str:
    return f"{sum(float(p.detach().double().abs().sum()) for p in model.parameters()):.17e}"


def checkpointed(path: str) -> int | None:
    """The epochs done in the checkpoint at `path`, or None."""
    if not os.path.exists(path):
        return None
    return int(torch.load(path, map_location="cpu")["EPOCHS_RUN"])


def main(args: argparse.Namespace) -> None:
    init_process_group(backend="gloo")
    dataset, net, optimizer = multinode.load_train_objs()
    data = multinode.prepare_dataloader(dataset, args.batch_size)
    model = DDP(net)

    def load(epochs: int) -> None:
        net.load_state_dict(torch.load(args.checkpoint_path, map_location="cpu")["MODEL_STATE"])

    snap = Snapshots(model, optimizer)  # elastic_snapshot
    start = snap.restore(checkpointed(args.checkpoint_path), load)  # elastic_snapshot
    if start.source != "none":
        say(f"resumed step={start.step} source={start.source} digest={digest(model)}")
    sampler = data.sampler
    assert isinstance(sampler, DistributedSampler)
    with snap:  # elastic_snapshot
        for epoch in range(start.step, args.total_epochs):
            sampler.set_epoch(epoch)
            for source, targets in data:
                optimizer.zero_grad()
                F.mse_loss(model(source), targets).backward()  # type: ignore[no-untyped-call]
                optimizer.step()
                time.sleep(args.batch_seconds)
            snap.step_done(epoch + 1)  # elastic_snapshot: the epochs done
            say(f"step={epoch + 1} world_size={get_world_size()} digest={digest(model)}")
            if get_rank() == 0 and (epoch + 1) % args.save_every == 0:
                tmp = f"{args.checkpoint_path}.tmp"
                torch.save({"MODEL_STATE": net.state_dict(), "EPOCHS_RUN": epoch + 1}, tmp)
                os.replace(tmp, args.checkpoint_path)
                say(f"checkpoint step={epoch + 1}")
    destroy_process_group()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="simple distributed training job")
    parser.add_argument("total_epochs", type=int, help="Total epochs to train the model")
    parser.add_argument("save_every", type=int, help="How often to save a checkpoint")
    parser.add_argument("--batch_size", default=32, type=int, help="Input batch size")
    parser.add_argument("--checkpoint-path", default="checkpoint.pt", help="Shared checkpoint")
    parser.add_argument("--batch-seconds", default=0.0, type=float, help="Sleep per batch")
    main(parser.parse_args())
