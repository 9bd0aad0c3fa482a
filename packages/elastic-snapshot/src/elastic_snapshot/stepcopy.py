"""The state of the last `step_done`, copied to host memory, for a script whose step spans
several optimizer steps (an epoch).

Between two `step_done` calls of such a script the live state is the state of no step the
script marked: a loss then finds nothing consistent to save, and a save that waited for the
step's end would wait for the epoch's. So once a `step_done` closes more than one step of
an optimizer (snapshots.py), each rank that writes the state at a loss copies it at every
`step_done` into one host buffer (reused while the state's layout stays the same; pinned,
device-to-host, when the state is on a GPU), and a save writes that copy when the live
state is not consistent. A script that marks every optimizer step never copies.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from .state import Flat, Json, layout


@dataclass(frozen=True)
class Held:
    """A copy: the step and data position given to `step_done`, and the state as a Flat
    whose tensors view the copy's buffer."""

    step: int
    data_position: Json
    flat: Flat


class StepCopy:
    """One rank's copy of its part of the state (the whole replicated part and its rows of
    the sharded tensors), retaken at each `take`."""

    def __init__(self, world: int, rank: int) -> None:
        self.world, self.rank = world, rank
        self._lock = threading.Lock()  # a save reads the copy while no take overwrites it
        self._buffer: torch.Tensor | None = None
        self._held: Held | None = None
        self.copies = 0
        self.seconds = 0.0

    @property
    def nbytes(self) -> int:
        return 0 if self._buffer is None else self._buffer.numel()

    def take(self, step: int, data_position: Json, live: Flat) -> float:
        """Copy `live` (the state, consistent at `step`); returns the seconds it took."""
        started = time.monotonic()
        specs = list(live.specs)
        replicated, replicated_size = layout(specs, False, self.world, self.rank)
        sharded, sharded_size = layout(specs, True, self.world, self.rank)
        size = replicated_size + sharded_size
        on_gpu = any(t.is_cuda for t in live.tensors)
        with self._lock:
            self._held = None  # overwritten from here on: not a state until done
            if self._buffer is None or self._buffer.numel() != size:
                self._buffer = None  # the old one freed before the new one is taken
                self._buffer = torch.empty(size, dtype=torch.uint8, pin_memory=on_gpu)
            tensors = [torch.empty(0)] * len(specs)
            for base, slots in ((0, replicated), (replicated_size, sharded)):
                for slot in slots:
                    spec = specs[slot.index]
                    part = self._buffer[base + slot.offset : base + slot.offset + slot.nbytes]
                    view = part.view(spec.torch_dtype()).view(slot.shape)
                    view.copy_(live.tensors[slot.index], non_blocking=on_gpu)
                    tensors[slot.index] = view
            if on_gpu:
                torch.cuda.synchronize()
            # The script may change its data position's containers afterwards: a copy too.
            position = json.loads(json.dumps(data_position))
            self._held = Held(step, position, Flat(live.skeleton, specs, tensors))
        seconds = time.monotonic() - started
        self.copies += 1
        self.seconds += seconds
        return seconds

    @contextlib.contextmanager
    def held(self) -> Iterator[Held | None]:
        """The newest complete copy (None before the first), not retaken while in the body."""
        with self._lock:
            yield self._held
