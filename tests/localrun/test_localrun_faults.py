"""Fault arguments: --kill POD@SECONDS[:DOWN], --partition, --scale, --restart-rendezvous."""

from __future__ import annotations

import pytest

from localrun.cli import (
    UsageError,
    build_parser,
    config_from_args,
    normalize_argv,
    parse_partition,
    parse_pod_fault,
    parse_restart_rendezvous,
    parse_scale,
)
from localrun.faults import Fault, FaultKind, schedule


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
