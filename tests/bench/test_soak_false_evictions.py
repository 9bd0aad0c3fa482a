"""scripts/soak-false-evictions (benches/soak): how it reads etcd's events on the round
(refresh gaps by etcd's clock, lapses), its verdict, the attempt line its members watch,
and a short soak of the worker's own liveness against a real etcd."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest
from elastic_worker import timings
from testlib import ROOT

from benches.soak.cli import attempt_line, report
from benches.soak.watch import Events
from benches.worker import liveness, parse_attempt

KEY = "/elastic-job/soak/rounds/soak@10.0.0.1:29400/pod-0"


def refresh(key: str, expiration: str, index: int) -> dict[str, object]:
    # etcd v2's answer to a watch, for a refresh of a key with a TTL
    node = {"key": key, "value": liveness.ALIVE, "expiration": expiration, "ttl": 4}
    return {"action": "set", "node": {**node, "modifiedIndex": index}}


def test_refresh_gaps_are_measured_by_etcds_clock_per_member_and_lapses_counted() -> None:
    events = Events("127.0.0.1:2379", "/elastic-job/soak/rounds/x")
    index = events.record(refresh(KEY, "2026-11-23T23:39:41.250000123Z", 7), 0)
    assert index == 8 and events.gaps == []  # a first refresh: no gap yet
    events.record(refresh(KEY + "x", "2026-11-23T23:39:41.900Z", 8), index)  # another member
    index = events.record(refresh(KEY, "2026-11-23T23:39:42.500000Z", 9), index)
    assert events.gaps == [pytest.approx(1.25)]
    expired = {"action": "expire", "node": {"key": KEY, "modifiedIndex": 12}}
    assert events.record(expired, index) == 13
    assert events.lapses == [KEY]
    left = {"action": "set", "node": {"key": KEY, "value": liveness.LEFT, "modifiedIndex": 14}}
    events.record(left, 13)  # a member that left on purpose is neither a refresh nor a lapse
    assert len(events.gaps) == 1 and events.lapses == [KEY]


def test_the_verdict_is_a_false_eviction_for_a_lapse_or_a_stopped_training_process() -> None:
    gaps = [1.0] * 98 + [1.4, 2.5]
    lines, evicted = report(gaps, lapses=0, stopped=0)
    assert lines[0] == (
        f"soak: refresh gaps over 100 refreshes: median 1.00 s, p99 2.50 s, max 2.50 s "
        f"(TTL {timings.ROUND_KEY_TTL} s: margin {timings.ROUND_KEY_TTL - 2.5:.2f} s)"
    )
    assert lines[1].endswith(": no false eviction") and not evicted
    assert report(gaps, lapses=1, stopped=0)[1]
    lines, evicted = report(gaps, lapses=0, stopped=2)
    assert evicted and lines[1] == (
        "soak: 0 keys lapsed, 2 training processes stopped: FALSE EVICTIONS"
    )


def test_the_members_attempt_line_is_one_the_worker_reads_with_the_programs_pid() -> None:
    attempt = parse_attempt(attempt_line(1, 3, 4242).rstrip("\n"))
    assert attempt is not None
    assert (attempt.group_rank, attempt.nodes, attempt.pid) == (1, 3, 4242)


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("etcd") is None, reason="etcd not installed: scripts/bootstrap")
def test_a_short_soak_without_load_sees_the_members_refresh_and_evicts_none() -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "soak-false-evictions"), "--minutes", "0.25",
         "--busy", "0"],
        capture_output=True, text=True, timeout=180, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert "soak: 3 members (TTL" in result.stdout
    assert "0 keys lapsed, 0 training processes stopped: no false eviction" in result.stdout
    gaps = next(line for line in result.stdout.splitlines() if "refresh gaps over" in line)
    assert int(gaps.split("over ")[1].split()[0]) >= 3 * 5  # each member, about every second
