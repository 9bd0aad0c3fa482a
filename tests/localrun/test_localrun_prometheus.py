"""`elastic-local run --prometheus`: the scrape targets the PodMonitor of
charts/elastic-job-cluster selects (and a release's own), the cluster chart's alert rules
with the local durations, and Debian's prometheus loading them."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from localrun import prometheus
from localrun.cli import UsageError, build_parser, config_from_args
from localrun.cluster.nodes import load_nodes
from localrun.kubestate import KubeState
from localrun.prometheus import PodView, Prometheus, PrometheusError
from localrun.render import ROOT, Rendered, RenderError, render

needs_prometheus = pytest.mark.skipif(
    shutil.which("prometheus") is None or shutil.which("promtool") is None,
    reason="prometheus is not installed: run scripts/bootstrap",
)


def _render(*sets: str) -> Rendered:
    return render(
        ROOT / "charts" / "elastic-job",
        [ROOT / "values-examples" / "cpu-smoke.yaml"],
        [*prometheus.LOCAL_VALUES, *sets],
        release="e2e",
        namespace="default",
    )


@pytest.fixture(scope="module")
def rendered() -> Rendered:
    return _render()


@pytest.fixture(scope="module")
def cluster() -> list[dict[str, Any]]:
    return prometheus.render_cluster()


def _pods(r: Rendered, phase: str = "Running") -> list[PodView]:
    """One pod of each rendered StatefulSet, as pod discovery sees it."""
    out = []
    for i, sts in enumerate(r.statefulsets):
        tpl = sts["spec"]["template"]
        out.append(
            PodView(
                name=f"{sts['metadata']['name']}-0",
                namespace="default",
                phase=phase,
                ip=f"198.18.0.{i + 2}",
                labels=tpl["metadata"]["labels"],
                containers=tuple(tpl["spec"]["containers"]),
            )
        )
    return out


def _alerts(groups: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {r.get("alert", r.get("name")): r for g in groups for r in g["rules"]}


def test_the_cluster_charts_podmonitor_is_scraped_every_second_in_every_namespace(
    rendered: Rendered, cluster: list[dict[str, Any]]
) -> None:
    """The release has no PodMonitor of its own (a tenant's); the cluster chart's scrapes
    every namespace, without honorLabels (the series' labels are not target labels)."""
    assert prometheus.scrape_endpoints(rendered.objects) == []
    [ep] = prometheus.scrape_endpoints(cluster)
    assert ep.job == "monitoring/elastic-job-cluster-workers"
    assert (ep.port, ep.path, ep.scheme, ep.interval) == ("metrics", "/metrics", "http", "1s")
    assert ep.honor_labels is False
    assert ep.namespaces == ()  # namespaceSelector: any


def test_targets_are_the_running_worker_pods_on_their_metrics_port_with_podmonitor_labels(
    rendered: Rendered, cluster: list[dict[str, Any]]
) -> None:
    [ep] = prometheus.scrape_endpoints(cluster)
    pods = _pods(rendered)
    worker = next(p for p in pods if "elastic-job-default" in p.name)
    assert prometheus.targets(ep, pods) == [
        {
            "targets": [f"{worker.ip}:9405"],
            "labels": {
                "namespace": "default",
                "pod": worker.name,
                "container": "worker",
                "endpoint": "metrics",
                "job": "monitoring/elastic-job-cluster-workers",
            },
        }
    ]  # the etcd pod is not selected
    other = [PodView(**{**p.__dict__, "namespace": "team-b"}) for p in pods]
    assert [t["labels"]["namespace"] for t in prometheus.targets(ep, other)] == ["team-b"]


@pytest.mark.parametrize(
    "change",
    [
        {"phase": "Succeeded"},
        {"phase": "Failed"},
        {"ip": ""},
        {"namespace": "other"},
        {"containers": ()},
    ],
    ids=["succeeded", "failed", "no-ip", "other-namespace", "no-metrics-port"],
)
def test_a_pod_done_unplaced_elsewhere_or_without_the_port_is_no_target(
    change: dict[str, Any],
) -> None:
    """The release's own PodMonitor (monitoring.podMonitor.enabled): its namespace only."""
    rendered = _render("monitoring.podMonitor.enabled=true")
    [ep] = prometheus.scrape_endpoints(rendered.objects)
    assert (ep.job, ep.namespaces) == ("default/e2e-elastic-job-workers", ("default",))
    pods = [PodView(**{**p.__dict__, **change}) for p in _pods(rendered)]
    assert prometheus.targets(ep, pods) == []


def test_a_users_monitoring_off_with_prometheus_is_refused_in_one_line() -> None:
    """monitoring.enabled=false: no pod would serve metrics, said before the run starts."""
    with pytest.raises(PrometheusError, match=r"no pod serves metrics \(monitoring\.enabled"):
        prometheus.check_metrics_served(_render("monitoring.enabled=false").statefulsets)
    prometheus.check_metrics_served(_render().statefulsets)
    with pytest.raises(RenderError, match=r"set monitoring\.enabled=true too"):
        _render("monitoring.enabled=false", "monitoring.podMonitor.enabled=true")


def test_rules_are_the_cluster_charts_with_the_local_for_and_a_users_set_wins(
    rendered: Rendered, cluster: list[dict[str, Any]]
) -> None:
    assert prometheus.rule_groups(rendered.objects) == []  # a release has none
    alerts = _alerts(prometheus.rule_groups(cluster))
    assert {
        "ElasticJobRendezvousOnGpuNode",
        "ElasticJobWorldSizeBelowMin",
        "ElasticJobRankRestartStorm",
        "ElasticJobRendezvousFlapping",
        "ElasticJobTrainingStalled",
        "ElasticJobRestartsNearlyExhausted",
    } == set(alerts)
    assert alerts["ElasticJobWorldSizeBelowMin"]["for"] == "10s"
    assert "[2m]" in alerts["ElasticJobRankRestartStorm"]["expr"]
    mine = _alerts(
        prometheus.rule_groups(
            prometheus.render_cluster(["prometheusRule.worldSizeBelowMin.for=1m"])
        )
    )
    assert mine["ElasticJobWorldSizeBelowMin"]["for"] == "1m"


@needs_prometheus
def test_promtool_accepts_the_rules_file_and_the_config(
    cluster: list[dict[str, Any]], tmp_path: Path
) -> None:
    rules = tmp_path / "rules.yaml"
    rules.write_text(yaml.safe_dump({"groups": prometheus.rule_groups(cluster)}))
    cfg = tmp_path / "prometheus.yml"
    eps = prometheus.scrape_endpoints(cluster)
    cfg.write_text(yaml.safe_dump(prometheus.config(eps, tmp_path, rules)))
    for argv in (["check", "rules", str(rules)], ["check", "config", str(cfg)]):
        proc = subprocess.run(["promtool", *argv], capture_output=True, text=True, check=False)
        assert proc.returncode == 0, proc.stdout + proc.stderr


@needs_prometheus
def test_prometheus_starts_loads_the_rules_reads_the_targets_file_and_stops(
    rendered: Rendered, cluster: list[dict[str, Any]], tmp_path: Path
) -> None:
    eps = prometheus.scrape_endpoints(cluster)
    prom = Prometheus(tmp_path / "prom", eps, prometheus.rule_groups(cluster))
    prom.start()
    try:
        with urllib.request.urlopen(f"{prom.url}/api/v1/rules", timeout=5) as r:
            groups = json.load(r)["data"]["groups"]
        assert len(_alerts(groups)) == 6
        # Nothing listens there: the target shows up, down.
        pods = [p for p in _pods(rendered) if "elastic-job-default" in p.name]
        prom.update([PodView(**{**pods[0].__dict__, "ip": "127.0.0.1"})])

        def active() -> list[dict[str, Any]]:
            with urllib.request.urlopen(f"{prom.url}/api/v1/targets", timeout=5) as r:
                found: list[dict[str, Any]] = json.load(r)["data"]["activeTargets"]
            return found

        deadline = time.monotonic() + 20
        while not active() and time.monotonic() < deadline:
            time.sleep(0.2)
        [target] = active()
        assert target["labels"]["pod"] == pods[0].name
        assert target["scrapeUrl"] == "http://127.0.0.1:9405/metrics"
    finally:
        prom.stop()
    assert prom.proc is not None and prom.proc.poll() is not None


def test_a_missing_prometheus_binary_says_how_to_install_it(
    cluster: list[dict[str, Any]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    eps = prometheus.scrape_endpoints(cluster)
    with pytest.raises(PrometheusError, match="apt-get install prometheus"):
        Prometheus(tmp_path, eps, [])


def test_no_podmonitor_rendered_says_which_value(tmp_path: Path) -> None:
    with pytest.raises(PrometheusError, match=r"podMonitor\.enabled=true .*--cluster-set"):
        Prometheus(tmp_path, [], [], binary="/bin/true")


def test_prometheus_with_loopback_is_a_usage_error() -> None:
    args = build_parser().parse_args(["run", "-f", __file__, "--prometheus", "--loopback"])
    with pytest.raises(UsageError, match="--prometheus with --loopback"):
        config_from_args(args)
    args = build_parser().parse_args(["run", "-f", __file__, "--prometheus"])
    assert config_from_args(args).prometheus is True


def test_cluster_set_goes_to_the_cluster_chart_and_needs_prometheus() -> None:
    argv = ["run", "-f", __file__, "--cluster-set", "prometheusRule.restartStorm.restarts=2"]
    with pytest.raises(UsageError, match="--cluster-set without --prometheus"):
        config_from_args(build_parser().parse_args(argv))
    cfg = config_from_args(build_parser().parse_args([*argv, "--prometheus"]))
    assert cfg.cluster_sets == ["prometheusRule.restartStorm.restarts=2"]
    assert cfg.sets == []


# -- the kube-state-metrics stand-in -------------------------------------------------------

GPU_NODE = "gke-train-a3-spot-pool-8f3c2a1b-x7k2"  # fixture gke-a3-h100-spot: 8 GPUs
CPU_NODE = "local-system-0"


def _pod_obj(name: str, node: str) -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "namespace": "default",
            "uid": f"uid-{name}",
            "ownerReferences": [{"kind": "StatefulSet", "name": name.rsplit("-", 1)[0]}],
        },
        "spec": {"nodeName": node} if node else {},
        "status": {"podIP": "198.18.0.9", "hostIP": "198.18.0.1"},
    }


def _kubestate() -> KubeState:
    return KubeState(load_nodes(["gke-a3-h100-spot", "local-system-0"]))


def test_kubestate_serves_pod_info_of_placed_pods_and_node_capacity_as_kube_state_metrics() -> None:
    ks = _kubestate()
    ks.update([_pod_obj("e2e-etcd-rendezvous-0", GPU_NODE), _pod_obj("pending-0", "")])
    address = ks.start()
    try:
        with urllib.request.urlopen(f"http://{address}/metrics", timeout=5) as r:
            text = r.read().decode()
    finally:
        ks.stop()
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
    gpu = ("node", GPU_NODE), ("resource", "nvidia_com_gpu"), ("unit", "integer")
    assert samples[("kube_node_status_capacity", tuple(sorted(gpu)))] == 8
    cpu = ("node", CPU_NODE), ("resource", "cpu"), ("unit", "core")
    cores = load_nodes([CPU_NODE])[CPU_NODE]["status"]["capacity"]["cpu"]
    assert samples[("kube_node_status_capacity", tuple(sorted(cpu)))] == float(cores)
    infos = [dict(k[1]) for k in samples if k[0] == "kube_pod_info"]
    assert [(i["pod"], i["node"], i["created_by_kind"]) for i in infos] == [
        ("e2e-etcd-rendezvous-0", GPU_NODE, "StatefulSet")
    ]  # the pod on no node is not there


@needs_prometheus
@pytest.mark.slow
def test_the_rendezvous_on_gpu_node_alert_fires_on_the_stand_ins_series_only_for_etcd(
    tmp_path: Path,
) -> None:
    r = prometheus.render_cluster(["prometheusRule.rendezvousOnGpuNode.for=1s"])
    ks = _kubestate()
    ks.update(
        [
            _pod_obj("e2e-etcd-rendezvous-0", GPU_NODE),
            _pod_obj("e2e-elastic-job-default-0", GPU_NODE),  # a worker belongs there
        ]
    )
    prom = Prometheus(
        tmp_path / "prom",
        prometheus.scrape_endpoints(r),
        prometheus.rule_groups(r),
        static={"kube-state-metrics": ks.start()},
    )
    try:
        prom.start()

        def firing() -> list[dict[str, Any]]:
            with urllib.request.urlopen(f"{prom.url}/api/v1/alerts", timeout=5) as resp:
                alerts: list[dict[str, Any]] = json.load(resp)["data"]["alerts"]
            return [a for a in alerts if a["state"] == "firing"]

        deadline = time.monotonic() + 30
        while not firing() and time.monotonic() < deadline:
            time.sleep(0.5)
        [alert] = firing()
    finally:
        prom.stop()
        ks.stop()
    assert alert["labels"]["alertname"] == "ElasticJobRendezvousOnGpuNode"
    assert alert["labels"]["pod"] == "e2e-etcd-rendezvous-0"
    assert alert["labels"]["node"] == GPU_NODE
    assert float(alert["value"]) == 8


@needs_prometheus
def test_prometheus_dies_with_a_sigkilled_runner(tmp_path: Path) -> None:
    code = (
        "import sys, time\n"
        "from pathlib import Path\n"
        "from localrun import prometheus\n"
        "ep = prometheus.ScrapeEndpoint('default/x', ('default',), {}, 'metrics', '/metrics',"
        " 'http', '1s', True)\n"
        "p = prometheus.Prometheus(Path(sys.argv[1]), [ep], [])\n"
        "p.start()\n"
        "print(p.proc.pid, flush=True)\n"
        "time.sleep(60)\n"
    )
    runner = subprocess.Popen(
        [sys.executable, "-c", code, str(tmp_path)], cwd=ROOT, stdout=subprocess.PIPE, text=True
    )
    assert runner.stdout is not None
    pid = int(runner.stdout.readline())
    assert Path(f"/proc/{pid}").exists()
    runner.kill()
    runner.wait()
    deadline = time.monotonic() + 10
    while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not Path(f"/proc/{pid}").exists()
