"""Faults: the grammar of --kill POD@WHEN[:DOWN], --partition, --scale, --restart-rendezvous,
and what each does to the cluster when it is due."""

from __future__ import annotations

from pathlib import Path

import pytest
from localrun_fakes import Harness, statefulset

from localrun.cli import (
    UsageError,
    build_parser,
    config_from_args,
    normalize_argv,
    parse_node_fault,
    parse_partition,
    parse_pod_fault,
    parse_restart_rendezvous,
    parse_scale,
)
from localrun.faults import Fault, FaultKind, Injector, schedule
from localrun.host.network import LoopbackNetwork


def test_kill_names_a_pod_and_a_time() -> None:
    f = parse_pod_fault(FaultKind.KILL, "demo-elastic-job-default-1@40")
    assert f == Fault(FaultKind.KILL, 40.0, target="demo-elastic-job-default-1")


def test_partition_duration_is_optional() -> None:
    assert parse_partition("w-1@12.5").duration is None
    f = parse_partition("w-1@12.5:20")
    assert (f.target, f.at, f.duration) == ("w-1", 12.5, 20.0)


def test_scale_takes_group_replicas_and_time() -> None:
    f = parse_scale("default=3@30")
    assert (f.kind, f.target, f.replicas, f.at) == (FaultKind.SCALE, "default", 3, 30.0)


def test_restart_rendezvous_accepts_at_sign_and_glued_form() -> None:
    assert parse_restart_rendezvous("@45").at == 45.0
    assert parse_restart_rendezvous("45").at == 45.0
    assert normalize_argv(["run", "--restart-rendezvous@45"]) == [
        "run",
        "--restart-rendezvous",
        "45",
    ]


@pytest.mark.parametrize(
    ("fn", "text"),
    [
        (lambda t: parse_pod_fault(FaultKind.KILL, t), "w-1"),
        (lambda t: parse_pod_fault(FaultKind.KILL, t), "@40"),
        (lambda t: parse_pod_fault(FaultKind.KILL, t), "W_1@40"),
        (parse_partition, "w-1@x"),
        (parse_scale, "default@30"),
        (parse_scale, "default=-1@30"),
        (parse_restart_rendezvous, "soon"),
    ],
)
def test_bad_fault_syntax_says_the_expected_form(fn: object, text: str) -> None:
    with pytest.raises(UsageError, match="expected"):
        fn(text)  # type: ignore[operator]


def test_schedule_orders_by_time() -> None:
    a = Fault(FaultKind.KILL, 30, "a")
    b = Fault(FaultKind.KILL, 10, "b")
    assert schedule([a, b]) == [b, a]


def _cfg(*argv: str) -> object:
    args = build_parser().parse_args(normalize_argv(["run", "-f", __file__, *argv]))
    return config_from_args(args)


def test_command_line_collects_every_fault_kind() -> None:
    cfg = _cfg(
        "--kill",
        "w-1@40:20",
        "--preempt",
        "w-2@50",
        "--partition",
        "w-0@60:10",
        "--scale",
        "default=2@70",
        "--restart-rendezvous@80",
        "--api-fault",
        "^/api/v1/nodes/=403",
        "--backoff",
        "2:8",
    )
    kinds = [f.kind for f in cfg.faults]  # type: ignore[attr-defined]
    assert kinds == [
        FaultKind.KILL,
        FaultKind.PREEMPT,
        FaultKind.PARTITION,
        FaultKind.SCALE,
        FaultKind.RESTART_RENDEZVOUS,
    ]
    kill = cfg.faults[0]  # type: ignore[attr-defined]
    assert (kill.target, kill.at, kill.duration) == ("w-1", 40.0, 20.0)
    assert cfg.api_faults == [("^/api/v1/nodes/", 403)]  # type: ignore[attr-defined]
    assert (cfg.backoff_base, cfg.backoff_cap) == (2.0, 8.0)  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    "argv",
    [("--api-fault", "nodes=200"), ("--api-fault", "403"), ("--backoff", "fast"), ("--kill", "x")],
)
def test_bad_command_line_values_are_refused(argv: tuple[str, ...]) -> None:
    with pytest.raises(UsageError):
        _cfg(*argv)


class LinkRecorder(LoopbackNetwork):
    """The host network as far as faults touch it: the links set up and down."""

    def __init__(self) -> None:
        super().__init__("t", "cluster.local")
        self.links: list[tuple[str, bool]] = []

    def set_link(self, pod: str, up: bool, incarnation: int | None = None) -> None:
        self.links.append((pod, up))


WORKERS = {"app.kubernetes.io/component": "worker", "elastic-job.pytorch.org/group": "default"}
ETCD = {"app.kubernetes.io/component": "rendezvous"}


def _injector(
    tmp_path: Path,
    faults: list[Fault],
    api_scales: bool = True,
    rank: dict[int, str] | None = None,
) -> tuple[Harness, Injector, LinkRecorder, list[tuple[str, str, int]]]:
    h = Harness(
        tmp_path,
        statefulset(replicas=2, name="demo-job-default", labels=WORKERS),
        statefulset(replicas=1, name="demo-etcd", labels=ETCD),
    )
    net = LinkRecorder()
    asked: list[tuple[str, str, int]] = []

    def scale(ns: str, name: str, replicas: int) -> bool:
        asked.append((ns, name, replicas))
        return api_scales

    ranks = rank or {}
    inj = Injector(faults, h.cluster, net, event=h.events.append, scale=scale, rank=ranks.get)
    h.tick(0)
    for pod in ("demo-job-default-0", "demo-job-default-1", "demo-etcd-0"):
        h.runtime.running(pod, "init").rc = 0
    h.tick(0)
    return h, inj, net, asked


def test_a_kill_at_a_step_fires_when_training_reaches_it(tmp_path: Path) -> None:
    kill = Fault(FaultKind.KILL, 0, target="demo-job-default-1", duration=10, at_step=8)
    h, inj, _, _ = _injector(tmp_path, [kill])
    assert inj.due(1, 1, None) == [] and inj.due(2, 2, 7) == []
    assert inj.due(3, 3, 8) == [kill]
    main = [c for c in h.runtime.containers if c.spec.pod == "demo-job-default-1"][-1]
    assert main.spec.container == "main" and main.signals == ["KILL"]
    assert inj.due(4, 4, 9) == []  # once
    h.tick(4)
    h.tick(12.9)
    assert h.pod("demo-job-default-1").phase.value == "CrashLoopBackOff"  # down 10 s
    h.tick(13)
    assert h.pod("demo-job-default-1").restarts == 1


def test_scale_goes_through_the_api_server_by_group_name(tmp_path: Path) -> None:
    scale = Fault(FaultKind.SCALE, 5, target="default", replicas=3)
    h, inj, _, asked = _injector(tmp_path, [scale])
    inj.due(5, 5, None)
    assert asked == [("ns", "demo-job-default", 3)]
    assert h.cluster.sets["demo-job-default"].replicas == 2  # the API server's callback scales


def test_a_scale_at_a_world_size_waits_for_a_step_there_however_long_it_takes(
    tmp_path: Path,
) -> None:
    """`--scale default=2@world=3`: the scale-down after a scale-up fires once a step ran
    at three, not after a number of steps a loaded machine may not give the new pod."""
    down = parse_scale("default=2@world=3")
    assert (down.at_world, down.at_step, down.when()) == (3, None, "world size 3")
    _, inj, _, asked = _injector(tmp_path, [down])
    assert inj.due(1, 100, 40, 2) == [] and inj.due(2, 200, 80, None) == []
    assert inj.due(3, 201, 81, 3) == [down] and asked == [("ns", "demo-job-default", 2)]
    assert inj.due(4, 202, 82, 3) == []  # once


def test_scale_falls_back_to_the_controller_when_the_api_fails(tmp_path: Path) -> None:
    scale = Fault(FaultKind.SCALE, 5, target="default", replicas=1)
    h, inj, _, _ = _injector(tmp_path, [scale], api_scales=False)
    inj.due(5, 5, None)
    assert h.cluster.sets["demo-job-default"].replicas == 1


def test_restart_rendezvous_deletes_only_the_rendezvous_pod(tmp_path: Path) -> None:
    h, inj, _, _ = _injector(tmp_path, [Fault(FaultKind.RESTART_RENDEZVOUS, 1)])
    inj.due(1, 1, None)
    assert h.pod("demo-etcd-0").deleting
    assert not any(h.pod(f"demo-job-default-{n}").deleting for n in range(2))


def test_a_partition_heals_after_its_duration(tmp_path: Path) -> None:
    part = Fault(FaultKind.PARTITION, 1, target="default-0", duration=20)  # a unique suffix
    _, inj, net, _ = _injector(tmp_path, [part])
    inj.due(1, 1, None)
    assert net.links == [("demo-job-default-0", False)]
    assert inj.healed(20.9) == []
    assert inj.healed(21) == ["demo-job-default-0"]
    assert net.links[-1] == ("demo-job-default-0", True)


def test_faults_naming_pods_no_statefulset_makes_are_reported(tmp_path: Path) -> None:
    faults = [
        Fault(FaultKind.KILL, 1, target="demo-job-default-1"),
        Fault(FaultKind.PREEMPT, 1, target="demo-job-default-x"),
        Fault(FaultKind.PARTITION, 1, target="nobody-0"),
    ]
    _, inj, _, _ = _injector(tmp_path, faults)
    assert inj.unknown_pods() == ["demo-job-default-x", "nobody-0"]


def test_node_faults_name_a_node_a_pods_node_or_a_ranks_node() -> None:
    f = parse_node_fault(FaultKind.NODE_DOWN, "local-spot-0@40:120")
    assert (f.target, f.node_of, f.at, f.duration) == ("local-spot-0", "", 40.0, 120.0)
    f = parse_node_fault(FaultKind.NODE_DOWN, "pod:demo-w-1@step=20")
    assert (f.target, f.node_of, f.at_step, f.duration) == ("", "demo-w-1", 20, None)
    f = parse_node_fault(FaultKind.NODE_DOWN, "rank:1@step=20")
    assert f.node_of == "rank:1" and f.describe() == "node-down pod:rank:1"
    f = parse_node_fault(FaultKind.DELETE_NODE, "n1@90")
    assert (f.kind, f.target) == (FaultKind.DELETE_NODE, "n1")
    assert parse_pod_fault(FaultKind.KILL, "rank:2@step=9").target == "rank:2"
    with pytest.raises(UsageError, match="expected NODE@WHEN,"):
        parse_node_fault(FaultKind.DELETE_NODE, "n1@90:30")  # only node-down takes a duration
    with pytest.raises(UsageError, match="expected"):
        parse_node_fault(FaultKind.NODE_DOWN, "Node_1@40")


def test_the_command_line_takes_node_faults_and_the_control_planes_durations() -> None:
    cfg = _cfg(
        "--node-down", "pod:w-1@step=8",
        "--delete-node", "n1@90",
        "--out-of-service", "n2@95",
        "--node-monitor-grace-period", "10",
        "--default-unreachable-toleration-seconds", "20",
    )  # fmt: skip
    kinds = [f.kind for f in cfg.faults]  # type: ignore[attr-defined]
    assert kinds == [FaultKind.NODE_DOWN, FaultKind.DELETE_NODE, FaultKind.OUT_OF_SERVICE]
    timings = cfg.node_timings  # type: ignore[attr-defined]
    assert (timings.grace_period, timings.unreachable_toleration) == (10.0, 20)
    assert (timings.monitor_period, timings.not_ready_toleration) == (5.0, 300)


def test_a_node_down_stops_the_node_of_the_pod_at_a_rank_and_brings_it_back(
    tmp_path: Path,
) -> None:
    down = Fault(FaultKind.NODE_DOWN, 1, node_of="rank:1", duration=30)
    h, inj, _, _ = _injector(tmp_path, [down], rank={1: "demo-job-default-1"})
    node = h.pod("demo-job-default-1").node
    inj.due(1, 1, None)
    assert h.cluster.node_down(node) and not h.cluster.node_down(h.pod("demo-job-default-0").node)
    kill = Fault(FaultKind.KILL, 2, target="demo-job-default-1")
    inj.fire(kill, 2)  # a pod on a node that is down: nothing to signal
    assert "demo-job-default-1's node" in h.events[-1]
    assert inj.nodes_back(30.9) == []
    assert inj.nodes_back(31) == [node] and not h.cluster.node_down(node)


def test_a_rank_nobody_holds_is_said_and_skipped(tmp_path: Path) -> None:
    kill = Fault(FaultKind.KILL, 1, target="rank:5")
    h, inj, _, _ = _injector(tmp_path, [kill])
    assert inj.unknown_pods() == []  # not known before it fires
    inj.due(1, 1, None)
    assert "no pod 'rank:5' exists now" in h.events[-1]
