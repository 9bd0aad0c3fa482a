"""The ring replica: each rank's shard also in the memory of the next node.

For a sharded state (FSDP2) a lost node takes its shard with it. Every `every` steps, at
the step boundary, each rank copies its shard (model and optimizer rows, and the small
replicated part) into a host buffer, and a thread of ours sends it to the same local rank
on the next node (rank + LOCAL_WORLD_SIZE) while receiving the previous node's, over a
gloo group of their own, while the main thread trains on. A single lost node's shard is
then in its successor's memory; two adjacent nodes lost take a shard and its only replica.

Consistency: a rank keeps its two newest own copies and its predecessor's newest complete
replica (a replica being received is never used). The next copy waits until the previous
exchange is done, so when a node dies after step k, its successor holds its shard of step
k or k-1, and every survivor holds its own shard of both: the restore agrees on the newest
step all shards have (plan.py). The main thread waits for a copy only before the next
optimizer step changes what it copies, and for an exchange only when the next copy is due
and the previous exchange has not finished: both show in `stats`.

Memory per rank, beside the live state: two own copies and two replica buffers (one
complete, one being received): four times the rank's shard (model + optimizer) in host
memory. On GPUs the copies are device-to-host into pinned buffers on a side stream.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
import zlib
from dataclasses import dataclass, field
from datetime import timedelta

import torch
import torch.distributed as dist

from .state import Flat, Json, Spec, layout


@dataclass
class Copy:
    """One snapshot of a shard: the step, the shard payload (laid out as state.layout) and,
    for an own copy, the replicated part (skeleton, specs, the replicated tensors)."""

    step: int
    buffer: torch.Tensor
    world: int
    owner: int
    specs: tuple[Spec, ...]
    skeleton: Json = None
    data_position: Json = None
    replicated: list[torch.Tensor] = field(default_factory=list)


@dataclass
class RingStats:
    copies: int = 0
    exchanges: int = 0
    copy_seconds: float = 0.0  # the thread's copies (overlapping training)
    exchange_seconds: float = 0.0  # the thread's sends and receives (overlapping training)
    wait_seconds: float = 0.0  # the main thread waiting for a copy or an exchange
    bytes_sent: int = 0


def specs_hash(specs: tuple[Spec, ...]) -> int:
    text = repr([spec.to_json() for spec in specs]).encode()
    return zlib.crc32(text)


class Ring:
    def __init__(
        self, rank: int, world: int, local_world: int, every: int, timeout: timedelta
    ) -> None:
        self.rank, self.world, self.every = rank, world, every
        self.succ = (rank + local_world) % world
        self.pred = (rank - local_world) % world
        # A group of its own: the thread's sends never interleave with the main thread's
        # collectives. Every rank creates it (a collective call), in the same order.
        self.group = dist.new_group(backend="gloo", timeout=timeout)
        self.stats = RingStats()
        self._lock = threading.Lock()
        self._own: list[Copy] = []  # newest last, at most two
        self._replica: Copy | None = None
        self._spare: torch.Tensor | None = None  # the other replica buffer
        self._copied = threading.Event()
        self._copied.set()
        self._idle = threading.Event()
        self._idle.set()
        self._pending: tuple[int, Json, Flat, object] | None = None
        self._wake = threading.Condition()
        self._broken: str | None = None
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="elastic-snapshot-ring", daemon=True)
        self._thread.start()

    def due(self, step: int) -> bool:
        return self.every > 0 and step % self.every == 0 and self._broken is None

    def offer(self, step: int, data_position: Json, live: Flat) -> None:
        """Called by the main thread at a consistent step boundary: copy and send (in the
        thread). Waits first for the previous exchange (the replica lags one copy at most)."""
        started = time.monotonic()
        self._idle.wait()
        self.stats.wait_seconds += time.monotonic() - started
        if self._broken is not None:
            return
        event = None
        if any(t.is_cuda for t in live.tensors):
            event = torch.cuda.Event()  # type: ignore[no-untyped-call]
            event.record()
        self._idle.clear()
        self._copied.clear()
        with self._wake:
            self._pending = (step, data_position, live, event)
            self._wake.notify()

    def wait_copied(self) -> None:
        """Before an optimizer step changes the state being copied."""
        if self._copied.is_set():
            return
        started = time.monotonic()
        self._copied.wait()
        self.stats.wait_seconds += time.monotonic() - started

    def held(self) -> tuple[list[Copy], Copy | None]:
        """The complete own copies (oldest first) and the complete replica."""
        with self._lock:
            return list(self._own), self._replica

    def close(self) -> None:
        self._closed = True
        with self._wake:
            self._wake.notify()

    def _run(self) -> None:
        while True:
            with self._wake:
                self._wake.wait_for(lambda: self._pending is not None or self._closed)
                if self._closed:
                    return
                assert self._pending is not None
                step, data_position, live, event = self._pending
                self._pending = None
            try:
                copy = self._copy(step, data_position, live, event)
            except Exception as exc:  # noqa: BLE001 - said once, the ring stops
                self._stop(f"copy of step {step} failed: {exc}")
                return
            finally:
                self._copied.set()
            try:
                self._exchange(copy)
            except Exception as exc:  # noqa: BLE001 - a peer gone: said once, the ring stops
                self._stop(f"exchange of step {step} failed: {type(exc).__name__}: {exc}")
                return
            finally:
                self._idle.set()

    def _stop(self, why: str) -> None:
        self._broken = why
        self._copied.set()
        self._idle.set()
        print(f"[elastic-snapshot] ring replica stopped: {why}", file=sys.stderr, flush=True)

    def _copy(self, step: int, data_position: Json, live: Flat, event: object) -> Copy:
        started = time.monotonic()
        specs = tuple(live.specs)
        slots, size = layout(specs, True, self.world, self.rank)
        with self._lock:  # reuse the older own copy's buffer when there are two
            reuse = self._own.pop(0) if len(self._own) == 2 else None
        buffer = reuse.buffer if reuse is not None and reuse.buffer.numel() == size else None
        if buffer is None:
            pin = torch.cuda.is_available() and any(t.is_cuda for t in live.tensors)
            buffer = torch.empty(size, dtype=torch.uint8, pin_memory=pin)
        stream_ctx: contextlib.AbstractContextManager[object] = contextlib.nullcontext()
        stream = None
        if isinstance(event, torch.cuda.Event):
            stream = torch.cuda.Stream()  # type: ignore[no-untyped-call]
            stream.wait_event(event)
            stream_ctx = torch.cuda.stream(stream)
        with stream_ctx:
            for slot in slots:
                spec = specs[slot.index]
                target = buffer[slot.offset : slot.offset + slot.nbytes]
                target.view(spec.torch_dtype()).view(slot.shape).copy_(
                    live.tensors[slot.index], non_blocking=stream is not None
                )
            replicated = [
                t.detach().to("cpu", copy=True) if not spec.sharded else torch.empty(0)
                for t, spec in zip(live.tensors, specs, strict=True)
            ]
        if stream is not None:
            stream.synchronize()
        copy = Copy(
            step, buffer, self.world, self.rank, specs, live.skeleton, data_position, replicated
        )
        with self._lock:
            self._own.append(copy)
        self.stats.copies += 1
        self.stats.copy_seconds += time.monotonic() - started
        return copy

    def _exchange(self, copy: Copy) -> None:
        started = time.monotonic()
        mine = torch.tensor([copy.step, copy.buffer.numel(), specs_hash(copy.specs)])
        theirs = torch.empty(3, dtype=torch.int64)
        _wait(
            dist.isend(mine, self.succ, group=self.group),
            dist.irecv(theirs, self.pred, group=self.group),
        )
        step, size, their_specs = (int(v) for v in theirs.tolist())
        _slots, expected = layout(copy.specs, True, self.world, self.pred)
        stage = self._spare if self._spare is not None and self._spare.numel() == size else None
        if stage is None:
            stage = torch.empty(size, dtype=torch.uint8, pin_memory=copy.buffer.is_pinned())
        _wait(
            dist.isend(copy.buffer, self.succ, group=self.group),
            dist.irecv(stage, self.pred, group=self.group),
        )
        self.stats.exchanges += 1
        self.stats.bytes_sent += copy.buffer.numel()
        self.stats.exchange_seconds += time.monotonic() - started
        if their_specs != specs_hash(copy.specs) or size != expected:
            raise RuntimeError(
                f"rank {self.pred}'s shard of step {step} has another layout ({size} bytes, "
                f"expected {expected})"
            )
        replica = Copy(step, stage, self.world, self.pred, copy.specs)
        with self._lock:
            old, self._replica = self._replica, replica
        self._spare = old.buffer if old is not None else None


def _wait(*works: dist.Work | None) -> None:
    for work in works:
        if work is not None:
            work.wait()
