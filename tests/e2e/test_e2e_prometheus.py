"""`elastic-local run --prometheus` (issue 10): Debian's prometheus scrapes the real pods
through charts/elastic-job-cluster's PodMonitor (the release has none of its own, as a
tenant's) with that chart's rules, and these tests read what it shows through its own HTTP
API (/api/v1/query, /api/v1/alerts) while the run goes on.

Two runs: a SIGKILL re-form, then a loss below job.minNodes, with every dashboard query
checked in between; and a script that keeps failing. The alerts' `for:` and windows are
shortened by values (localrun/prometheus.py LOCAL_CLUSTER_VALUES, and --cluster-set here).
"""

from __future__ import annotations

import json
import re
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
from localrun_e2e import (
    ROOT,
    LocalRun,
    finished,
    local_command,
    pod,
    reform,
    root_with_namespaces,
)

pytestmark = [
    pytest.mark.netns,
    pytest.mark.skipif(bool(root_with_namespaces()), reason=root_with_namespaces() or "ok"),
    pytest.mark.skipif(shutil.which("prometheus") is None, reason="prometheus: scripts/bootstrap"),
]

JOB_ID = "default-e2e"  # the chart's job id of release e2e in namespace default
NAMESPACE = "default"
SCRAPE_JOB = "monitoring/elastic-job-cluster-workers"  # the PodMonitor's, as the operator names it
DASHBOARD = ROOT / "charts" / "elastic-job-cluster" / "dashboards" / "elastic-job.json"
T = TypeVar("T")


class Running:
    """A run in the background: its output file, its Prometheus."""

    def __init__(self, tmp_path: Path, *args: str, **kwargs: Any) -> None:
        self.tmp_path = tmp_path
        self.output = tmp_path / "runner-output.live"
        self.start = time.monotonic()
        with open(self.output, "w") as out:
            # SIGTERM, never SIGKILL, when the test stops it: the runner then cleans up.
            self.proc = subprocess.Popen(
                local_command(tmp_path, *args, "--prometheus", **kwargs),
                cwd=ROOT,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        self.url = ""

    def text(self) -> str:
        return self.output.read_text(errors="replace")

    def _url(self) -> str | None:
        m = re.search(r"\] prometheus (http://\S+) ", self.text())
        return m.group(1) if m else None

    def wait(self, probe: Callable[[], T | None], seconds: float, what: str) -> T:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            found = probe()
            if found:
                return found
            if self.proc.poll() is not None:
                break
            time.sleep(0.5)
        tail = "\n".join(self.text().splitlines()[-40:])
        raise AssertionError(f"no {what} within {seconds:g}s\n--- output tail ---\n{tail}")

    def query(self, expr: str) -> list[dict[str, Any]]:
        """An instant query's vector: [{metric: {...}, value: [t, "v"]}, ...]."""
        q = urllib.parse.urlencode({"query": expr})
        try:
            with urllib.request.urlopen(f"{self.url}/api/v1/query?{q}", timeout=5) as r:
                body = json.load(r)
        except urllib.error.HTTPError as exc:
            raise AssertionError(f"{expr}: {exc.read().decode(errors='replace')}") from None
        assert body["status"] == "success", (expr, body)
        result: list[dict[str, Any]] = body["data"]["result"]
        return result

    def values(self, expr: str) -> dict[str, float]:
        """pod -> value of an instant query."""
        return {r["metric"].get("pod", ""): float(r["value"][1]) for r in self.query(expr)}

    def alerts(self, name: str, state: str = "firing") -> list[dict[str, Any]]:
        with urllib.request.urlopen(f"{self.url}/api/v1/alerts", timeout=5) as r:
            body = json.load(r)
        return [
            a
            for a in body["data"]["alerts"]
            if a["labels"]["alertname"] == name and a["state"] == state
        ]

    def end(self, timeout: float = 300, stop: bool = False) -> LocalRun:
        if stop:
            self.proc.send_signal(signal.SIGTERM)
        try:
            rc = self.proc.wait(timeout=timeout)
        except BaseException:
            self.proc.terminate()
            self.proc.wait(timeout=60)
            raise
        return finished(self.tmp_path, rc, self.text(), time.monotonic() - self.start)


@pytest.fixture
def start(tmp_path: Path) -> Iterator[Callable[..., Running]]:
    """start(*args, **kwargs): a run with --prometheus, once Prometheus is up; a run the
    test leaves running (a failed assertion) gets SIGTERM and cleans up."""
    runs: list[Running] = []

    def start_run(*args: str, **kwargs: Any) -> Running:
        run = Running(tmp_path, *args, **kwargs)
        runs.append(run)
        run.url = run.wait(run._url, 120, "the prometheus line")
        return run

    yield start_run
    for run in runs:
        if run.proc.poll() is None:
            run.proc.terminate()
            run.proc.wait(timeout=60)


def dashboard_queries(namespace: str, job: str) -> list[tuple[str, str]]:
    """(panel title, expr) of every target of the dashboard, its variables substituted as
    Grafana would for a 10-minute view of one job."""
    panels = json.loads(DASHBOARD.read_text())["panels"]
    # A namespace and a job id are DNS labels: no regex metacharacters to escape.
    subst = {"$namespace": namespace, "$job": job, "$__range": "10m", "$__rate_interval": "1m"}
    out = []
    for p in panels:
        for t in p.get("targets") or []:
            expr = t["expr"]
            for k, v in subst.items():
                expr = expr.replace(k, v)
            assert "$" not in expr, f"unsubstituted variable in {p['title']}: {expr}"
            out.append((p["title"], expr))
    return out


@pytest.mark.slow
def test_prometheus_shows_the_sigkill_reform_every_dashboard_query_and_fires_below_min(
    start: Callable[..., Running],
) -> None:
    # pod 1 is SIGKILLed at step 8 and stays down 15 s: pods 0 and 2 re-form at 2, pod 1
    # rejoins (3). At step 60 pods 1 and 2 are SIGKILLed for 40 s: pod 0 alone is below
    # job.minNodes (2) for longer than the alert's `for:` (10 s), then the job completes.
    run = start(
        f"--kill={pod(1)}@step=8:15",
        f"--kill={pod(1)}@step=60:40",
        f"--kill={pod(2)}@step=60:40",
        steps=100,
        every=5,
        timeout=400,
    )
    sel = f'namespace="{NAMESPACE}",elastic_job="{JOB_ID}"'
    # The first re-form, seen by the survivors: one observation each (read before the
    # rejoin of pod 1 adds a second).
    once = f"(elastic_job_reforms_total{{{sel}}} == 1)"
    observed = f"(elastic_job_reform_first_step_seconds_count{{{sel}}} == 1) and on (pod) {once}"
    first_step = run.wait(
        lambda: run.values(f"elastic_job_reform_first_step_seconds_sum and on (pod) {observed}"),
        120,
        "re-form observed in elastic_job_reform_first_step_seconds",
    )
    rendezvous = run.values(f"elastic_job_reform_rendezvous_seconds_sum and on (pod) {once}")
    print(f"re-form after the SIGKILL: rendezvous {rendezvous} first step {first_step}")
    assert set(first_step) <= {pod(0), pod(2)}, first_step
    for name, seconds in first_step.items():
        assert 0 < rendezvous[name] <= seconds, (rendezvous, first_step)

    # Training again at 3: every query of the dashboard returns a number (retried while
    # the series of the rejoined pod fill in), and the world is not below min.
    run.wait(
        lambda: run.values(f"max(elastic_job_world_size_nodes{{{sel}}}) == 3"), 120, "world at 3"
    )
    queries = dashboard_queries(NAMESPACE, JOB_ID)
    missing: list[str] = []

    def every_query_has_data() -> bool:
        missing[:] = [
            f"{title}: {expr}"
            for title, expr in queries
            if not any(r["value"][1] != "NaN" for r in run.query(expr))
        ]
        return not missing

    try:
        run.wait(every_query_has_data, 60, "data for every dashboard query")
    except AssertionError as exc:
        raise AssertionError(f"dashboard queries without data: {missing}") from exc
    print(f"dashboard: {len(queries)} queries, each with data")
    # kube-prometheus-stack's conventions: the scrape keeps its own job label, nothing is
    # renamed exported_* (no honorLabels), namespace and pod are the target's.
    series = run.query(f"elastic_job_world_size_nodes{{{sel}}}")
    assert {r["metric"]["job"] for r in series} == {SCRAPE_JOB}, series
    assert not [k for r in series for k in r["metric"] if k.startswith("exported_")], series
    # each series' pod is the target's (a subset: on a loaded machine the dashboard's wait
    # above may outlast step 60, where pods 1 and 2 are killed)
    assert series and {r["metric"]["pod"] for r in series} <= {pod(0), pod(1), pod(2)}, series
    assert not run.alerts("ElasticJobWorldSizeBelowMin", "firing")

    # Pods 1 and 2 down for 40 s: the world-size alert fires for this job.
    firing = run.wait(
        lambda: run.alerts("ElasticJobWorldSizeBelowMin"), 150, "ElasticJobWorldSizeBelowMin firing"
    )
    assert firing[0]["labels"]["elastic_job"] == JOB_ID, firing
    assert firing[0]["labels"]["namespace"] == NAMESPACE, firing
    assert firing[0]["labels"]["severity"] == "critical", firing
    print(f"world size below min: firing, value {firing[0]['value']}")

    done = run.end()
    s = done.summary
    assert done.rc == 0, done.describe()
    assert s["completed"] is True, done.describe()
    assert s["prometheus_url"] == run.url, done.describe()
    kill = reform(done, f"kill {pod(1)}")
    print(f"summary: re-form after the SIGKILL {kill['seconds']} s")
    # The pods measure from their own training process's end, the run from the SIGKILL:
    # the metric cannot exceed the run's figure (a little slack for log-line latency).
    for seconds in first_step.values():
        assert seconds <= kill["seconds"] + 1.0, (first_step, kill)


@pytest.mark.slow
def test_prometheus_fires_the_restart_storm_alert_for_a_script_that_keeps_failing(
    start: Callable[..., Running],
) -> None:
    # Every attempt of the script fails after 2 s; torchrun restarts the workers of each
    # pod (rendezvous.maxRestarts 20): more than 2 restarts of one pod within 1 minute fire
    # the storm alert for that pod. The run is stopped once it fires.
    run = start(
        "--cluster-set=prometheusRule.restartStorm.restarts=2",
        "--cluster-set=prometheusRule.restartStorm.window=1m",
        command=["sh", "-c", "sleep 2; exit 1"],
        timeout=300,
    )
    firing = run.wait(
        lambda: run.alerts("ElasticJobRankRestartStorm"), 180, "ElasticJobRankRestartStorm firing"
    )
    restarts = run.values(f'elastic_job_worker_restarts_total{{elastic_job="{JOB_ID}"}}')
    print(f"restart storm: {[a['labels']['pod'] for a in firing]}; restarts {restarts}")
    done = run.end(timeout=120, stop=True)
    for a in firing:
        assert a["labels"]["elastic_job"] == JOB_ID, firing
        assert a["labels"]["namespace"] == NAMESPACE, firing
        assert a["labels"]["pod"] in {pod(0), pod(1), pod(2)}, firing
        assert a["labels"]["severity"] == "warning", firing
        assert float(a["value"]) > 2, firing
        # the node, from kube_pod_info of the run's kube-state-metrics stand-in
        assert a["labels"]["node"] == done.summary["pods"][a["labels"]["pod"]]["node"], firing
    assert done.summary["completed"] is False, done.describe()
