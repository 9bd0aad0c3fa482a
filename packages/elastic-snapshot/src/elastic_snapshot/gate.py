"""When the live state is consistent, and who is woken when the process is told to stop.

`StepGate`: the optimizers' step pre-hooks enter an update, their post-hooks mark the state
advanced, and `done(step)` makes it consistent again at `step` and says how many updates
the interval it closes held (one per step for a script that marks every optimizer step;
more when its step is an epoch: snapshots.py then keeps copies). A saver freezes the gate
(waiting, bounded, for a consistent state): an update that starts meanwhile waits until
the saver has read the state. Forward and backward never change what is kept (parameters,
optimizer state), except buffers a forward updates (BatchNorm's running statistics), which
may be one forward ahead of the step saved.

`SignalWatch`: torchrun stops a worker with SIGTERM (then SIGKILL once its shutdown timeout
has passed). Python runs a signal handler only in the main thread between bytecodes, and a
main thread blocked in a collective whose peer is gone runs none. The C-level handler also
writes the signal's number to the wakeup fd (signal.set_wakeup_fd), and a thread of ours
that reads it wakes at once, whatever the main thread is doing.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any

Json = Any
Handler = Callable[[int, FrameType | None], Any] | int | signal.Handlers | None


class StepGate:
    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._updating = False  # inside an optimizer's step()
        self._dirty = False  # stepped since the last done()
        self._frozen = 0
        self._updates: dict[int, int] = {}  # optimizer -> its updates since the last done()
        self._ignoring = threading.local()
        self.step: int | None = None  # the step the live state is consistent at
        self.data_position: Json = None

    def before_update(self) -> None:
        if getattr(self._ignoring, "on", False):
            return
        with self._cond:
            self._cond.wait_for(lambda: self._frozen == 0)
            self._updating = True

    def after_update(self, optimizer: int = 0) -> None:
        if getattr(self._ignoring, "on", False):
            return
        with self._cond:
            self._updating = False
            self._dirty = True
            self._updates[optimizer] = self._updates.get(optimizer, 0) + 1
            self._cond.notify_all()

    def done(self, step: int, data_position: Json) -> int:
        """The state is consistent at `step`; returns the most updates one optimizer made
        since the last done() (several optimizers stepping once each are one step)."""
        with self._cond:
            self._cond.wait_for(lambda: self._frozen == 0)
            self.step, self.data_position = step, data_position
            self._updating = self._dirty = False
            most = max(self._updates.values(), default=0)
            self._updates.clear()
            self._cond.notify_all()
            return most

    def consistent(self) -> bool:
        with self._cond:
            return self.step is not None and not (self._updating or self._dirty)

    @contextlib.contextmanager
    def frozen(self, timeout: float) -> Iterator[bool]:
        """Hold updates off while the body reads the live state; yields whether that state
        is consistent at `self.step` (False after `timeout` s of an update in progress, or
        before any step: then the body must not read it)."""
        with self._cond:
            ok = self._cond.wait_for(
                lambda: not (self._updating or self._dirty), timeout=max(0.0, timeout)
            )
            ok = ok and self.step is not None
            self._frozen += 1
        try:
            yield ok
        finally:
            with self._cond:
                self._frozen -= 1
                self._cond.notify_all()

    @contextlib.contextmanager
    def ignoring(self) -> Iterator[None]:
        """Optimizer steps in the body are not training steps (a checkpoint loader's
        get_state_dict initialises optimizer state with a zero-lr step)."""
        self._ignoring.on = True
        try:
            yield
        finally:
            self._ignoring.on = False


class SignalWatch:
    """Calls `on_signal(signum)` from a thread of its own when one of `signals` arrives,
    and the handler that was installed before (a script's own SIGTERM handler) from the
    main thread, as Python would have. Start and stop it from the main thread."""

    def __init__(
        self, on_signal: Callable[[int], None], signals: tuple[int, ...] = (signal.SIGTERM,)
    ) -> None:
        self.on_signal = on_signal
        self.signals = signals
        self.received: int | None = None
        self._previous: dict[int, Handler] = {}
        self._previous_fd = -1
        self._read = self._write = -1
        self._thread: threading.Thread | None = None
        self._stopping = False

    def start(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            raise RuntimeError(
                "elastic_snapshot: enter `with snapshots:` in the main thread (Python "
                "installs signal handlers only there)"
            )
        self._read, self._write = os.pipe()
        os.set_blocking(self._write, False)
        for signum in self.signals:
            self._previous[signum] = signal.signal(signum, self._handler)
        self._previous_fd = signal.set_wakeup_fd(self._write, warn_on_full_buffer=False)
        self._thread = threading.Thread(
            target=self._run, name="elastic-snapshot-signal", daemon=True
        )
        self._thread.start()

    def _handler(self, signum: int, frame: FrameType | None) -> None:
        self.received = signum
        previous = self._previous.get(signum)
        if callable(previous):
            previous(signum, frame)

    def _run(self) -> None:
        while True:
            try:
                data = os.read(self._read, 64)
            except OSError:
                return
            if self._stopping or not data:
                return
            if self._previous_fd >= 0:  # whoever set a wakeup fd before us still gets it
                with contextlib.suppress(OSError):
                    os.write(self._previous_fd, data)
            for signum in data:
                if signum in self.signals:
                    self.received = signum
                    self.on_signal(signum)

    def stop(self) -> None:
        if self._thread is None:
            return
        self._stopping = True
        with contextlib.suppress(ValueError):  # not the main thread: leave them
            signal.set_wakeup_fd(self._previous_fd)
            for signum, previous in self._previous.items():
                signal.signal(signum, previous if previous is not None else signal.SIG_DFL)
        with contextlib.suppress(OSError):
            os.write(self._write, b"\0")
        self._thread.join(timeout=5)
        for fd in (self._read, self._write):
            with contextlib.suppress(OSError):
                os.close(fd)
        self._thread = None
