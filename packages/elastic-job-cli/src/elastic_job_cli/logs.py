"""`elastic-job logs`: one pod, every pod, rank 0 (followed across re-forms), or every
container's log saved as pods come and go (spot pods vanish with their logs).

Rank 0 is the pod whose worker reports group rank 0 in a round it trains in: from its
metrics when they are on, else from the attempt lines the worker prints
(docs/contracts.md, "The attempt line"), the newest run first.
"""

from __future__ import annotations

import contextlib
import queue
import re
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from elastic_job_cli import jobstate
from elastic_job_cli import objects as o
from elastic_job_cli.kube import CommandError, Kube, body_text
from elastic_job_cli.objects import Obj

if TYPE_CHECKING:
    from urllib3.response import BaseHTTPResponse

POLL = 1.0  # seconds between looks at the job while following

_ATTEMPT = re.compile(
    r"\[elastic-worker\] attempt run_id=\S+ restart=\d+ "
    r"group_rank=(?P<rank>-?\d+) nodes=(?P<nodes>\d+)"
)


@dataclass(frozen=True)
class Rank0:
    pod: str
    uid: str
    restarts: int
    world_size: int | None


def _running(pod: Obj) -> bool:
    return "running" in (o.worker_status(pod).get("state") or {}) and not pod["metadata"].get(
        "deletionTimestamp"
    )


def last_attempt(text: str) -> tuple[int, int] | None:
    """(group rank, nodes) of the last attempt line in a log."""
    found = None
    for m in _ATTEMPT.finditer(text):
        found = (int(m["rank"]), int(m["nodes"]))
    return found


def find_rank0(kube: Kube, pods: list[Obj]) -> Rank0 | None:
    running = [p for p in pods if _running(p)]
    by_metrics: list[tuple[int, Obj, int | None]] = []
    any_metrics = False
    for p in running:
        m, _ = kube.metrics(p)
        if m is None:
            continue
        any_metrics = True
        if jobstate.pod_state(m) == "training" and int(m.get("elastic_job_group_rank", -1)) == 0:
            world = int(m.get("elastic_job_world_size_nodes", 0)) or None
            by_metrics.append((int(m.get("elastic_job_rendezvous_round", 0)), p, world))
    if by_metrics:
        _, p, world = max(by_metrics, key=lambda x: x[0])
        return Rank0(o.name(p), p["metadata"]["uid"], o.restarts(p), world)
    if any_metrics:
        return None  # the metrics say nobody trains now (a re-form, or the gate)
    candidates = []
    for p in running:
        text = kube.text(
            "get", "pods/log", kube.core.read_namespaced_pod_log, o.name(p), kube.namespace,
            container=o.WORKER_CONTAINER, tail_lines=2000,
        )  # fmt: skip
        attempt = last_attempt(text)
        if attempt is not None and attempt[0] == 0:
            started = (
                (o.worker_status(p).get("state") or {}).get("running", {}).get("startedAt", "")
            )
            candidates.append((str(started), p, attempt[1]))
    if not candidates:
        return None
    _, p, nodes = max(candidates, key=lambda x: x[0])
    return Rank0(o.name(p), p["metadata"]["uid"], o.restarts(p), nodes)


class Follower:
    """Streams one container's log (`follow=true`) into a queue or a file, from a thread."""

    def __init__(self, kube: Kube, pod: str, sink: Callable[[str], None], **params: object) -> None:
        self.kube = kube
        self.pod = pod
        self.sink = sink
        self.params = params
        self.done = threading.Event()
        self._resp: BaseHTTPResponse | None = None
        self._thread = threading.Thread(target=self._run, name=f"log-{pod}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self._resp = self.kube.open_stream(
                self.kube.core.read_namespaced_pod_log, self.pod, self.kube.namespace,
                container=o.WORKER_CONTAINER, follow=True, **self.params,
            )  # fmt: skip
            partial = b""
            for chunk in self._resp.stream(4096, decode_content=False):
                lines = (partial + chunk).split(b"\n")
                partial = lines.pop()
                for line in lines:
                    self.sink(line.decode("utf-8", "replace") + "\n")
            if partial:
                self.sink(partial.decode("utf-8", "replace"))
        except Exception:  # noqa: BLE001 - a closed or failed stream ends this follower
            pass
        finally:
            self.done.set()

    def stop(self) -> None:
        if self._resp is not None:
            with contextlib.suppress(Exception):
                self._resp.close()
        self._thread.join(2)


def job_complete(kube: Kube, release: str) -> bool:
    """Every worker StatefulSet scaled to 0 (a finished job scales itself down) or a
    JobCompleted Event on one of them."""
    sts = kube.json(
        "list", "statefulsets.apps", kube.apps.list_namespaced_stateful_set, kube.namespace,
        label_selector=o.worker_selector(release),
    )["items"]  # fmt: skip
    if sts and all(int(s["spec"].get("replicas") or 0) == 0 for s in sts):
        return True
    names = {o.name(s) for s in sts}
    events = kube.events()
    return any(
        e.get("reason") == o.JOB_COMPLETED and (e.get("involvedObject") or {}).get("name") in names
        for e in events
    )


def say(text: str) -> None:
    print(f"elastic-job: {text}", file=sys.stderr, flush=True)


def follow_rank0(kube: Kube, release: str, *, follow: bool, tail: int, out: TextIO) -> int:
    rel = kube.release(release)
    lines: queue.Queue[str] = queue.Queue()
    current: Rank0 | None = None
    follower: Follower | None = None
    waiting_said = False
    if not follow:
        r = find_rank0(kube, rel.pods)
        if r is None:
            raise CommandError(
                f"no pod of {release} trains as rank 0 now (elastic-job status {release})"
            )
        out.write(kube.text("get", "pods/log", kube.core.read_namespaced_pod_log, r.pod,
                            kube.namespace, container=o.WORKER_CONTAINER))  # fmt: skip
        return 0
    while True:
        pods = kube.pods(release, rel.statefulsets)
        r = find_rank0(kube, pods)
        ended = follower is not None and follower.done.is_set()
        same = (
            current is not None
            and r is not None
            and (r.pod, r.uid, r.restarts) == (current.pod, current.uid, current.restarts)
        )
        if r is not None and (not same or ended):
            world = f", world size {r.world_size}" if r.world_size else ""
            if current is None:
                say(f"following rank 0: {r.pod}{world}")
            elif r.pod != current.pod:
                say(f"re-form: rank 0 moved from {current.pod} to {r.pod}{world}")
            elif r.uid != current.uid:
                say(f"re-form: rank 0 moved to {r.pod}'s new pod (made again){world}")
            else:
                say(f"re-form: rank 0 is {r.pod} again (container restart {r.restarts}){world}")
            if follower is not None:
                follower.stop()
            follower = (
                Follower(kube, r.pod, lines.put, tail_lines=tail)
                if tail >= 0
                else Follower(kube, r.pod, lines.put)
            )
            current, waiting_said = r, False
        elif r is None and current is not None and not waiting_said:
            say("no rank 0 now (the job re-forms); waiting for the next round")
            waiting_said = True
        _drain(lines, out)
        if job_complete(kube, release):
            time.sleep(POLL)
            _drain(lines, out)
            say(f"job {release} is complete")
            if follower is not None:
                follower.stop()
            return 0
        time.sleep(POLL)


def _drain(lines: queue.Queue[str], out: TextIO) -> None:
    while True:
        try:
            out.write(lines.get_nowait())
        except queue.Empty:
            break
    out.flush()


def _prefixed(lines: queue.Queue[str], prefix: str) -> Callable[[str], None]:
    return lambda line: lines.put(prefix + line)


def show(
    kube: Kube,
    release: str,
    pod: str | None,
    *,
    follow: bool,
    previous: bool,
    tail: int,
    out: TextIO,
) -> int:
    rel = kube.release(release)
    names = [o.name(p) for p in rel.pods]
    targets = names if pod is None else [pod]
    if pod is not None and pod not in names:
        raise CommandError(
            f"pod {pod!r} is not a worker of {release} (its pods: {', '.join(names) or 'none'})",
            2,
        )
    params: dict[str, object] = {"container": o.WORKER_CONTAINER, "previous": previous}
    if tail >= 0:
        params["tail_lines"] = tail
    if not follow or previous:
        for name in targets:
            text = kube.text(
                "get", "pods/log", kube.core.read_namespaced_pod_log, name, kube.namespace,
                **params,
            )  # fmt: skip
            prefix = f"[{name}] " if pod is None else ""
            for line in text.splitlines(keepends=True):
                out.write(prefix + line)
        out.flush()
        return 0
    lines: queue.Queue[str] = queue.Queue()
    follow_params = {"tail_lines": tail} if tail >= 0 else {}
    followers = [
        Follower(kube, n, _prefixed(lines, f"[{n}] " if pod is None else ""), **follow_params)
        for n in targets
    ]
    while not all(f.done.is_set() for f in followers):
        _drain(lines, out)
        time.sleep(0.2)
    _drain(lines, out)
    return 0


# -- save ----------------------------------------------------------------------------------


class Saver:
    """Every run of every worker container: DIR/<pod>/<container>-<uid8>-<restart>.log,
    streamed while it runs; a run that ended before it was seen whole is fetched again
    with `previous=true` (the kubelet keeps the one before the current)."""

    def __init__(self, kube: Kube, release: str, directory: Path) -> None:
        self.kube = kube
        self.release = release
        self.dir = directory
        self.followers: dict[tuple[str, int], Follower] = {}
        self.complete_runs: set[tuple[str, int]] = set()
        self.files: set[Path] = set()
        self.pods_seen: set[str] = set()

    def path(self, pod: Obj, restart: int) -> Path:
        p = (
            self.dir
            / o.name(pod)
            / f"{o.WORKER_CONTAINER}-{pod['metadata']['uid'][:8]}-{restart}.log"
        )
        p.parent.mkdir(parents=True, exist_ok=True)
        self.files.add(p)
        return p

    def sync(self, pods: list[Obj]) -> None:
        for pod in pods:
            uid = pod["metadata"]["uid"]
            restarts = o.restarts(pod)
            self.pods_seen.add(o.name(pod))
            if _running(pod) and (uid, restarts) not in self.followers:
                fh = self.path(pod, restarts).open("w")

                def sink(line: str, fh: TextIO = fh) -> None:
                    fh.write(line)
                    fh.flush()

                self.followers[(uid, restarts)] = Follower(self.kube, o.name(pod), sink)
            previous = restarts - 1
            if previous >= 0 and (uid, previous) not in self.complete_runs:
                self._previous(pod, previous)

    def _previous(self, pod: Obj, restart: int) -> None:
        uid = pod["metadata"]["uid"]
        old = self.followers.pop((uid, restart), None)
        if old is not None:
            old.stop()
        try:
            text = body_text(
                self.kube.core.read_namespaced_pod_log(
                    o.name(pod),
                    self.kube.namespace,
                    container=o.WORKER_CONTAINER,
                    previous=True,
                    _request_timeout=self.kube.request_timeout,
                    _preload_content=False,
                )
            )
        except Exception:  # noqa: BLE001 - not kept (yet): try again next time
            return
        self.path(pod, restart).write_text(text)
        self.complete_runs.add((uid, restart))

    def run(self) -> int:
        rel = self.kube.release(self.release)
        say(f"saving the logs of {self.release}'s workers to {self.dir} until the job completes")
        try:
            return self._loop(rel.statefulsets)
        except CommandError as exc:
            for f in self.followers.values():
                f.stop()
            raise CommandError(
                f"{exc} (before the job was seen complete; {len(self.files)} logs of "
                f"{len(self.pods_seen)} pods are in {self.dir})",
                exc.code,
            ) from None

    def _loop(self, statefulsets: list[Obj]) -> int:
        while True:
            self.sync(self.kube.pods(self.release, statefulsets))
            if job_complete(self.kube, self.release):
                time.sleep(POLL)
                with contextlib.suppress(CommandError):
                    self.sync(self.kube.pods(self.release, statefulsets))
                for f in self.followers.values():
                    f.done.wait(3)
                    f.stop()
                say(
                    f"job {self.release} is complete: {len(self.files)} logs of "
                    f"{len(self.pods_seen)} pods in {self.dir}"
                )
                return 0
            time.sleep(POLL)
