"""`elastic-local run`: the chart's rendered pods on this machine, with faults on demand.

    elastic-local run --chart charts/elastic-job -f values-examples/cpu-smoke.yaml \\
        --kill demo-elastic-job-default-1@40:20 --json out/summary.json

The command line and the fault grammar, in one place: everything a user types is parsed
here, into one RunConfig, and every mistake ends in one line that names the value and
the expected form (exit 2).
"""

from __future__ import annotations

import argparse
import logging
import re
import sys
from pathlib import Path
from typing import Any

from localrun.cluster.apiserver import Fault as ApiFault
from localrun.cluster.nodelifecycle import NodeTimings
from localrun.faults import Fault, FaultKind
from localrun.run import EXIT_USAGE, RunConfig, Runner

log = logging.getLogger(__name__)


class UsageError(ValueError):
    """A command-line value that cannot be used; the message says the expected form."""


# -- the fault grammar ---------------------------------------------------------------------
# WHEN is seconds after the start (`12.5`), `step=N` (when training reaches step N) or
# `world=N` (when a training step runs at world size N).

_SECONDS = r"(\d+(?:\.\d+)?)"
_WHEN = r"(\d+(?:\.\d+)?|step=\d+|world=\d+)"
_NAME = r"([a-z0-9](?:[-a-z0-9.]*[a-z0-9])?)"
_POD = r"(rank:\d+|[a-z0-9](?:[-a-z0-9.]*[a-z0-9])?)"  # a pod name, or rank:N
_POD_AT = re.compile(rf"^{_POD}@{_WHEN}(?::{_SECONDS})?$")
_NODE_AT = re.compile(rf"^(pod:)?{_POD}@{_WHEN}(?::{_SECONDS})?$")
_SCALE = re.compile(rf"^{_NAME}=(\d+)@{_WHEN}$")
_AT = re.compile(rf"^@?{_WHEN}$")
_FORMS = {
    FaultKind.KILL: "POD@WHEN[:DOWN], e.g. demo-w-1@40, demo-w-1@step=20:15 or rank:1@world=3",
    FaultKind.PREEMPT: "POD@WHEN[:DOWN], e.g. demo-w-1@40 or rank:1@step=20:15",
    FaultKind.PARTITION: "POD@WHEN[:DURATION], e.g. demo-w-1@40:20 or rank:1@step=20:20",
    FaultKind.NODE_DOWN: "NODE@WHEN[:DURATION], e.g. local-spot-0@40:120, pod:demo-w-1@step=20 "
    "or rank:1@step=20",
    FaultKind.DELETE_NODE: "NODE@WHEN, e.g. local-spot-0@90 or pod:demo-w-1@90",
    FaultKind.OUT_OF_SERVICE: "NODE@WHEN, e.g. local-spot-0@90 or pod:demo-w-1@90",
}


def _when(text: str) -> dict[str, Any]:
    """The Fault fields of a WHEN: `at` seconds, `at_step` for `step=N`, `at_world` for
    `world=N`."""
    if text.startswith("step="):
        return {"at": 0.0, "at_step": int(text[5:])}
    if text.startswith("world="):
        return {"at": 0.0, "at_world": int(text[6:])}
    return {"at": float(text)}


def parse_pod_fault(kind: FaultKind, text: str) -> Fault:
    """`POD@WHEN[:DOWN]` for --kill and --preempt, `POD@WHEN[:DURATION]` for --partition."""
    m = _POD_AT.match(text.strip())
    if not m:
        raise UsageError(f"--{kind.value} {text!r}: expected {_FORMS[kind]}")
    duration = float(m.group(3)) if m.group(3) is not None else None
    return Fault(kind, target=m.group(1), duration=duration, **_when(m.group(2)))


def parse_partition(text: str) -> Fault:
    return parse_pod_fault(FaultKind.PARTITION, text)


def parse_node_fault(kind: FaultKind, text: str) -> Fault:
    """`NODE@WHEN[:DURATION]` for --node-down (no DURATION: down for good), `NODE@WHEN` for
    --delete-node and --out-of-service; NODE is a node of the profile, or `pod:POD` (or
    `rank:N`) for the node that pod (the pod at group rank N) runs on when it fires."""
    m = _NODE_AT.match(text.strip())
    if not m or (m.group(4) is not None and kind is not FaultKind.NODE_DOWN):
        raise UsageError(f"--{kind.value} {text!r}: expected {_FORMS[kind]}")
    when = _when(m.group(3))
    duration = float(m.group(4)) if m.group(4) is not None else None
    name = m.group(2)
    if m.group(1) or name.startswith("rank:"):
        return Fault(kind, target="", duration=duration, node_of=name, **when)
    return Fault(kind, target=name, duration=duration, **when)


def parse_scale(text: str) -> Fault:
    """`GROUP=N@WHEN`; GROUP is a worker group name or a StatefulSet name."""
    m = _SCALE.match(text.strip())
    if not m:
        raise UsageError(
            f"--scale {text!r}: expected GROUP=N@WHEN, e.g. workers=3@30 or workers=2@world=3"
        )
    when = _when(m.group(3))
    return Fault(FaultKind.SCALE, target=m.group(1), replicas=int(m.group(2)), **when)


def parse_restart_rendezvous(text: str) -> Fault:
    """`WHEN` (also accepted with a leading `@`)."""
    m = _AT.match(text.strip())
    if not m:
        raise UsageError(f"--restart-rendezvous {text!r}: expected @WHEN, e.g. @45")
    return Fault(FaultKind.RESTART_RENDEZVOUS, **_when(m.group(1)))


def parse_api_fault(text: str) -> tuple[str, ApiFault]:
    """`REGEX=STATUS`: STATUS an HTTP error code or `hang`."""
    regex, sep, status = text.rpartition("=")
    if not sep or not regex:
        raise UsageError(f"--api-fault {text!r}: expected REGEX=STATUS, e.g. '/api/v1/nodes/=403'")
    if status == "hang":
        return regex, "hang"
    if not status.isdigit() or not 400 <= int(status) <= 599:
        raise UsageError(f"--api-fault {text!r}: STATUS is an HTTP error code or 'hang'")
    return regex, int(status)


def normalize_argv(argv: list[str]) -> list[str]:
    """Split `--restart-rendezvous@45` into `--restart-rendezvous 45` for argparse."""
    out: list[str] = []
    for arg in argv:
        if arg.startswith("--restart-rendezvous@"):
            out += ["--restart-rendezvous", arg.split("@", 1)[1]]
        else:
            out.append(arg)
    return out


# -- the command line ----------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="elastic-local", description=__doc__.split("\n")[0].strip("`"))
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="render the chart and run its pods here")
    r.add_argument("--chart", type=Path, default=Path("charts/elastic-job"))
    r.add_argument("-f", "--values", type=Path, action="append", default=[], help="values file")
    r.add_argument("--set", dest="sets", action="append", default=[], metavar="K=V")
    r.add_argument("--release", default="demo", help="release name (default: demo)")
    r.add_argument("--namespace", default="default")
    r.add_argument("--profile", default="local", help="node profile of localrun/cluster/nodes.py")
    r.add_argument("--cluster-domain", default="cluster.local")
    g = r.add_argument_group("faults (WHEN: seconds after the start, or step=N)")
    g.add_argument(
        "--kill",
        action="append",
        default=[],
        metavar="POD@WHEN[:DOWN]",
        help="SIGKILL the pod's container; the kubelet restarts it (not before DOWN seconds)",
    )
    g.add_argument(
        "--preempt",
        action="append",
        default=[],
        metavar="POD@WHEN[:DOWN]",
        help="spot reclaim: SIGTERM, SIGKILL after the grace period; recreated (after DOWN s)",
    )
    g.add_argument("--partition", action="append", default=[], metavar="POD@WHEN[:DURATION]")
    g.add_argument("--scale", action="append", default=[], metavar="GROUP=N@WHEN")
    g.add_argument(
        "--restart-rendezvous",
        action="append",
        default=[],
        metavar="@WHEN",
        help="also --restart-rendezvous@WHEN",
    )
    g.add_argument(
        "--node-down",
        action="append",
        default=[],
        metavar="NODE@WHEN[:DURATION]",
        help="the node's kubelet stops: its pods frozen and cut off, no status (back after "
        "DURATION s, else down for good); NODE may be pod:POD, that pod's node",
    )
    g.add_argument(
        "--delete-node",
        action="append",
        default=[],
        metavar="NODE@WHEN",
        help="the Node object deleted (its instance gone): pod GC force-deletes its pods",
    )
    g.add_argument(
        "--out-of-service",
        action="append",
        default=[],
        metavar="NODE@WHEN",
        help="an administrator's node.kubernetes.io/out-of-service:NoExecute taint",
    )
    g.add_argument(
        "--api-fault",
        action="append",
        default=[],
        metavar="REGEX=STATUS",
        help="the fake API server answers matching paths with STATUS (403, 500, ... or hang)",
    )
    n = r.add_argument_group("the control plane's node lifecycle (seconds; Kubernetes' defaults)")
    n.add_argument(
        "--node-monitor-grace-period",
        type=_seconds,
        default=NodeTimings.grace_period,
        metavar="S",
        help="silence before a node is NotReady (kube-controller-manager; 50, 40 before 1.32)",
    )
    n.add_argument(
        "--node-monitor-period",
        type=_seconds,
        default=NodeTimings.monitor_period,
        metavar="S",
        help="how often the node lifecycle controller looks (kube-controller-manager; 5)",
    )
    n.add_argument(
        "--default-not-ready-toleration-seconds",
        type=int,
        default=NodeTimings.not_ready_toleration,
        metavar="S",
        help="the toleration admission adds to pods without one (kube-apiserver; 300)",
    )
    n.add_argument(
        "--default-unreachable-toleration-seconds",
        type=int,
        default=NodeTimings.unreachable_toleration,
        metavar="S",
        help="the same for unreachable (kube-apiserver; 300)",
    )
    r.add_argument("--json", dest="json_path", type=Path, help="write the run summary here")
    r.add_argument("--output", type=Path, help="logs directory (default out/elastic-local/<time>)")
    r.add_argument("--timeout", type=float, default=1800.0, help="give up after this many seconds")
    r.add_argument(
        "--backoff",
        default="10:300",
        metavar="BASE[:CAP]",
        help="container restart back-off in seconds (kubelet: 10:300)",
    )
    r.add_argument(
        "--give-up-after",
        type=int,
        default=5,
        metavar="N",
        help="end the run when every worker pod failed N times in a row (0: never)",
    )
    view = r.add_mutually_exclusive_group()
    view.add_argument("--live", dest="live", action="store_true", default=None, help="live view")
    view.add_argument("--plain", dest="live", action="store_false", help="plain lines")
    r.add_argument("--loopback", action="store_true", help="no namespaces even as root")
    r.add_argument(
        "--linger",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="keep the API server (<output>/kubeconfig) up this long after the end",
    )
    r.add_argument(
        "--prometheus",
        action="store_true",
        help="run Debian's prometheus on the pods' metrics with the alert rules of "
        "charts/elastic-job-cluster (turns monitoring.enabled on; needs namespaces)",
    )
    r.add_argument(
        "--cluster-set",
        dest="cluster_sets",
        action="append",
        default=[],
        metavar="K=V",
        help="with --prometheus: a value of charts/elastic-job-cluster (its alerts' "
        "thresholds, e.g. prometheusRule.restartStorm.restarts=2)",
    )
    r.add_argument(
        "--image",
        dest="images",
        action="append",
        default=[],
        metavar="NAME=VENV",
        help="containers whose image is NAME (a whole reference or its repository) run "
        "from the Python environment VENV (VENV/bin first on PATH) instead of the "
        "project's: a user's own training image (worker.entrypoint=injected)",
    )
    r.add_argument("-v", "--verbose", action="store_true")
    return p


def parse_image(text: str) -> tuple[str, Path]:
    name, sep, venv = text.partition("=")
    if not (sep and name and venv):
        raise UsageError(f"--image {text!r}: expected NAME=VENV (an image reference, a venv)")
    path = Path(venv).resolve()
    if not (path / "bin" / "python").exists():
        raise UsageError(
            f"--image {text!r}: {path}/bin/python does not exist: VENV is a Python "
            "environment (python3 -m venv VENV; VENV/bin/pip install torch==2.13.0)"
        )
    return name, path


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a number of seconds above 0")
    return value


def _backoff(text: str) -> tuple[float, float]:
    base, _, cap = text.partition(":")
    try:
        backoff_base = float(base)
        return backoff_base, float(cap) if cap else max(backoff_base, 300.0)
    except ValueError:
        raise UsageError(f"--backoff {text!r}: expected BASE[:CAP] in seconds") from None


def config_from_args(args: argparse.Namespace) -> RunConfig:
    faults = [parse_pod_fault(FaultKind.KILL, t) for t in args.kill]
    faults += [parse_pod_fault(FaultKind.PREEMPT, t) for t in args.preempt]
    faults += [parse_partition(t) for t in args.partition]
    faults += [parse_scale(t) for t in args.scale]
    faults += [parse_restart_rendezvous(t) for t in args.restart_rendezvous]
    faults += [parse_node_fault(FaultKind.NODE_DOWN, t) for t in args.node_down]
    faults += [parse_node_fault(FaultKind.DELETE_NODE, t) for t in args.delete_node]
    faults += [parse_node_fault(FaultKind.OUT_OF_SERVICE, t) for t in args.out_of_service]
    backoff_base, backoff_cap = _backoff(args.backoff)
    if args.prometheus and args.loopback:
        raise UsageError(
            "--prometheus with --loopback: every pod would serve its metrics on this "
            "machine's one port; drop --loopback (run as root)"
        )
    if args.cluster_sets and not args.prometheus:
        raise UsageError(
            "--cluster-set without --prometheus: the cluster chart is rendered "
            "only for Prometheus; add --prometheus"
        )
    if not args.values:
        raise UsageError("no values file: pass -f values-examples/cpu-smoke.yaml (for example)")
    for v in args.values:
        if not v.exists():
            raise UsageError(f"-f {v}: no such file")
    return RunConfig(
        chart=args.chart,
        values=args.values,
        sets=args.sets,
        release=args.release,
        namespace=args.namespace,
        profile=args.profile,
        cluster_domain=args.cluster_domain,
        faults=faults,
        api_faults=[parse_api_fault(t) for t in args.api_fault],
        json_path=args.json_path,
        output=args.output,
        timeout=args.timeout,
        backoff_base=backoff_base,
        backoff_cap=backoff_cap,
        give_up_after=args.give_up_after,
        live=args.live,
        loopback=args.loopback,
        linger=args.linger,
        prometheus=args.prometheus,
        cluster_sets=args.cluster_sets,
        images=dict(parse_image(t) for t in args.images),
        node_timings=NodeTimings(
            monitor_period=args.node_monitor_period,
            grace_period=args.node_monitor_grace_period,
            not_ready_toleration=args.default_not_ready_toleration_seconds,
            unreachable_toleration=args.default_unreachable_toleration_seconds,
        ),
    )


def main(argv: list[str] | None = None) -> int:
    argv = normalize_argv(list(sys.argv[1:] if argv is None else argv))
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.WARNING,
        format="elastic-local: %(levelname)s %(name)s: %(message)s",
    )
    try:
        cfg = config_from_args(args)
    except UsageError as exc:
        print(f"elastic-local: {exc}", file=sys.stderr)
        return EXIT_USAGE
    return Runner(cfg).run()


if __name__ == "__main__":
    sys.exit(main())
