"""elastic-job: an elastic-job release from a terminal (also `kubectl elastic-job`).

    elastic-job list [-A] [-o wide|json|yaml]
    elastic-job status RELEASE [-o json|yaml]
    elastic-job logs RELEASE (POD | --all | --rank0) [-f] [--previous] [--tail N]
    elastic-job logs RELEASE --save DIR
    elastic-job events RELEASE [-w] [-o json|yaml]
    elastic-job cost RELEASE --prices prices.yaml [-o json|yaml]

-n/--namespace, --context, --kubeconfig (KUBECONFIG: several files, merged) and
--request-timeout as kubectl has them; --version. Exit codes: 0 ok, 1 API error, 2 usage
or no cluster access (a kubeconfig that cannot be read included), 3 no such release,
4 not allowed (RBAC), 5 API server unreachable or not answering within --request-timeout.
"""

from __future__ import annotations

import argparse
import platform
import queue
import sys
import threading
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from elastic_job_cli import joblist, jobstate, logs, output, pricing, timeline
from elastic_job_cli import objects as o
from elastic_job_cli.kube import EXIT_USAGE, CommandError, Kube, connect
from elastic_job_cli.options import DEFAULT_REQUEST_TIMEOUT, Access, DurationError
from elastic_job_cli.options import request_timeout as parse_timeout
from elastic_job_cli.responses import WatchEvent

if TYPE_CHECKING:
    from elastic_job_cli.responses import RawCall

PACKAGE = "elastic-job-cli"


def version() -> str:
    """`elastic-job --version`: the package's version (VERSION, through pyproject), and the
    client and Python it runs on, for a bug report."""
    try:
        mine = metadata.version(PACKAGE)
    except metadata.PackageNotFoundError:
        mine = "unknown (not installed: pip install elastic-job-cli)"
    try:
        kube = metadata.version("kubernetes")
    except metadata.PackageNotFoundError:
        kube = "missing"
    return f"elastic-job {mine} (kubernetes client {kube}, Python {platform.python_version()})"


def _timeout(text: str) -> float | None:
    try:
        return parse_timeout(text)
    except DurationError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _common(p: argparse.ArgumentParser, default: str | None) -> None:
    p.add_argument("-n", "--namespace", default=default, help="namespace (default: the context's)")
    p.add_argument("--context", default=default, help="kubeconfig context")
    p.add_argument(
        "--kubeconfig",
        default=default,
        help="kubeconfig file (default: KUBECONFIG, its files merged, else ~/.kube/config)",
    )
    p.add_argument(
        "--request-timeout",
        type=_timeout,
        default=default,
        metavar="DURATION",
        help="how long to wait for the API server: to connect and for each answer "
        f"(1s, 2m, 3h; 0: for ever; default {DEFAULT_REQUEST_TIMEOUT})",
    )


def _output(p: argparse.ArgumentParser, *extra: str) -> None:
    p.add_argument(
        "-o", "--output", choices=[*output.FORMATS, *extra], default="text",
        help="text (default), " + ", ".join([*extra, *output.FORMATS[1:]]),
    )  # fmt: skip


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="elastic-job", description=__doc__.split("\n")[0])
    p.add_argument("--version", action="version", version=version())
    _common(p, None)
    p.set_defaults(request_timeout=parse_timeout(DEFAULT_REQUEST_TIMEOUT))
    # The same flags after the subcommand, as kubectl takes them anywhere.
    common = argparse.ArgumentParser(add_help=False)
    _common(common, argparse.SUPPRESS)
    sub = p.add_subparsers(dest="command", required=True)

    ls = sub.add_parser("list", parents=[common], help="every job in the namespace, or all")
    ls.add_argument("-A", "--all-namespaces", action="store_true", help="every namespace's jobs")
    _output(ls, "wide")

    s = sub.add_parser("status", parents=[common], help="the job at a glance")
    s.add_argument("release")
    _output(s)

    lg = sub.add_parser("logs", parents=[common], help="a pod's, every pod's or rank 0's logs")
    lg.add_argument("release")
    lg.add_argument("pod", nargs="?", help="one worker pod")
    which = lg.add_mutually_exclusive_group()
    which.add_argument("--all", action="store_true", help="every worker pod, lines prefixed")
    which.add_argument("--rank0", action="store_true", help="the pod that holds group rank 0")
    which.add_argument(
        "--save",
        type=Path,
        metavar="DIR",
        help="keep every container's log until the job completes",
    )
    lg.add_argument("-f", "--follow", action="store_true")
    lg.add_argument("-p", "--previous", action="store_true", help="the previous container's")
    lg.add_argument("--tail", type=int, default=-1, help="last N lines (default: all)")

    e = sub.add_parser("events", parents=[common], help="what happened, in time order")
    e.add_argument("release")
    e.add_argument("-w", "--watch", action="store_true", help="then print new ones as they happen")
    _output(e)

    c = sub.add_parser("cost", parents=[common], help="node-hours, GPU-hours and their price")
    c.add_argument("release")
    c.add_argument(
        "--prices", type=Path, required=True, metavar="FILE", help="prices YAML (README)"
    )
    _output(c)
    return p


def access(args: argparse.Namespace) -> Access:
    return Access(
        kubeconfig=args.kubeconfig,
        context=args.context,
        namespace=args.namespace,
        all_namespaces=bool(getattr(args, "all_namespaces", False)),
        request_timeout=args.request_timeout,
    )


# -- list --------------------------------------------------------------------------------------


def gather_list(kube: Kube, now: datetime) -> list[joblist.JobRow]:
    statefulsets, pods, events = kube.workers()
    rels = joblist.releases(statefulsets, pods)
    read = kube.metrics_of([p for r in rels for p in r.pods])
    return [joblist.row(r, read, events, now) for r in rels]


def run_list(kube: Kube, *, fmt: str, out: TextIO) -> int:
    rows = gather_list(kube, datetime.now(timezone.utc))
    if fmt in ("json", "yaml"):
        out.write(output.dump({"items": [r.as_dict() for r in rows]}, fmt))
        return 0
    if not rows:
        where = "any namespace" if kube.all_namespaces else f"{kube.namespace} namespace"
        print(f"No elastic-job releases found in {where}.", file=sys.stderr)
        return 0
    out.write(joblist.table(rows, all_namespaces=kube.all_namespaces, wide=fmt == "wide"))
    return 0


# -- status ----------------------------------------------------------------------------------


def gather_status(kube: Kube, release: str) -> jobstate.JobView:
    rel = kube.release(release)
    nodes, nodes_note = kube.nodes()
    events = timeline.job_events(kube.events(), rel.names)
    by_uid = kube.metrics_of(rel.pods)
    read = {o.name(p): by_uid[p["metadata"]["uid"]] for p in rel.pods}
    metrics = {pod: m for pod, (m, _) in read.items()}
    note = jobstate.metrics_note(rel.statefulsets, rel.pods, list(read.values()))
    view = jobstate.derive(
        release,
        kube.namespace,
        statefulsets=rel.statefulsets,
        pods=rel.pods,
        nodes=nodes,
        metrics=metrics,
        events=events,
        metrics_note=note,
    )
    if note == "off":
        view.notes.append(
            "metrics off (chart: monitoring.enabled=false): state, rank and step from the API only"
        )
    if nodes_note:
        view.notes.append(nodes_note)
    return view


def _dash(value: object) -> str:
    return "-" if value in (None, "") else str(value)


def print_status(view: jobstate.JobView, out: TextIO) -> None:
    reforms = ""
    if view.reforms is not None:
        last = (
            f" (last {view.last_reform_seconds:g} s)"
            if view.last_reform_seconds is not None
            else ""
        )
        reforms = f", {view.reforms} re-form{'s' if view.reforms != 1 else ''}{last}"
    round_ = f", round {view.round}" if view.round is not None else ""
    step = f", step {view.last_step}" if view.last_step is not None else ""
    out.write(
        f"job {view.release} (namespace {view.namespace}): {view.state}, world size "
        f"{view.world_size} (min {view.min_nodes}, max {view.max_nodes}){round_}{reforms}{step}\n"
    )
    out.write(f"metrics: {view.metrics}\n")
    for note in view.notes:
        out.write(f"note: {note}\n")
    rows = [["GROUP", "REPLICAS", "READY"]]
    rows += [[g, str(v["replicas"]), str(v["ready"])] for g, v in sorted(view.groups.items())]
    _table(rows, out)
    rows = [
        ["POD", "PHASE", "NODE", "CAPACITY", "GPU", "RESTARTS", "STATE", "RANK", "WORLD", "STEP"]
    ]
    for p in view.pods:
        rows.append(
            [p.name, p.phase, _dash(p.node), _dash(p.capacity_type), _dash(p.gpu_model),
             str(p.restarts), _dash(p.state), _dash(p.group_rank), _dash(p.world_size),
             _dash(p.last_step)]
        )  # fmt: skip
    _table(rows, out)


def _table(rows: list[list[str]], out: TextIO) -> None:
    out.write(output.table(rows))


# -- events ------------------------------------------------------------------------------------


def _entry(entry: timeline.Entry, fmt: str) -> str:
    return entry.line() + "\n" if fmt == "text" else output.stream_item(entry.as_dict(), fmt)


def run_events(kube: Kube, release: str, *, watch: bool, fmt: str, out: TextIO) -> int:
    rel = kube.release(release)
    nodes, _ = kube.nodes()
    events = kube.events()
    entries = timeline.merge(rel.pods, nodes, events, rel.names)
    for entry in entries:
        out.write(_entry(entry, fmt))
    out.flush()
    if not watch:
        return 0
    seen = set(entries)
    changes: queue.Queue[tuple[str, WatchEvent] | CommandError] = queue.Queue()
    selector = {"label_selector": o.worker_selector(release)}
    watches: list[tuple[str, RawCall, tuple[str, ...], dict[str, str]]] = [
        ("pods", kube.core.list_namespaced_pod, (kube.namespace,), selector),
        ("events", kube.core.list_namespaced_event, (kube.namespace,), {}),
    ]
    if nodes:
        watches.append(("nodes", kube.core.list_node, (), {}))
    for resource, fn, args, kwargs in watches:
        threading.Thread(
            target=_watch_into,
            args=(kube, resource, fn, args),
            kwargs={"params": kwargs, "changes": changes},
            daemon=True,
        ).start()
    names = set(rel.names)
    try:
        while True:
            item = changes.get()
            if isinstance(item, CommandError):
                raise item
            resource, change = item
            now = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
            obj = change["object"]
            new = timeline.entries_for_change(
                resource, change["type"], obj, seen=seen, names=names, now=now
            )
            for entry in new:
                out.write(_entry(entry, fmt))
            out.flush()
    except KeyboardInterrupt:
        return 0


def _watch_into(
    kube: Kube,
    resource: str,
    fn: RawCall,
    args: tuple[str, ...],
    *,
    params: dict[str, str],
    changes: queue.Queue[tuple[str, WatchEvent] | CommandError],
) -> None:
    """List, then watch from the list's version. The client's Watch starts a new watch
    from the last version seen whenever the server ends one (its timeout): the
    command watches until it is interrupted."""
    kwargs = params
    try:
        listed = kube.json("list", resource, fn, *args, **kwargs)
        version = listed["metadata"].get("resourceVersion", "")
        for change in kube.stream(resource, fn, *args, resource_version=version, **kwargs):
            changes.put((resource, change))
    except CommandError as exc:
        changes.put(exc)


# -- cost --------------------------------------------------------------------------------------


def run_cost(kube: Kube, release: str, prices_path: Path, *, fmt: str, out: TextIO) -> int:
    try:
        text = prices_path.read_text()
    except OSError as exc:
        raise CommandError(f"--prices {prices_path}: {exc.strerror}", EXIT_USAGE) from None
    try:
        prices = pricing.load_prices(text, f"--prices {prices_path}")
    except pricing.PricesError as exc:
        raise CommandError(str(exc), EXIT_USAGE) from None
    rel = kube.release(release)
    nodes, nodes_note = kube.nodes()
    events = timeline.job_events(kube.events(), rel.names)
    by_uid = kube.metrics_of(rel.pods)
    metrics = {o.name(p): by_uid[p["metadata"]["uid"]][0] for p in rel.pods}
    now = datetime.now(timezone.utc)
    spans = pricing.intervals(rel.pods, events, now)
    result = pricing.cost(spans, nodes, prices, pricing.reform_seconds(events, metrics))
    if fmt != "text":
        out.write(output.dump(result.as_dict(), fmt))
        return 0
    cur = f" {prices.currency}" if prices.currency else ""
    rows = [
        ["INSTANCE TYPE", "CAPACITY", "GPUS/NODE", "NODE-HOURS", "GPU-HOURS", "PRICE/H", "COST"]
    ]
    for line in result.lines:
        rows.append(
            [line.instance_type, line.capacity_type, str(line.gpus_per_node),
             f"{line.node_hours:.4f}", f"{line.gpu_hours:.4f}", _dash(line.price_per_hour),
             _dash(line.cost)]
        )  # fmt: skip
    _table(rows, out)
    out.write(
        f"total: {result.total:.4f}{cur} for {result.node_hours:.4f} node-hours, "
        f"{result.gpu_hours:.4f} GPU-hours; lost to re-forms: {result.reform_cost:.4f}{cur} "
        f"({result.reform_share:.1%}, {result.reform_node_hours * 3600:.1f} node-seconds)\n"
    )
    for tag in result.unpriced:
        out.write(f"note: no price for {tag} in {prices_path}: add it under prices\n")
    if nodes_note:
        out.write(f"note: {nodes_note}\n")
    return 0


# -- main --------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    out = sys.stdout
    try:
        if args.command == "logs" and not (args.pod or args.all or args.rank0 or args.save):
            raise CommandError("logs: name a POD, or pass --all, --rank0 or --save DIR", EXIT_USAGE)
        kube = connect(access(args))
        if args.command == "list":
            return run_list(kube, fmt=args.output, out=out)
        if args.command == "status":
            view = gather_status(kube, args.release)
            if args.output == "text":
                print_status(view, out)
            else:
                out.write(output.dump(view.as_dict(), args.output))
            return 0
        if args.command == "logs":
            if args.save:
                return logs.Saver(kube, args.release, args.save).run()
            if args.rank0:
                return logs.follow_rank0(
                    kube, args.release, follow=args.follow, tail=args.tail, out=out
                )
            pod = None if args.all else args.pod
            return logs.show(
                kube,
                args.release,
                pod,
                follow=args.follow,
                previous=args.previous,
                tail=args.tail,
                out=out,
            )
        if args.command == "events":
            return run_events(kube, args.release, watch=args.watch, fmt=args.output, out=out)
        return run_cost(kube, args.release, args.prices, fmt=args.output, out=out)
    except CommandError as exc:
        print(f"elastic-job: {exc}", file=sys.stderr)
        return exc.code
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
