"""When the live state may be read (StepGate), and the thread woken by a signal while the
main thread is blocked in native code (SignalWatch)."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from datetime import timedelta
from types import FrameType

import pytest
from elastic_snapshot.gate import SignalWatch, StepGate
from testlib import free_port
from torch.distributed import TCPStore


def test_a_save_waits_for_the_optimizer_step_in_progress_and_holds_the_next() -> None:
    gate = StepGate()
    gate.done(4, "pos-4")
    gate.before_update()  # optimizer.step() of step 5 starts
    seen: list[tuple[bool, int | None]] = []

    def saver() -> None:
        with gate.frozen(timeout=5) as ok:
            seen.append((ok, gate.step))
            time.sleep(0.3)

    thread = threading.Thread(target=saver)
    thread.start()
    time.sleep(0.2)
    assert seen == []  # step 5's update is in progress: the saver waits
    gate.after_update()
    gate.done(5, "pos-5")
    time.sleep(0.1)
    assert seen == [(True, 5)]
    started = time.monotonic()
    gate.before_update()  # step 6 waits until the saver has read the state
    assert time.monotonic() - started > 0.1
    thread.join()


def test_a_state_stepped_but_not_marked_done_is_not_read() -> None:
    gate = StepGate()
    with gate.frozen(timeout=0) as ok:
        assert not ok  # no step done yet
    gate.done(1, None)
    gate.before_update()
    gate.after_update()  # stepped, step_done(2) not called (blocked, or raised)
    with gate.frozen(timeout=0.2) as ok:
        assert not ok
    with gate.ignoring():  # a loader's zero-lr step is no training step
        gate.before_update()
        gate.after_update()
    gate.done(2, None)
    with gate.frozen(timeout=0) as ok:
        assert ok and gate.step == 2


def test_done_says_the_most_steps_one_optimizer_took_since_the_last_done() -> None:
    """What tells a script whose step is an epoch from one that marks every optimizer
    step: two optimizers stepping once each are one step; a loader's steps are none."""
    gate = StepGate()
    for optimizer in (1, 2):  # a GAN's step: each of two optimizers once
        gate.before_update()
        gate.after_update(optimizer)
    assert gate.done(1, None) == 1
    with gate.ignoring():
        gate.before_update()
        gate.after_update(1)
    assert gate.done(1, None) == 0
    for _ in range(3):  # an epoch of three optimizer steps
        gate.before_update()
        gate.after_update(1)
    assert gate.done(2, None) == 3


def test_the_signal_thread_runs_while_the_main_thread_is_blocked_in_native_code() -> None:
    """The main thread waits in a c10d store (C++, as in a collective); a Python signal
    handler cannot run before it returns, the watch's thread runs at once. The handler
    installed before is still called (when the main thread is back in Python)."""
    woke: list[float] = []
    chained: list[int] = []

    def previous(signum: int, frame: FrameType | None) -> None:
        chained.append(signum)

    old = signal.signal(signal.SIGUSR1, previous)
    watch = SignalWatch(lambda signum: woke.append(time.monotonic()), signals=(signal.SIGUSR1,))
    watch.start()
    store = TCPStore("127.0.0.1", free_port(), 1, True, timedelta(seconds=30))
    try:
        subprocess.Popen(["sh", "-c", f"sleep 0.5; kill -USR1 {os.getpid()}"])
        started = time.monotonic()
        with pytest.raises(Exception, match=r"[Tt]imeout|timed out"):
            store.wait(["never"], timedelta(seconds=3))
        returned = time.monotonic()
    finally:
        watch.stop()
        signal.signal(signal.SIGUSR1, old)
    assert len(woke) == 1
    assert woke[0] - started < 2.0 < returned - started  # woke while the wait still blocked
    assert chained == [signal.SIGUSR1]
    assert watch.received == signal.SIGUSR1
