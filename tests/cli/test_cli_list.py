"""`elastic-job list` against the fake API server over HTTPS: every release of a namespace
(or of all, -A) in one row, its state, world size, min/max, rounds and restarts left from
the workers' real metrics (elastic_worker.metrics served on 127.0.0.1 and read through the
pod proxy), or from the API alone when metrics are off; kubectl's -o wide|json|yaml."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
import yaml
from cli_cluster import NS, Worker, add_release, pod, run, workers, write_kubeconfig
from elastic_job_cli import joblist, output
from elastic_job_cli.kube import CommandError, Kube
from testlib import ROOT

from localrun.cluster.apiserver import FakeApiServer
from localrun.cluster.nodes import load_nodes

AGO = timedelta(hours=3, minutes=20, seconds=5)  # kubectl's AGE: 3h20m
HEADER = ["NAME", "STATE", "WORLD", "MIN", "MAX", "ROUNDS", "RESTARTS-LEFT", "AGE"]


def _created(ago: timedelta) -> str:
    return (datetime.now(timezone.utc) - ago).strftime("%Y-%m-%dT%H:%M:%SZ")


@pytest.fixture
def trained() -> Iterator[list[Worker]]:
    """run42's two workers: three rounds (the third after two restarts of torchrun's 20)."""
    with workers(2, "run42", min_nodes=2, max_nodes=3, max_restarts=20) as ws:
        for restart in range(3):
            for rank, w in enumerate(ws):
                w.train(restart=restart, group_rank=rank, nodes=2)
        yield ws


@pytest.fixture
def api(tmp_path: Path, trained: list[Worker]) -> Iterator[FakeApiServer]:
    """In ml: run42 (metrics on, training), alpha (metrics off, two ready pods), done (scaled
    to 0 by its end) and a StatefulSet of another chart; in team-b: solo (one pod of min 2)."""
    with FakeApiServer(load_nodes("local"), workdir=tmp_path / "api", namespace=NS) as server:
        add_release(server, NS, "run42", 2, metrics=True, created=_created(AGO))
        # minutes: a loaded machine may take a second between the fixture and the listing
        add_release(server, NS, "alpha", 2, created=_created(timedelta(minutes=42)))
        add_release(server, NS, "done", 0, created=_created(timedelta(days=3, hours=5)))
        server.add_statefulset(NS, "postgres", 1)  # not elastic-job's: not listed
        add_release(server, "team-b", "solo", 1, min_nodes=2, max_nodes=4)
        server.publish_pods(
            NS,
            [pod(f"run42-elastic-job-default-{i}", "local-spot-0", metrics_port=w.port)
             for i, w in enumerate(trained)]
            + [pod(f"alpha-elastic-job-default-{i}", "local-spot-1", release="alpha")
               for i in range(2)],
        )  # fmt: skip
        server.publish_pods(
            "team-b",
            [pod("solo-elastic-job-default-0", "local-spot-1", release="solo", namespace="team-b")],
        )
        yield server


@pytest.fixture
def kubeconfig(api: FakeApiServer, tmp_path: Path) -> str:
    return write_kubeconfig(api, tmp_path / "kubeconfig")


def table(out: str) -> list[list[str]]:
    return [line.split() for line in out.splitlines()]


def test_list_shows_every_release_of_the_namespace_one_row_each(
    kubeconfig: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run(kubeconfig, "list", capsys=capsys)
    assert (code, err) == (0, "")
    assert table(out) == [
        HEADER,
        ["alpha", "running", "2", "2", "3", "-", "-", "42m"],
        ["done", "complete", "0", "2", "3", "-", "-", "3d5h"],
        ["run42", "training", "2", "2", "3", "3", "18", "3h20m"],
    ]


def test_list_all_namespaces_adds_the_namespace_column(
    kubeconfig: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run(kubeconfig, "list", "-A", capsys=capsys)
    rows = table(out)
    assert code == 0 and rows[0] == ["NAMESPACE", *HEADER]
    assert [r[:3] for r in rows[1:]] == [
        ["ml", "alpha", "running"],
        ["ml", "done", "complete"],
        ["ml", "run42", "training"],
        ["team-b", "solo", "below-min"],
    ]
    assert rows[4][3:6] == ["1", "2", "4"]  # world size 1, min 2, max 4


def test_list_wide_json_and_yaml(kubeconfig: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(kubeconfig, "list", "-o", "wide", capsys=capsys)
    rows = table(out)
    assert code == 0 and rows[0] == [*HEADER, *joblist.WIDE]
    run42 = next(r for r in rows if r[0] == "run42")
    assert run42[len(HEADER) :] == ["2/2", "2", "-", "default", "on"]  # 2 re-forms, no step
    alpha = next(r for r in rows if r[0] == "alpha")
    assert alpha[len(HEADER) :] == ["2/2", "-", "-", "default", "off"]

    code, out, _ = run(kubeconfig, "list", "-o", "json", capsys=capsys)
    items = {i["name"]: i for i in json.loads(out)["items"]}
    assert sorted(items) == ["alpha", "done", "run42"]
    r = items["run42"]
    assert (r["namespace"], r["state"], r["world_size"], r["min_nodes"], r["max_nodes"]) == (
        "ml", "training", 2, 2, 3
    )  # fmt: skip
    assert (r["rounds"], r["restarts_left"], r["reforms"], r["metrics"]) == (3, 18, 2, "on")
    assert abs(r["age_seconds"] - AGO.total_seconds()) < 60
    assert items["alpha"]["rounds"] is None and items["alpha"]["restarts_left"] is None

    code, text, _ = run(kubeconfig, "list", "-o", "yaml", capsys=capsys)
    assert code == 0 and yaml.safe_load(text)["items"][2]["rounds"] == 3
    assert [i["name"] for i in yaml.safe_load(text)["items"]] == ["alpha", "done", "run42"]


def test_restarts_left_is_the_fewest_any_pod_has(
    trained: list[Worker], kubeconfig: str, capsys: pytest.CaptureFixture[str]
) -> None:
    trained[1].train(restart=7, group_rank=1, nodes=2)  # this pod's torchrun restarted more
    _, out, _ = run(kubeconfig, "list", "-o", "json", capsys=capsys)
    run42 = next(i for i in json.loads(out)["items"] if i["name"] == "run42")
    assert (run42["restarts_left"], run42["rounds"]) == (13, 4)


def test_an_empty_namespace_says_so_on_stderr(
    kubeconfig: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run(kubeconfig, "list", "-n", "nothing-here", capsys=capsys)
    assert (code, out) == (0, "")
    assert err == "No elastic-job releases found in nothing-here namespace.\n"
    code, out, _ = run(kubeconfig, "list", "-n", "nothing-here", "-o", "json", capsys=capsys)
    assert json.loads(out) == {"items": []}


def test_a_403_on_every_namespace_names_the_cluster_wide_check(
    api: FakeApiServer, kubeconfig: str, capsys: pytest.CaptureFixture[str]
) -> None:
    api.set_fault(r"^/apis/apps/v1/statefulsets$", 403)
    code, out, err = run(kubeconfig, "list", "-A", capsys=capsys)
    assert (code, out) == (4, "")
    assert len(err.splitlines()) == 1
    assert "kubectl auth can-i list statefulsets.apps -A" in err, err


def test_kubectls_age() -> None:
    cases = {0: "0s", 119: "119s", 120: "2m", 330: "5m30s", 600: "10m", 179 * 60: "179m",
             3 * 3600: "3h", 3 * 3600 + 20 * 60: "3h20m", 8 * 3600: "8h", 47 * 3600: "47h",
             2 * 86400 + 4 * 3600: "2d4h", 3 * 86400: "3d", 400 * 86400: "400d",
             (2 * 365 + 3) * 86400: "2y3d", 9 * 365 * 86400: "9y",
             -1: "0s", -5: "<invalid>"}  # fmt: skip
    assert {s: output.age(s) for s in cases} == cases


def _access(method: str, path: str) -> tuple[str, str]:
    """The RBAC verb and resource of a request the CLI made (GET only: it writes nothing)."""
    assert method == "GET", (method, path)
    parts = path.strip("/").split("/")
    parts = parts[2:] if parts[0] == "api" else parts[3:]  # api/v1 or apis/<group>/<version>
    if parts[0] == "namespaces" and len(parts) > 2:
        parts = parts[2:]
    if len(parts) == 1:
        return "list", parts[0]
    return "get", "/".join((parts[0], *parts[2:3]))


def _readme_access() -> set[tuple[str, str]]:
    """(verb, resource) of the CLI README's "Access it needs" table."""
    readme = (ROOT / "packages" / "elastic-job-cli" / "README.md").read_text()
    section = readme.split("## Access it needs", 1)[1].split("\n## ", 1)[0]
    out = set()
    for row in re.findall(r"^\| `(\w+)` \| ([^|]+) \|", section, re.MULTILINE):
        out |= {(row[0], resource) for resource in re.findall(r"`([\w/]+)`", row[1])}
    return out


def test_the_readmes_access_is_what_the_commands_ask_for(
    api: FakeApiServer,
    kubeconfig: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Every command run against the fake API server: the verbs and resources it asked for
    (`events -w`'s watches as it opens them) are the README's table, no more, no less."""
    prices = tmp_path / "prices.yaml"
    prices.write_text("prices:\n  c-4x-amd64-linux:\n    spot: 0.1\n    on-demand: 0.4\n")
    watched: set[tuple[str, str]] = set()

    def stream(self: Kube, resource: str, *args: Any, **kwargs: Any) -> Iterator[Any]:
        """Record the watch; once all are open, end the command (as a refusal would)."""
        watched.add(("watch", resource))
        deadline = time.monotonic() + 10
        while len(watched) < 3 and time.monotonic() < deadline:  # pods, events, nodes
            time.sleep(0.05)
        raise CommandError("watch recorded")

    monkeypatch.setattr(Kube, "stream", stream)
    commands = [
        ["list"], ["list", "-A"], ["list", "-o", "wide"], ["status", "run42"],
        ["logs", "run42"], ["logs", "run42", "--all"], ["events", "run42"],
        ["events", "run42", "-w"], ["cost", "run42", "--prices", str(prices)],
    ]  # fmt: skip
    for args in commands:
        run(kubeconfig, *args, capsys=capsys)
    asked = {_access(r.method, r.path) for r in api.requests} | watched
    assert asked == _readme_access(), sorted(asked)
