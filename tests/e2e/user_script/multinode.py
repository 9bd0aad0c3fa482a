"""A user's own training script, in the style of pytorch/examples'
distributed/ddp-tutorial-series/multinode.py: DDP on CPU (gloo), a snapshot on a shared
path, resumed after every restart. It prints nothing of elastic-job's (no `[train]`
lines): the e2e scenario checks that the local run still gives a true summary.

Changes from the tutorial: gloo on CPU instead of NCCL on GPUs; the snapshot is written
by global rank 0 only, through a temporary file (the path is shared by every node);
`--epoch-seconds` stands in for an epoch's real work.

    torchrun ... multinode.py TOTAL_EPOCHS SAVE_EVERY [--batch_size N] \
        [--snapshot-path PATH] [--epoch-seconds S]
"""

from __future__ import annotations

import argparse
import os
import time

import torch
import torch.nn.functional as F
from torch.distributed import destroy_process_group, init_process_group
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler


class MyTrainDataset(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    def __init__(self, size: int) -> None:
        self.size = size
        self.data = [(torch.rand(20), torch.rand(1)) for _ in range(size)]

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.data[index]


def ddp_setup() -> None:
    init_process_group(backend="gloo")


class Trainer:
    def __init__(
        self,
        model: torch.nn.Module,
        train_data: DataLoader[tuple[torch.Tensor, torch.Tensor]],
        optimizer: torch.optim.Optimizer,
        save_every: int,
        snapshot_path: str,
        *,
        epoch_seconds: float,
    ) -> None:
        self.local_rank = int(os.environ["LOCAL_RANK"])
        self.global_rank = int(os.environ["RANK"])
        self.model = model
        self.train_data = train_data
        self.optimizer = optimizer
        self.save_every = save_every
        self.epochs_run = 0
        self.snapshot_path = snapshot_path
        self.epoch_seconds = epoch_seconds
        if os.path.exists(snapshot_path):
            print("Loading snapshot")
            self._load_snapshot(snapshot_path)
        self.model = DDP(self.model)

    def _load_snapshot(self, snapshot_path: str) -> None:
        snapshot = torch.load(snapshot_path, map_location="cpu")
        self.model.load_state_dict(snapshot["MODEL_STATE"])
        self.epochs_run = snapshot["EPOCHS_RUN"]
        print(f"Resuming training from snapshot at Epoch {self.epochs_run}")

    def _run_batch(self, source: torch.Tensor, targets: torch.Tensor) -> None:
        self.optimizer.zero_grad()
        output = self.model(source)
        loss = F.mse_loss(output, targets)
        loss.backward()  # type: ignore[no-untyped-call]
        self.optimizer.step()

    def _run_epoch(self, epoch: int) -> None:
        b_sz = len(next(iter(self.train_data))[0])
        print(
            f"[GPU{self.global_rank}] Epoch {epoch} | Batchsize: {b_sz} | "
            f"Steps: {len(self.train_data)}",
            flush=True,
        )
        assert isinstance(self.train_data.sampler, DistributedSampler)
        self.train_data.sampler.set_epoch(epoch)
        for source, targets in self.train_data:
            self._run_batch(source, targets)
        time.sleep(self.epoch_seconds)

    def _save_snapshot(self, epoch: int) -> None:
        assert isinstance(self.model, DDP)
        snapshot = {"MODEL_STATE": self.model.module.state_dict(), "EPOCHS_RUN": epoch + 1}
        tmp = f"{self.snapshot_path}.tmp"
        torch.save(snapshot, tmp)
        os.replace(tmp, self.snapshot_path)
        print(f"Epoch {epoch} | Training snapshot saved at {self.snapshot_path}", flush=True)

    def train(self, max_epochs: int) -> None:
        for epoch in range(self.epochs_run, max_epochs):
            self._run_epoch(epoch)
            if self.global_rank == 0 and epoch % self.save_every == 0:
                self._save_snapshot(epoch)


def load_train_objs() -> tuple[
    Dataset[tuple[torch.Tensor, torch.Tensor]], torch.nn.Module, torch.optim.Optimizer
]:
    train_set = MyTrainDataset(512)
    model = torch.nn.Linear(20, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    return train_set, model, optimizer


def prepare_dataloader(
    dataset: Dataset[tuple[torch.Tensor, torch.Tensor]], batch_size: int
) -> DataLoader[tuple[torch.Tensor, torch.Tensor]]:
    return DataLoader(
        dataset, batch_size=batch_size, shuffle=False, sampler=DistributedSampler(dataset)
    )


def main(
    save_every: int, total_epochs: int, batch_size: int, snapshot_path: str, epoch_seconds: float
) -> None:
    ddp_setup()
    dataset, model, optimizer = load_train_objs()
    train_data = prepare_dataloader(dataset, batch_size)
    trainer = Trainer(
        model, train_data, optimizer, save_every, snapshot_path, epoch_seconds=epoch_seconds
    )
    trainer.train(total_epochs)
    destroy_process_group()


def cli() -> None:
    parser = argparse.ArgumentParser(description="simple distributed training job")
    parser.add_argument("total_epochs", type=int, help="Total epochs to train the model")
    parser.add_argument("save_every", type=int, help="How often to save a snapshot")
    parser.add_argument("--batch_size", default=32, type=int, help="Input batch size")
    parser.add_argument("--snapshot-path", default="snapshot.pt", help="Shared snapshot file")
    parser.add_argument("--epoch-seconds", default=0.0, type=float, help="Sleep per epoch")
    args = parser.parse_args()
    main(
        args.save_every, args.total_epochs, args.batch_size, args.snapshot_path, args.epoch_seconds
    )


if __name__ == "__main__":
    cli()
