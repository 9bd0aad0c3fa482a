"""`Snapshots`: what a training script holds (see the package's docstring for the map)."""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from datetime import timedelta
from pathlib import Path
from types import TracebackType
from typing import Any, Protocol

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import get_model_state_dict
from torch.distributed.tensor import DTensor
from torch.utils.hooks import RemovableHandle

from . import report, store
from .gate import SignalWatch, StepGate
from .restore import Restored, restore
from .ring import Copy, Ring
from .state import Flat, Json, Spec, as_buffer, byte_view, flatten, layout, model_fingerprint
from .stepcopy import StepCopy

#: The restore agrees through torch's all_gather_object, which needs numpy (torch's own
#: dependency is optional). Checked when a script constructs Snapshots, not at import: an
#: image's build imports the library on bases without numpy.
NUMPY = (
    "elastic_snapshot.Snapshots needs numpy (torch's object collectives, which the restore "
    "agrees through, use it): pip install numpy in the training image"
)
DIR_ENV = "ELASTIC_SNAPSHOT_DIR"
DEFAULT_ROOT = "/dev/shm/elastic-snapshot"


class Stateful(Protocol):
    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state_dict: dict[str, Any]) -> Any: ...


class Snapshots:
    """The newest consistent state of `model` and `optimizers` (and `extra`), kept so that a
    loss costs at most one step. Construct it on every rank once the process group is up and
    the model is wrapped (DDP or fully_shard), then:

        start = snap.restore(latest_checkpoint_step, load_checkpoint)
        with snap:
            for step in range(start.step + 1, steps + 1):
                ...; optimizer.step()
                snap.step_done(step, data_position)

    A step may be one optimizer step or several (an epoch): from the first step_done that
    closes several steps of an optimizer, the state of each step_done is copied to host
    memory (stepcopy.py), so that a loss costs at most the step in progress either way.

    Options: `directory` (default $ELASTIC_SNAPSHOT_DIR or /dev/shm/elastic-snapshot: node-local
    memory), `name` (one job may train several models), `job` (default $ELASTIC_JOB_ID, else
    torchrun's run id), `replicate_every` (sharded state: steps between ring replicas; 1 loses at
    most one step; 0 keeps none), `exit_on_signal` (after saving on SIGTERM, exit 143 at once;
    False: the script stops itself, `stop_requested` tells it), `consistent_timeout` (seconds a
    save waits for an optimizer step in progress), `timeout` (of the library's gloo groups)."""

    def __init__(
        self,
        model: nn.Module,
        optimizers: torch.optim.Optimizer | Sequence[torch.optim.Optimizer],
        *,
        extra: Mapping[str, Stateful] | None = None,
        directory: str | os.PathLike[str] | None = None,
        name: str = "default",
        job: str | None = None,
        replicate_every: int = 1,
        exit_on_signal: bool = True,
        consistent_timeout: float = 2.0,
        timeout: timedelta = timedelta(seconds=60),
    ) -> None:
        try:  # here, not at import: see NUMPY
            import numpy  # noqa: F401, PLC0415
        except ImportError as exc:
            raise RuntimeError(NUMPY) from exc
        if not dist.is_initialized():
            raise RuntimeError(
                "elastic_snapshot.Snapshots: call torch.distributed.init_process_group first"
            )
        if isinstance(replicate_every, bool) or not isinstance(replicate_every, int):
            raise TypeError(f"replicate_every={replicate_every!r}: give a whole number of steps")
        if replicate_every < 0:
            raise ValueError(f"replicate_every={replicate_every}: give 0 (none) or more steps")
        if not name:
            raise ValueError("name: give a non-empty name for this training's snapshots")
        self.model = model
        self.optimizers = (
            [optimizers] if isinstance(optimizers, torch.optim.Optimizer) else list(optimizers)
        )
        self.extra = dict(extra or {})
        self.name = name
        self.job = (
            job
            or os.environ.get("ELASTIC_JOB_ID")
            or os.environ.get("TORCHELASTIC_RUN_ID", "local")
        )
        root = Path(directory or os.environ.get(DIR_ENV) or DEFAULT_ROOT)
        self.directory = store.directory(root, self.job, name)
        self.node = f"{os.environ.get('POD_NAME') or socket.gethostname()}:{root}"
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        self.local_world = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
        self.exit_on_signal = exit_on_signal
        self.consistent_timeout = consistent_timeout
        self.stop_requested = False
        self.restored: Restored | None = None

        model_state = get_model_state_dict(model)
        self.model_fingerprint = model_fingerprint(model_state)
        self.sharded = any(
            isinstance(v, DTensor) and any(p.is_shard() for p in v.placements)
            for v in model_state.values()
        )
        self.gate = StepGate()
        self._hooks: list[RemovableHandle] = []
        for optimizer in self.optimizers:
            self._hooks.append(optimizer.register_step_pre_hook(self._before_step))
            self._hooks.append(optimizer.register_step_post_hook(self._after_step))
        # Restores and replicas move host memory over gloo; with NCCL training, a gloo
        # group of its own (created by every rank, here, in the same order).
        backend = str(dist.get_backend())
        self.group = None if backend == "gloo" else dist.new_group(backend="gloo", timeout=timeout)
        self.ring: Ring | None = None
        if self.sharded and replicate_every > 0 and self.world > self.local_world:
            self.ring = Ring(self.rank, self.world, self.local_world, replicate_every, timeout)
        self._save_lock = threading.Lock()
        self._saved: set[str] = set()
        self.released: threading.Thread | None = None  # freeing the files restore used
        self._validated = False
        self._watch = SignalWatch(self._on_signal)
        self.step_done_seconds = 0.0
        # The ranks that write the state at a loss: one per node for a replicated state.
        self._writer = self.sharded or self.local_rank == 0
        #: The script's step spans several optimizer steps (an epoch): from the step_done
        #: that showed it on, the state of each step_done is copied (stepcopy.py).
        self.copying = False
        self.step_copy: StepCopy | None = None  # this rank's copy, when it writes one

    # -- the training loop's side ------------------------------------------------------

    def step_done(self, step: int, data_position: Json = None) -> None:
        """The optimizer step for `step` is done (steps count from 1; `step` steps done):
        the live state is consistent again. `data_position` (JSON: an int, a dict, ...) is
        what the script needs to go on reading data after `step` (one value for the job)."""
        started = time.monotonic()
        if not self._validated:
            self._validate(data_position)
        updates = self.gate.done(step, data_position)
        ring_copied = self.ring is not None and self.ring.due(step)
        if ring_copied:
            assert self.ring is not None
            self.ring.offer(step, data_position, self.live())
        if updates > 1 and not self.copying:
            self._copy_each_step(step, data_position, ring_copied=ring_copied)
            self._say_copying(step, updates, ring_copied)
        elif self.copying:
            self._take_copy(step, data_position, ring_copied=ring_copied)
        self.step_done_seconds += time.monotonic() - started

    def _copy_each_step(self, step: int, data_position: Json, *, ring_copied: bool) -> None:
        """From now on keep the state of each step_done in host memory (stepcopy.py),
        starting with `step`'s (the live state, consistent now). Called when a step_done
        closed several optimizer steps, and by the restore of a state that was kept so."""
        self.copying = True
        if self._writer and self.step_copy is None:
            self.step_copy = StepCopy(self.world, self.rank)
        self._take_copy(step, data_position, ring_copied=ring_copied)

    def _take_copy(self, step: int, data_position: Json, *, ring_copied: bool) -> None:
        # A step the ring replica copied is in its own copies already (a sharded state).
        if self.step_copy is not None and not ring_copied:
            self.step_copy.take(step, data_position, self.live())

    def _say_copying(self, step: int, updates: int, ring_copied: bool) -> None:
        copy = self.step_copy
        if copy is not None and copy.copies:
            cost = (
                f"{report.size(copy.nbytes)} of host memory, "
                f"{report.duration(copy.seconds)} per step_done"
            )
        else:  # a sharded state whose ring replica copies every step
            cost = "the ring replica's copies hold each step: nothing more"
        report.say(
            f"step {step} came after {updates} optimizer steps: from now on each step_done "
            f"keeps a copy of the state, so that a loss costs at most one of your steps "
            f'({cost}; packages/elastic-snapshot/README.md, "Adopting it")'
        )

    def __enter__(self) -> Snapshots:
        self._watch.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            if exc is not None and not isinstance(exc, GeneratorExit):
                # The main thread is here: no update is in progress but a failed one.
                self.save(f"{type(exc).__name__} in training", timeout=0.0)
            elif self._watch.received is not None:
                self.save("stopping after the signal", timeout=self.consistent_timeout)
        finally:
            self._watch.stop()

    def close(self) -> None:
        """Remove the optimizer hooks and stop the replica thread (the files stay)."""
        for hook in self._hooks:
            hook.remove()
        self._hooks.clear()
        if self.ring is not None:
            self.ring.close()
        self._watch.stop()

    def stats(self) -> dict[str, float]:
        """What keeping the state cost this process so far (seconds, bytes, counts)."""
        out: dict[str, float] = {"step_done_seconds": self.step_done_seconds}
        if self.step_copy is not None:
            out["step_copies"] = float(self.step_copy.copies)
            out["step_copy_seconds"] = self.step_copy.seconds
            out["step_copy_bytes"] = float(self.step_copy.nbytes)
        if self.ring is not None:
            for key, value in self.ring.stats.__dict__.items():
                out[f"ring_{key}"] = float(value)
        return out

    def restore(
        self,
        checkpoint_step: int | None = None,
        load_checkpoint: Callable[[int], Json] | None = None,
    ) -> Restored:
        """Load the newest state any rank of this round holds, or the checkpoint when it is
        newer: every rank calls it, before the first step. `checkpoint_step` is the step of the
        newest complete checkpoint (rank 0's is used) or None; `load_checkpoint(step)` loads it
        on every rank and may return its data position."""
        restored = restore(self, checkpoint_step, load_checkpoint)
        self.restored = restored
        return restored

    # -- saving ---------------------------------------------------------------------------

    def live(self) -> Flat:
        """The live state, flattened (its tensors are the live ones, not copies)."""
        state = {
            "model": get_model_state_dict(self.model),
            "optim": [optimizer.state_dict() for optimizer in self.optimizers],
            "extra": {key: obj.state_dict() for key, obj in self.extra.items()},
        }
        return flatten(state, self.world, self.rank)

    def save(self, reason: str, timeout: float | None = None) -> list[Path]:
        """Write what this rank holds to node-local memory: its live state when it is
        consistent (waiting up to `timeout` s, default `consistent_timeout`, for an optimizer
        step in progress), else the copy of the last step_done when the script's step spans
        several optimizer steps (at once: its live state is consistent only between a step's
        end and the next optimizer step), and, for a sharded state, its ring copies and
        replica. Returns the files written. Done for you on a failure and on SIGTERM; a
        script that stops on its own (`exit_on_signal=False`) may call it before it exits."""
        if timeout is None:
            timeout = self.consistent_timeout
        if self.copying:
            timeout = 0.0
        with self._save_lock:
            started = time.monotonic()
            written: list[Path] = []
            total = 0
            step = None
            with self.gate.frozen(timeout) as consistent:
                if consistent and self._writer:
                    step = self.gate.step
                    assert step is not None
                    flat = self.live()
                    total += self._write_flat(flat, step, self.gate.data_position, written)
            own, replica = self.ring.held() if self.ring is not None else ([], None)
            if not consistent and self.step_copy is not None:
                with self.step_copy.held() as held:
                    # A copy the ring's own copies do not hold already (a newer step).
                    if held is not None and all(c.step < held.step for c in own):
                        step = held.step
                        total += self._write_flat(held.flat, held.step, held.data_position, written)
            for copy in [*([replica] if replica else []), *own]:
                total += self._write_copy(copy, written)
            if not consistent and not self.copying:
                report.warn(
                    f"rank {self.rank}: not saving the live state ({reason}): an optimizer step "
                    "was in progress or none was done"
                )
            seconds = time.monotonic() - started
            if written:
                report.say(
                    f"saved step={step if step is not None else '-'} ({reason}): {len(written)} "
                    f"file(s), {total / 1e6:.1f} MB in {seconds:.2f} s to {self.directory}"
                )
            report.progress(report.saved_line(step, len(written), seconds))
            return written

    def _header(
        self,
        kind: str,
        step: int,
        *,
        world: int,
        owner: int,
        specs: Sequence[Spec],
        skeleton: Json,
        data_position: Json,
    ) -> store.Header:
        return store.Header(
            job=self.job,
            name=self.name,
            kind=kind,
            step=step,
            last_step=max(step, self.gate.step if self.gate.step is not None else step),
            world=world,
            owner=owner,
            node=self.node,
            model=self.model_fingerprint,
            specs=tuple(specs),
            skeleton=skeleton,
            data_position=data_position,
            copying=self.copying,
        )

    def _write_flat(self, flat: Flat, step: int, data_position: Json, written: list[Path]) -> int:
        header = self._header(
            store.OWN,
            step,
            world=self.world,
            owner=self.rank,
            specs=flat.specs,
            skeleton=flat.skeleton,
            data_position=data_position,
        )
        if header.file_name() in self._saved:
            return 0
        replicated = _pieces(flat.specs, flat.tensors, False, self.world, self.rank)
        shard = (
            _pieces(flat.specs, flat.tensors, True, self.world, self.rank)
            if flat.has_shards()
            else None
        )
        return self._write(header, replicated, shard, written)

    def _write_copy(self, copy: Copy, written: list[Path]) -> int:
        own = copy.owner == self.rank
        header = self._header(
            store.OWN if own else store.REPLICA,
            copy.step,
            world=copy.world,
            owner=copy.owner,
            specs=copy.specs,
            skeleton=copy.skeleton if own else None,
            data_position=copy.data_position if own else None,
        )
        if header.file_name() in self._saved:
            return 0
        replicated = (
            _pieces(copy.specs, copy.replicated, False, copy.world, copy.owner) if own else None
        )
        shard = [as_buffer(copy.buffer)]
        return self._write(header, replicated, shard, written)

    def _write(
        self,
        header: store.Header,
        replicated: Iterable[memoryview] | None,
        shard: Iterable[memoryview] | None,
        written: list[Path],
    ) -> int:
        try:
            path, size = store.write(self.directory, header, replicated, shard)
        except OSError as exc:
            report.warn(f"rank {self.rank}: could not save {header.file_name()}: {exc}")
            return 0
        self._saved.add(header.file_name())
        written.append(path)
        return size

    def _on_signal(self, signum: int) -> None:
        self.stop_requested = True
        try:
            self.save(f"signal {signum}", timeout=self.consistent_timeout)
        except Exception as exc:  # noqa: BLE001 - said; the exit below must still come
            report.warn(f"rank {self.rank}: saving on signal {signum} failed: {exc!r}")
        if self.exit_on_signal:
            os._exit(128 + signum)

    # -- hooks ----------------------------------------------------------------------------

    def _before_step(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        if self.ring is not None:
            self.ring.wait_copied()
        self.gate.before_update()

    def _after_step(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        self.gate.after_update(id(optimizer))

    def _validate(self, data_position: Json) -> None:
        try:
            json.dumps(data_position)
        except (TypeError, ValueError) as exc:
            raise TypeError(
                f"step_done(data_position={data_position!r}): give a JSON value (an int, a "
                f"string, a list or dict of them): {exc}"
            ) from None
        json.dumps(self.live().skeleton)  # a state the snapshot cannot hold fails here
        self._validated = True


def _pieces(
    specs: Sequence[Spec], tensors: Sequence[torch.Tensor], sharded: bool, world: int, rank: int
) -> Iterator[memoryview]:
    slots, _size = layout(specs, sharded, world, rank)
    for slot in slots:
        yield byte_view(tensors[slot.index])
