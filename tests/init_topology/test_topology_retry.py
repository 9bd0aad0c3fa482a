"""The retry loop on its own, with a fake clock: bounded by the budget, backoff between
attempts, never a timeout <= 0 even when the process wakes up late."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from init_topology.config import Config
from init_topology.nodeapi import NodeUnavailable, Response, fetch_node


@dataclass
class Clock:
    now: float = 100.0
    late_by: float = 0.0  # every sleep overshoots by this much (a loaded machine)
    sleeps: list[float] = field(default_factory=list)

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds + self.late_by


@dataclass
class TimingOutApi:
    clock: Clock
    timeouts: list[tuple[float, float]] = field(default_factory=list)

    def get(self, timeout: tuple[float, float]) -> Response:
        connect, read = timeout
        assert connect > 0 and read > 0
        self.timeouts.append((connect, read))
        self.clock.now += read  # the server never answers: the read timeout expires
        raise TimeoutError("The read operation timed out")


def config(timeout: float) -> Config:
    return Config(
        node_name="n",
        output=Path("/tmp/unused"),
        label_map=(),
        strict=False,
        timeout_seconds=timeout,
        user_env=frozenset(),
        serviceaccount_dir=Path("/nonexistent"),
        api_host="10.0.0.1",
        api_port="443",
    )


@pytest.mark.parametrize("late_by", [0.0, 0.5, 3.0])
@pytest.mark.parametrize("budget", [0.3, 2.0, 10.0, 30.0])
def test_attempts_stay_within_the_budget(budget: float, late_by: float) -> None:
    clock = Clock(late_by=late_by)
    api = TimingOutApi(clock)
    with pytest.raises(
        NodeUnavailable, match=re.escape("no answer from the API server 10.0.0.1:443")
    ):
        fetch_node(config(budget), sleep=clock.sleep, clock=clock, transport=lambda c: api.get)
    spent = clock.now - 100.0
    # Only a late wake-up (not the loop) can exceed the budget, by one overshoot and one
    # minimal attempt at most.
    assert spent <= budget + late_by + 0.1 + 1e-9
    assert all(read <= 5.0 for _, read in api.timeouts)
    # Backoff doubles (with jitter in [b/2, b]) up to 2 s.
    for i, pause in enumerate(clock.sleeps):
        assert min(0.2 * 2**i, 2.0) / 2 <= pause <= min(0.2 * 2**i, 2.0)


def test_a_long_budget_makes_several_attempts() -> None:
    clock = Clock()
    api = TimingOutApi(clock)
    with pytest.raises(NodeUnavailable, match=r"\(\d+ attempts in \d+\.\ds\)"):
        fetch_node(config(30), sleep=clock.sleep, clock=clock, transport=lambda c: api.get)
    assert len(api.timeouts) >= 5
