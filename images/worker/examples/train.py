"""Reference elastic training script: a small model, DDP, distributed checkpoints, resume.

Run under torchrun (one process per GPU, or per node on CPU):

    torchrun ... train.py --steps 100 --checkpoint-every 10 --step-seconds 0.5 \
        --checkpoint-dir /ckpt

Behaviour (docs/contracts.md, docs/recovery.md):
- gloo on CPU, nccl on GPU; the process group gets a bounded timeout
  (--pg-timeout, default 60 s, env TRAIN_PG_TIMEOUT) instead of the 30 min default,
  so a lost peer ends a collective, init_process_group or a checkpoint in bounded time.
- Checkpoints with torch.distributed.checkpoint into <dir>/step-<n>, written to a
  temporary directory first and renamed; the file <dir>/latest names the newest complete
  checkpoint and is replaced last, so a kill mid-save never loses the previous one.
- Every start resumes from the newest state: the memory of the survivors of the last round
  (elastic_snapshot: a node lost costs at most one step) or <dir>/latest, whichever is
  newer (any world size).
- A failed step (a peer gone: the collective raises) saves the state of the last step to
  this node's memory (/dev/shm) before the process exits; so does SIGTERM, from a thread,
  even while the main thread is blocked in a collective.
- SIGTERM: every rank finishes its current step, the ranks agree (a MAX all-reduce of a
  stop flag each step), all save a checkpoint, then the rank(s) that got SIGTERM print
  `[train] sigterm step=<n>` and exit 0; ranks that did not get it exit 75 (EX_TEMPFAIL:
  "a peer is leaving, re-form"), so their agents re-form the group without the leaver.

- The process ends with os._exit after its last collective (see `leave`): a teardown
  that blocks must not hold the pod, nor every agent in torch's exit barrier.

Exit codes: 0 done or stopped by SIGTERM; 75 stopped because a peer got SIGTERM;
2 bad arguments; anything else is a failure.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import sys
import time
import traceback
import uuid
import warnings
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from types import FrameType
from typing import NoReturn

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.nn.parallel import DistributedDataParallel

try:  # in the worker image; not in an image of the user's own (worker.entrypoint=injected)
    import numpy  # noqa: F401  # torch's object collectives, which the library's agreement uses
    from elastic_snapshot import Restored, Snapshots
except ImportError as exc:  # then the checkpoint alone, said once
    SNAPSHOTS_MISSING: str | None = str(exc)
    from typing import NamedTuple

    class Restored(NamedTuple):  # type: ignore[no-redef]  # the library's fields
        step: int
        data_position: object
        source: str
        lost: int | None
        seconds: float

else:
    SNAPSHOTS_MISSING = None

EXIT_PEER_LEAVING = 75
LATEST = "latest"
KEEP_CHECKPOINTS = 2

_stop_requested = False

# Saving from rank 0 alone (no_dist=True) is deliberate: DDP state is replicated.
warnings.filterwarnings("ignore", message="torch.distributed is disabled, unavailable")


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    global _stop_requested  # noqa: PLW0603 - set from a signal handler
    _stop_requested = True


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=100, help="total training steps")
    parser.add_argument("--checkpoint-every", type=int, default=10, help="steps per checkpoint")
    parser.add_argument("--step-seconds", type=float, default=0.0, help="sleep per step")
    parser.add_argument(
        "--checkpoint-dir",
        default=os.environ.get("CHECKPOINT_DIR"),
        help="shared checkpoint directory (default: $CHECKPOINT_DIR)",
    )
    parser.add_argument(
        "--snapshots",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="keep the newest state in memory so that a lost node costs at most one step "
        "(elastic_snapshot; --no-snapshots: resume from the checkpoint alone)",
    )
    parser.add_argument(
        "--pg-timeout",
        type=float,
        default=float(os.environ.get("TRAIN_PG_TIMEOUT", "60")),
        help="process-group timeout in seconds (default: $TRAIN_PG_TIMEOUT or 60)",
    )
    args = parser.parse_args(argv)
    if not args.checkpoint_dir:
        parser.error("--checkpoint-dir or CHECKPOINT_DIR is required")
    if args.steps < 1 or args.checkpoint_every < 1 or args.pg_timeout <= 0:
        parser.error("--steps, --checkpoint-every and --pg-timeout must be positive")
    return args


def say(message: str) -> None:
    if os.environ.get("LOCAL_RANK", "0") == "0":
        print(f"[train] {message}", flush=True)


class Progress:
    """The optional progress contract (docs/contracts.md, "Progress"): local rank 0 appends
    `step=<n>` to $ELASTIC_PROGRESS_FILE, which elastic-worker turns into its step metrics.
    Unset (metrics off, or not run by elastic-worker): nothing is written. A failed write
    costs the metrics, never the training."""

    def __init__(self) -> None:
        path = os.environ.get("ELASTIC_PROGRESS_FILE")
        self.file = None
        if path and os.environ.get("LOCAL_RANK", "0") == "0":
            try:
                self.file = open(path, "a", buffering=1)  # noqa: SIM115 - open for the run
            except OSError:
                self.file = None

    def step(self, step: int) -> None:
        if self.file is not None:
            try:
                self.file.write(f"step={step}\n")
            except OSError:
                self.file = None


def leave(code: int) -> NoReturn:
    """End the process with `code` now: no destroy_process_group, no interpreter teardown.

    Called after the last collective (the checkpoint barrier), so no peer waits on this
    rank, and the checkpoint is on disk. Twice in CI one rank that had printed `done` never
    exited, and a watchdog thread meant to bound destroy_process_group never spoke: the
    block held the GIL (a native destructor of the process group or the store) or came at
    interpreter exit (cf. pytorch/pytorch#75097). Every other agent then waited in torch's
    exit barrier (300 s). The kernel frees what those destructors would, sockets and GPU
    memory included. docs/recovery.md has the details."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def batch(step: int, rank: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(step * 1009 + rank)
    x = torch.randn(16, 32, generator=gen)
    y = x.sum(dim=1, keepdim=True) * 0.1
    return x.to(device), y.to(device)


def read_latest(root: Path) -> int | None:
    """The step of the newest complete checkpoint, or None.

    `latest` names it; if that file is missing or names an incomplete directory, the
    newest step-<n> holding DCP's .metadata (written last by dcp.save) is used.
    """
    try:
        step = int(json.loads((root / LATEST).read_text())["step"])
        if (root / f"step-{step}" / ".metadata").exists():
            return step
    except (FileNotFoundError, ValueError, KeyError, TypeError):
        pass
    complete = [
        int(p.name.split("-", 1)[1])
        for p in root.glob("step-*")
        if p.name.split("-", 1)[1].isdigit() and (p / ".metadata").exists()
    ]
    return max(complete, default=None)


def save_checkpoint(root: Path, step: int, model: nn.Module, optim: torch.optim.Optimizer) -> None:
    """Rank 0 saves (DDP state is replicated) to a temporary directory, renames it, then
    replaces `latest`; the other ranks wait at a barrier (bounded by the pg timeout)."""
    if dist.get_rank() == 0:
        tmp = root / f".step-{step}.tmp-{uuid.uuid4().hex[:8]}"
        model_sd, optim_sd = get_state_dict(model, optim)
        dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=str(tmp), no_dist=True)
        final = root / f"step-{step}"
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
        marker = root / f".{LATEST}.tmp"
        marker.write_text(json.dumps({"step": step}))
        os.replace(marker, root / LATEST)
        _prune(root, keep=step)
    dist.barrier()
    say(f"checkpoint step={step}")


def _prune(root: Path, keep: int) -> None:
    steps = sorted(
        int(p.name.split("-", 1)[1])
        for p in root.glob("step-*")
        if p.name.split("-", 1)[1].isdigit()
    )
    for old in [s for s in steps if s != keep][: max(0, len(steps) - KEEP_CHECKPOINTS)]:
        shutil.rmtree(root / f"step-{old}", ignore_errors=True)
    for tmp in root.glob(".step-*.tmp-*"):
        shutil.rmtree(tmp, ignore_errors=True)


def load_checkpoint(root: Path, step: int, model: nn.Module, optim: torch.optim.Optimizer) -> None:
    model_sd, optim_sd = get_state_dict(model, optim)
    # dcp.load fills the dicts in place.
    dcp.load(
        {"model": model_sd, "optim": optim_sd},
        checkpoint_id=str(root / f"step-{step}"),
        no_dist=True,
    )
    set_state_dict(model, optim, model_state_dict=model_sd, optim_state_dict=optim_sd)


class Checkpoints:
    """--no-snapshots: the newest checkpoint alone, with Snapshots.restore's signature."""

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def restore(self, latest: int | None, load: Callable[[int], None]) -> Restored:
        # Every rank must agree on the step (the file may change under us): rank 0's.
        found = torch.tensor(
            [-1 if latest is None else latest], dtype=torch.int64, device=self.device
        )
        dist.broadcast(found, src=0)
        step = int(found.item())
        if step < 0:
            return Restored(0, None, "none", None, 0.0)
        load(step)
        return Restored(step, None, "checkpoint", None, 0.0)


def _join(pg_timeout: float) -> tuple[torch.device, int]:
    """This process's device, and the process group joined (bounded timeout)."""
    use_cuda = torch.cuda.is_available()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if use_cuda:
        torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank) if use_cuda else torch.device("cpu")
    dist.init_process_group(
        backend="nccl" if use_cuda else "gloo", timeout=timedelta(seconds=pg_timeout)
    )
    return device, local_rank


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, _on_sigterm)
    root = Path(args.checkpoint_dir)
    root.mkdir(parents=True, exist_ok=True)

    device, local_rank = _join(args.pg_timeout)
    rank, world = dist.get_rank(), dist.get_world_size()
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))

    torch.manual_seed(0)
    model = DistributedDataParallel(
        Model().to(device), device_ids=[local_rank] if device.type == "cuda" else None
    )
    optim = torch.optim.SGD(model.parameters(), lr=0.01)

    # The newest state: the survivors' memory, or the checkpoint when it is newer. Rank 0's
    # view of `latest` counts (the file may change under us).
    if args.snapshots and SNAPSHOTS_MISSING is not None:
        print(f"[train] no snapshots ({SNAPSHOTS_MISSING}): the checkpoint alone", flush=True)
    use = args.snapshots and SNAPSHOTS_MISSING is None
    snap = Snapshots(model, optim, exit_on_signal=False) if use else None
    restored = (snap or Checkpoints(device)).restore(
        read_latest(root) if rank == 0 else None,
        lambda step: load_checkpoint(root, step, model, optim),
    )
    start = restored.step
    if restored.source != "none":
        say(f"resumed step={start}")
    if rank == 0:  # once per group: each start follows one completed rendezvous round
        say(f"start step={start} world_size={world} restart={restart}")

    step = start
    progress = Progress()
    stop = torch.zeros(1, device=device)
    # A step that fails (a peer gone), or SIGTERM, saves the last step's state.
    with snap or contextlib.nullcontext():
        while step < args.steps:
            x, y = batch(step + 1, rank, device)
            optim.zero_grad()
            loss = nn.functional.mse_loss(model(x), y)
            loss.backward()
            optim.step()
            step += 1
            if snap is not None:
                snap.step_done(step)
            say(f"step={step} world_size={world} restart={restart} loss={loss.item():.4f}")
            progress.step(step)
            if args.step_seconds > 0:
                time.sleep(args.step_seconds)
            stop.fill_(1.0 if _stop_requested else 0.0)
            dist.all_reduce(stop, op=dist.ReduceOp.MAX)
            if stop.item() > 0:
                if snap is not None:
                    snap.save("stopping: a rank got SIGTERM")
                save_checkpoint(root, step, model, optim)
                if _stop_requested:
                    say(f"sigterm step={step}")
                    return 0
                return EXIT_PEER_LEAVING
            if step % args.checkpoint_every == 0 and step < args.steps:
                save_checkpoint(root, step, model, optim)

    if restored.source != "checkpoint" or start < args.steps:
        save_checkpoint(root, step, model, optim)
    say(f"done step={step}")
    return 0


def run() -> NoReturn:
    """main(), then `leave` with its code; an exception is printed and leaves with 1, the
    code Python gives it, so a failing rank cannot hang in teardown either."""
    try:
        code = main()
    except Exception:  # noqa: BLE001 - printed, then the code Python would give
        traceback.print_exc()
        leave(1)
    leave(code)


if __name__ == "__main__":
    run()
