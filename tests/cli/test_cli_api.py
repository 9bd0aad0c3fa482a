"""elastic-job against the fake API server over HTTPS (kubeconfig with its CA and token):
what it prints, and the one line and exit code of each error a user meets."""

from __future__ import annotations

import io
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from cli_cluster import NS, add_release, pod, run, write_kubeconfig
from elastic_job_cli import cli
from elastic_job_cli.kube import connect
from elastic_job_cli.options import Access

from localrun.cluster import apilist, podlogs
from localrun.cluster.apiserver import FakeApiServer
from localrun.cluster.nodes import load_nodes


@pytest.fixture
def api(tmp_path: Path) -> Iterator[FakeApiServer]:
    with FakeApiServer(load_nodes("local"), workdir=tmp_path / "api", namespace=NS) as server:
        add_release(server, NS, "run42", 3)
        server.publish_pods(
            NS,
            [
                pod("run42-elastic-job-default-0", "local-spot-0"),
                pod("run42-elastic-job-default-1", "local-ondemand-0", disruption=True),
            ],
        )
        yield server


@pytest.fixture
def kubeconfig(api: FakeApiServer, tmp_path: Path) -> str:
    return write_kubeconfig(api, tmp_path / "kubeconfig")


def test_status_from_the_api_alone_when_metrics_are_off(
    kubeconfig: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run(kubeconfig, "status", "run42", capsys=capsys)
    assert code == 0
    first = out.splitlines()[0]
    assert first == "job run42 (namespace ml): running, world size 2 (min 2, max 3)"
    assert "metrics off (chart: monitoring.enabled=false)" in out
    row = next(line for line in out.splitlines() if line.startswith("run42-elastic-job-default-1"))
    assert row.split()[:4] == [
        "run42-elastic-job-default-1",
        "Running",
        "local-ondemand-0",
        "on-demand",
    ]
    code, out, _ = run(kubeconfig, "status", "run42", "-o", "json", capsys=capsys)
    data = json.loads(out)
    assert data["state"] == "running" and data["pods"][0]["capacity_type"] == "spot"


def test_no_such_release_says_how_to_find_one(
    kubeconfig: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run(kubeconfig, "-n", "other", "status", "run42", capsys=capsys)
    assert code == 3
    assert "no elastic-job release 'run42' in namespace 'other'" in err
    assert "helm list -n other" in err


def test_a_403_names_the_rbac_verb_and_resource(
    api: FakeApiServer, kubeconfig: str, capsys: pytest.CaptureFixture[str]
) -> None:
    api.set_fault(r"/pods$", 403)
    code, _, err = run(kubeconfig, "status", "run42", capsys=capsys)
    assert code == 4
    assert 'cannot list resource "pods"' in err
    assert (
        "ask for a Role granting list on pods (check with: kubectl auth can-i list pods -n ml)"
        in err
    )


def test_logs_of_one_pod_and_of_all(
    api: FakeApiServer, kubeconfig: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    logs = tmp_path / "logs"
    for n in (0, 1):
        path = logs / f"run42-elastic-job-default-{n}.log"
        path.parent.mkdir(exist_ok=True)
        path.write_text(podlogs.start_line("worker", 1, 0, "10:00:00") + f"hello from {n}\n")
    api.log_source = lambda ns, name, c: (logs / f"{name}.log", 1)
    code, out, _ = run(kubeconfig, "logs", "run42", "run42-elastic-job-default-1", capsys=capsys)
    assert (code, out) == (0, "hello from 1\n")
    code, out, _ = run(kubeconfig, "logs", "run42", "--all", capsys=capsys)
    assert out.splitlines() == [
        "[run42-elastic-job-default-0] hello from 0",
        "[run42-elastic-job-default-1] hello from 1",
    ]
    code, _, err = run(kubeconfig, "logs", "run42", "nope", capsys=capsys)
    assert code == 2 and "pod 'nope' is not a worker of run42" in err
    code, _, err = run(kubeconfig, "logs", "run42", capsys=capsys)
    assert code == 2 and "name a POD, or pass --all, --rank0 or --save DIR" in err


def test_events_merge_the_disruption_and_the_workers_events(
    api: FakeApiServer, kubeconfig: str, capsys: pytest.CaptureFixture[str]
) -> None:
    api.add_event(
        {
            "metadata": {"namespace": NS},
            "involvedObject": {"kind": "Pod", "name": "run42-elastic-job-default-0"},
            "reason": "Reformed",
            "message": "re-formed at world size 1 after 4.5 s (round 2, group rank 0)",
            "type": "Normal",
            "source": {"component": "elastic-worker"},
            "lastTimestamp": "2026-11-23T10:05:09Z",
        }
    )
    code, out, _ = run(kubeconfig, "events", "run42", capsys=capsys)
    assert code == 0
    reasons = [line.split()[2] for line in out.splitlines()]
    assert reasons == ["TerminationByKubelet", "Reformed"]


def test_cost_with_a_bad_prices_file_names_the_entry(
    kubeconfig: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    prices = tmp_path / "prices.yaml"
    prices.write_text("prices:\n  c-4x-amd64-linux:\n    spot: -1\n")
    code, _, err = run(kubeconfig, "cost", "run42", "--prices", str(prices), capsys=capsys)
    assert code == 2 and "prices.c-4x-amd64-linux.spot=-1: give a price per node-hour" in err
    prices.write_text("prices:\n  c-4x-amd64-linux:\n    spot: 0.1\n    on-demand: 0.4\n")
    code, out, _ = run(kubeconfig, "cost", "run42", "--prices", str(prices), capsys=capsys)
    assert code == 0 and out.startswith("INSTANCE TYPE")
    assert [line.split()[1] for line in out.splitlines()[1:3]] == ["on-demand", "spot"]


def test_a_missing_kubeconfig_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run(str(tmp_path / "none"), "status", "run42", capsys=capsys)
    assert code == 2 and "no cluster access" in err and "--kubeconfig" in err


def test_events_watch_goes_on_when_the_server_ends_a_watch(
    api: FakeApiServer, kubeconfig: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(apilist, "WATCH_TIMEOUT", 1.0)  # the server ends each watch at 1 s
    out = io.StringIO()
    kube = connect(Access(kubeconfig, None, NS, all_namespaces=False, request_timeout=30.0))
    threading.Thread(
        target=cli.run_events,
        args=(kube, "run42"),
        kwargs={"watch": True, "fmt": "json", "out": out},
        daemon=True,
    ).start()
    time.sleep(2.5)  # past two server-side ends of the watches
    api.add_event(
        {
            "metadata": {"namespace": NS},
            "involvedObject": {"kind": "Pod", "name": "run42-elastic-job-default-0"},
            "reason": "Reformed",
            "message": "re-formed at world size 2 after 3.0 s",
            "type": "Normal",
            "lastTimestamp": "2026-11-23T10:06:00Z",
        }
    )
    api.publish_pods(NS, [pod("run42-elastic-job-default-0", "local-spot-0")])  # -1 deleted
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and out.getvalue().count("\n") < 3:
        time.sleep(0.2)
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    reasons = [e["reason"] for e in lines]
    assert reasons[0] == "TerminationByKubelet"  # the list, first
    assert "Reformed" in reasons and "PodDeleted" in reasons, reasons
    assert reasons.count("TerminationByKubelet") == 1  # not said again after a new list


def test_logs_that_are_not_utf8_are_printed_as_kubectl_prints_them(
    api: FakeApiServer, kubeconfig: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A training script may print bytes that are not UTF-8 (a binary blob, a multibyte
    character cut by a buffer); the client's decoding of the body raised on them, and the
    kubernetes client 36 turns every log into the text "b'...'": the body is read raw and
    decoded here, with the bad bytes replaced."""
    logs = tmp_path / "logs"
    logs.mkdir()
    path = logs / "run42-elastic-job-default-1.log"
    path.write_bytes(
        podlogs.start_line("worker", 1, 0, "10:00:00").encode() + b"step=3 \xff\xfe ok \xc3\xa9\n"
    )
    api.log_source = lambda ns, name, c: (logs / f"{name}.log", 1)
    code, out, err = run(kubeconfig, "logs", "run42", "run42-elastic-job-default-1", capsys=capsys)
    assert (code, out, err) == (0, "step=3 \ufffd\ufffd ok \u00e9\n", "")
