"""etcd-lease's heartbeat (torch_etcd_v3.rounds.member): its cadence, on a fake clock."""

from __future__ import annotations

import itertools
import threading

import pytest
from torch_etcd_v3.client import EtcdError
from torch_etcd_v3.rounds import member


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def monotonic(self) -> float:
        return self.now


class SlowEtcd:
    """Answers each keep-alive `answer_s` seconds after it was sent (on the fake clock);
    fails the ones numbered in `failing`."""

    def __init__(self, clock: Clock, answer_s: float, failing: tuple[int, ...] = ()) -> None:
        self.clock, self.answer_s, self.failing = clock, answer_s, failing
        self.sent: list[float] = []

    def lease_grant(self, ttl: int) -> int:
        return 0x42

    def lease_keepalive(self, lease: int, timeout: float | None = None) -> int:
        self.sent.append(self.clock.now)
        self.clock.now += self.answer_s
        if len(self.sent) in self.failing:
            raise EtcdError("etcdserver: request timed out")
        return 3


class Waits(threading.Event):
    """The keep-alive thread's sleeps, recorded and passed on the fake clock; the loop
    stops after `n`."""

    def __init__(self, clock: Clock, n: int) -> None:
        super().__init__()
        self.clock, self.n = clock, n
        self.waits: list[float] = []

    def wait(self, timeout: float | None = None) -> bool:
        assert timeout is not None
        self.waits.append(round(timeout, 3))
        self.clock.now += timeout
        return len(self.waits) > self.n


def run(monkeypatch: pytest.MonkeyPatch, etcd: SlowEtcd, clock: Clock, n: int) -> Waits:
    monkeypatch.setattr(member.time, "monotonic", clock.monotonic)
    node = member.Membership(etcd, ttl=3, interval=1.0)  # type: ignore[arg-type]
    waits = Waits(clock, n)
    node._stop = waits  # type: ignore[misc]  # the thread's sleeps, on the fake clock
    node._lease = node._client.lease_grant(3)
    node._keep_alive()  # in this thread: it returns once Waits says stop
    return waits


def test_a_slow_etcd_does_not_stretch_the_heartbeat_past_its_interval(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Renewals start one interval apart even when etcd takes 0.6 s to answer: waiting a
    whole interval after each answer made it 1.6 s, and a 3 s TTL then lapsed after two
    slow answers and a late thread."""
    clock = Clock()
    etcd = SlowEtcd(clock, answer_s=0.6)
    waits = run(monkeypatch, etcd, clock, n=5)
    assert waits.waits == [1.0, 0.4, 0.4, 0.4, 0.4, 0.4]
    gaps = [round(b - a, 3) for a, b in itertools.pairwise(etcd.sent)]
    assert gaps == [1.0] * 4


def test_an_answer_slower_than_the_interval_is_followed_by_the_next_renewal_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = Clock()
    waits = run(monkeypatch, SlowEtcd(clock, answer_s=1.5), clock, n=3)
    assert waits.waits == [1.0, 0.0, 0.0, 0.0]


def test_a_failed_renewal_is_tried_again_within_a_fraction_of_the_interval(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = Clock()
    waits = run(monkeypatch, SlowEtcd(clock, answer_s=0.1, failing=(2,)), clock, n=4)
    assert waits.waits == [1.0, 0.9, member.RETRY * 1.0, 0.9, 0.9]
