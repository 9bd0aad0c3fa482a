"""elastic_worker.events: the worker's Kubernetes Events, POSTed to the fake API server
(real HTTPS, token, CA) and read back as `kubectl get events` reads them; and the facts
the state machine (metrics.Tracker) reports to it."""

from __future__ import annotations

import logging
import re
import time
from pathlib import Path
from typing import Any

import pytest
from elastic_worker.attempt_line import AttemptLine as Attempt
from elastic_worker.observe import events
from elastic_worker.observe.metrics import Identity, JobMetrics, Tracker
from elastic_worker.settings import config

from localrun.cluster.apiserver import FakeApiServer

BASE = {
    "ELASTIC_JOB_ID": "run42",
    "ELASTIC_RDZV_ENDPOINT": "127.0.0.1:2379",
    "ELASTIC_MIN_NODES": "2",
    "ELASTIC_MAX_NODES": "3",
    "ELASTIC_INJECT_ENV": "/nonexistent",
    "POD_NAME": "run42-worker-1",
    "POD_NAMESPACE": "ml",
    "POD_UID": "3b0c0a4e-0000-4000-8000-000000000001",
    "NODE_NAME": "local-spot-0",
    "ELASTIC_EVENTS": "true",
}


def load(api: FakeApiServer | None, **extra: str) -> config.Config:
    env = dict(BASE, **extra)
    if api is not None:
        env.update(api.env(), ELASTIC_SERVICEACCOUNT_DIR=str(api.serviceaccount_dir))
        # The release's StatefulSets, as the chart's ConfigMap mounts them beside the token.
        listing = api.serviceaccount_dir.parent / "statefulsets"
        listing.write_text("run42-worker\n")
        env.setdefault("ELASTIC_STATEFULSETS_FILE", str(listing))
    return config.load(["train.py"], env)


def posted(api: FakeApiServer) -> list[dict[str, Any]]:
    return api.events("ml")


def test_events_on_the_pod_and_the_statefulset(tmp_path: Path) -> None:
    with FakeApiServer({}, workdir=tmp_path, namespace="ml") as api:
        rec = events.recorder(load(api))
        assert rec.enabled
        rec.record(events.REFORMED, "re-formed at world size 2 after 5.6 s")
        rec.record(events.JOB_COMPLETED, "training complete", job=True)
        rec.close()
        pod_event, job_event = posted(api)
    assert pod_event["involvedObject"] == {
        "apiVersion": "v1",
        "kind": "Pod",
        "name": "run42-worker-1",
        "namespace": "ml",
        "uid": "3b0c0a4e-0000-4000-8000-000000000001",
    }
    assert (pod_event["reason"], pod_event["type"]) == ("Reformed", "Normal")
    assert pod_event["source"] == {"component": "elastic-worker", "host": "local-spot-0"}
    assert pod_event["metadata"]["name"].startswith("run42-worker-1.")
    assert job_event["involvedObject"]["kind"] == "StatefulSet"
    assert job_event["involvedObject"]["name"] == "run42-worker"


def test_off_or_without_api_access_nothing_is_recorded(tmp_path: Path) -> None:
    with FakeApiServer({}, workdir=tmp_path, namespace="ml") as api:
        rec = events.recorder(load(api, ELASTIC_EVENTS="false"))
        rec.record(events.REFORMED, "x")
        rec.close()
        assert not rec.enabled and api.requests == []
    assert not events.recorder(load(None)).enabled


def test_a_403_is_said_once_with_the_missing_grant_then_no_more_tries(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with FakeApiServer({}, workdir=tmp_path, namespace="ml") as api:
        api.set_fault(r"/events$", 403)
        rec = events.recorder(load(api))
        with caplog.at_level(logging.INFO, logger="elastic_worker.observe.events"):
            rec.record(events.REFORMED, "a")
            rec.record(events.REFORMED, "b")
            rec.close()
        assert len(api.requests) == 1
    # The recorder's own warnings: a lease thread left by an earlier test of this process
    # (torch_etcd_v3's keep-alive, its etcd stopped) may log one too (seen in CI).
    warnings = [
        r.getMessage()
        for r in caplog.records
        if r.levelno == logging.WARNING and r.name == "elastic_worker.observe.events"
    ]
    assert len(warnings) == 1
    assert "lacks create on events (chart: events.enabled)" in warnings[0]


def test_a_hanging_api_server_never_blocks_the_worker(tmp_path: Path) -> None:
    with FakeApiServer({}, workdir=tmp_path, namespace="ml", hang_seconds=30) as api:
        api.set_fault(r"/events$", "hang")
        rec = events.recorder(load(api))
        started = time.monotonic()
        for i in range(5):
            rec.record(events.REFORMED, str(i))
        assert time.monotonic() - started < 0.5  # record() only queues
        rec.close(wait=1.0)
        assert time.monotonic() - started < 2.0  # close() waits a bounded time


def tracker(notes: list[tuple[str, str, str]], now: list[float]) -> Tracker:
    """A tracker whose Events land in `notes` as (reason, message, type)."""
    metrics = JobMetrics(Identity("run42", "default"))

    def notify(reason: events.Reason, message: str) -> None:
        notes.append((reason.name, message, reason.type))

    return Tracker(metrics, 2, 3, 5, clock=lambda: now[0], notify=notify)


def attempt(nodes: int, pid: int, rank: int = 0) -> Attempt:
    return Attempt("run42", 0, rank, nodes, nodes, pid)


def test_the_tracker_reports_a_reform_with_world_size_and_seconds() -> None:
    notes: list[tuple[str, str, str]] = []
    now = [100.0]
    t = tracker(notes, now)
    t.torchrun_started()
    t.attempt(attempt(3, 10))
    assert notes == []  # the first round is no re-form
    now[0] = 110.0
    t.attempt_ended()
    now[0] = 115.6
    t.attempt(attempt(2, 11, rank=1))
    assert notes == [
        ("Reformed", "re-formed at world size 2 after 5.6 s (round 2, group rank 1)", "Normal")
    ]


def test_the_tracker_reports_a_spare_waiting_then_joining() -> None:
    notes: list[tuple[str, str, str]] = []
    now = [0.0]
    t = tracker(notes, now)
    t.torchrun_started()
    t.members_registered(4)
    t.members_registered(4)  # said once
    assert [n[0] for n in notes] == ["WaitingAsSpare"]
    assert "4 pods registered and a round holds at most 3" in notes[0][1]
    t.attempt(attempt(3, 12))
    assert notes[-1][:2] == (
        "SpareJoined",
        "joined round 1 at world size 3 after waiting as a spare",
    )


def test_the_worker_records_its_gate_timeout_on_its_pod(tmp_path: Path) -> None:
    """The real entrypoint: an etcd that never answers, a 2 s gate, events on; the Event
    reaches the API server before the worker exits 3."""
    from testlib import free_port  # noqa: PLC0415

    from worker.gate.test_wait import run_worker  # noqa: PLC0415
    from worker.worker_helpers import worker_env  # noqa: PLC0415

    with FakeApiServer({}, workdir=tmp_path, namespace="ml") as api:
        env = worker_env(f"127.0.0.1:{free_port()}", "gate", ELASTIC_GATE_TIMEOUT="2")
        env.update(
            api.env(),
            ELASTIC_SERVICEACCOUNT_DIR=str(api.serviceaccount_dir),
            ELASTIC_EVENTS="true",
            POD_NAMESPACE="ml",
            POD_NAME="run42-worker-0",
            POD_UID="uid-0",
        )
        code, lines, _ = run_worker(env)
        assert code == 3, lines
        (event,) = posted(api)
    assert (event["reason"], event["type"]) == ("GateTimeout", "Warning")
    assert event["message"].startswith("readiness gate timed out after 2 s waiting for: ")
    assert event["involvedObject"]["uid"] == "uid-0"


def test_every_reason_is_in_the_contracts_events_table_and_only_those() -> None:
    """docs/contracts.md's Events table and events.REASONS: the same names, types and
    objects (the table says more of when)."""
    from testlib import ROOT  # noqa: PLC0415

    text = (ROOT / "docs" / "contracts.md").read_text()
    section = text[text.index("## Events") : text.index("## Reference training script")]
    rows = re.findall(r"^\| `(\w+)` \| (Normal|Warning) \| ([\w; ]+) \|", section, re.M)
    table = {name: (kind, tuple(o.strip() for o in on.split(";"))) for name, kind, on in rows}
    assert table == {r.name: (r.type, r.on) for r in events.REASONS}


def test_every_reason_the_worker_records_is_named_in_the_table() -> None:
    """No Event reason is written as a string anywhere in the worker: each is a Reason."""
    src = Path(events.__file__).parents[1]
    names = {r.name for r in events.REASONS}
    for path in src.rglob("*.py"):
        for name in re.findall(r'record\(\s*"(\w+)"', path.read_text()):
            raise AssertionError(f"{path}: record({name!r}) is not a Reason")
    assert len(names) == len(events.REASONS)
