"""`elastic-local run`: the chart's rendered pods on this machine, with faults on demand.

    elastic-local run --chart charts/elastic-job -f values-examples/cpu-smoke.yaml \
        --kill demo-elastic-job-default-1@40:20 --json out/summary.json
"""

from __future__ import annotations

import argparse
import logging
import re
import sys
from pathlib import Path

from localrun.faults import (
    Fault,
    FaultKind,
    FaultSyntaxError,
    normalize_argv,
    parse_partition,
    parse_pod_fault,
    parse_restart_rendezvous,
    parse_scale,
)
from localrun.runner import EXIT_USAGE, RunConfig, Runner

log = logging.getLogger(__name__)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="elastic-local", description=__doc__.split("\n")[0].strip("`"))
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="render the chart and run its pods here")
    r.add_argument("--chart", type=Path, default=Path("charts/elastic-job"))
    r.add_argument("-f", "--values", type=Path, action="append", default=[], help="values file")
    r.add_argument("--set", dest="sets", action="append", default=[], metavar="K=V")
    r.add_argument("--release", default="demo", help="release name (default: demo)")
    r.add_argument("--namespace", default="default")
    r.add_argument("--profile", default="local", help="node profile of localrun/apiserver.py")
    r.add_argument("--cluster-domain", default="cluster.local")
    g = r.add_argument_group("faults (SECONDS after the start)")
    g.add_argument(
        "--kill",
        action="append",
        default=[],
        metavar="POD@SECONDS[:DOWN]",
        help="SIGKILL the pod's container; the kubelet restarts it (not before DOWN seconds)",
    )
    g.add_argument(
        "--preempt",
        action="append",
        default=[],
        metavar="POD@SECONDS[:DOWN]",
        help="spot reclaim: SIGTERM, SIGKILL after the grace period; recreated (after DOWN s)",
    )
    g.add_argument("--partition", action="append", default=[], metavar="POD@SECONDS[:DURATION]")
    g.add_argument("--scale", action="append", default=[], metavar="GROUP=N@SECONDS")
    g.add_argument(
        "--restart-rendezvous",
        action="append",
        default=[],
        metavar="@SECONDS",
        help="also --restart-rendezvous@S",
    )
    g.add_argument(
        "--api-fault",
        action="append",
        default=[],
        metavar="REGEX=STATUS",
        help="the fake API server answers matching paths with STATUS (403, 500, ... or hang)",
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
    r.add_argument("-v", "--verbose", action="store_true")
    return p


_POD_DOWN = re.compile(r"^(.*@(?:step=)?\d+(?:\.\d+)?):(\d+(?:\.\d+)?)$")


def _pod_fault(kind: FaultKind, text: str) -> Fault:
    m = _POD_DOWN.match(text.strip())
    base = parse_pod_fault(kind, m.group(1) if m else text)
    if m:
        return Fault(
            kind, base.at, target=base.target, duration=float(m.group(2)), at_step=base.at_step
        )
    return base


def _api_fault(text: str) -> tuple[str, int | str]:
    regex, sep, status = text.rpartition("=")
    if not sep or not regex:
        raise FaultSyntaxError(
            f"--api-fault {text!r}: expected REGEX=STATUS, e.g. '/api/v1/nodes/=403'"
        )
    if status == "hang":
        return regex, "hang"
    if not status.isdigit() or not 400 <= int(status) <= 599:
        raise FaultSyntaxError(f"--api-fault {text!r}: STATUS is an HTTP error code or 'hang'")
    return regex, int(status)


def config_from_args(args: argparse.Namespace) -> RunConfig:
    faults: list[Fault] = []
    faults += [_pod_fault(FaultKind.KILL, t) for t in args.kill]
    faults += [_pod_fault(FaultKind.PREEMPT, t) for t in args.preempt]
    faults += [parse_partition(t) for t in args.partition]
    faults += [parse_scale(t) for t in args.scale]
    faults += [parse_restart_rendezvous(t) for t in args.restart_rendezvous]
    base, _, cap = args.backoff.partition(":")
    try:
        backoff_base = float(base)
        backoff_cap = float(cap) if cap else max(backoff_base, 300.0)
    except ValueError:
        raise FaultSyntaxError(
            f"--backoff {args.backoff!r}: expected BASE[:CAP] in seconds"
        ) from None
    if not args.values:
        raise FaultSyntaxError(
            "no values file: pass -f values-examples/cpu-smoke.yaml (for example)"
        )
    for v in args.values:
        if not v.exists():
            raise FaultSyntaxError(f"-f {v}: no such file")
    return RunConfig(
        chart=args.chart,
        values=args.values,
        sets=args.sets,
        release=args.release,
        namespace=args.namespace,
        profile=args.profile,
        cluster_domain=args.cluster_domain,
        faults=faults,
        api_faults=[_api_fault(t) for t in args.api_fault],
        json_path=args.json_path,
        output=args.output,
        timeout=args.timeout,
        backoff_base=backoff_base,
        backoff_cap=backoff_cap,
        give_up_after=args.give_up_after,
        live=args.live,
        loopback=args.loopback,
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
    except FaultSyntaxError as exc:
        print(f"elastic-local: {exc}", file=sys.stderr)
        return EXIT_USAGE
    return Runner(cfg).run()


if __name__ == "__main__":
    sys.exit(main())
