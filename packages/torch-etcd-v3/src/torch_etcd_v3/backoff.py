"""The wait after a lost compare-and-set of the rendezvous state (standard library only)."""

from __future__ import annotations

import random
from dataclasses import dataclass

#: Nodes per step of the first wait after a lost compare-and-set (below).
NODES_PER_STEP = 32


@dataclass(frozen=True)
class Backoff:
    """After a lost compare-and-set, wait at random up to `first` x 2^n (n: losses in a
    row), never above `most`, then read the state afresh. torch's join loop retries a lost
    write at once, so with N agents joining together every winning write costs about N
    losing ones; at 128-256 agents the heartbeats of the agents already in the round no
    longer get through within keep-alive interval x attempts, the others' sanitizer evicts
    them, they join again, and the rendezvous never completes
    (docs/notes/2026-11-25-rendezvous-at-scale.md). The wait spreads the retries; an
    uncontended write never waits.
    """

    first: float = 0.01
    most: float = 0.5

    @classmethod
    def for_job(cls, max_nodes: int, keep_alive_interval: float) -> Backoff:
        """Scaled to the job: `first` 10 ms per 32 nodes (that many may contend at a
        bring-up), `most` an eighth of the keep-alive interval, not below 0.5 s, so a
        heartbeat still lands in its window of interval x attempts. A job of up to 32
        nodes with a 1-4 s interval gets 10 ms and 0.5 s. Measured with 256 agents
        (keep-alive 8 s) on 2 cores: 10 ms/0.5 s joined in 8.1-8.8 s, 80 ms/1 s in
        5.8-6.4 s, with a third of the lost writes."""
        steps = max(1, -(-max_nodes // NODES_PER_STEP))
        return cls(first=cls.first * steps, most=max(cls.most, keep_alive_interval / 8))

    def wait(self, lost_in_row: int) -> float:
        return random.uniform(0, min(self.most, self.first * 2**lost_in_row))
