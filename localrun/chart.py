"""Everything the local run knows about the elastic-job chart and its images; the
mini-cluster (cluster/) and the host layer (host/) know none of it.

- which rendered StatefulSets are worker groups and which the rendezvous (labels);
- what the project's images are here (the checkout's venv; the worker image's examples, the
  init-topology image's injected-worker bundle at their paths), and the images `--image`
  maps to other environments (a user's own training image: its venv, nothing of ours);
- where the job's completion marker is (the etcd client port, the key, ELASTIC_JOB_ID);
- the lines the pods print: the worker's attempt line (one per attempt torchrun starts,
  docs/contracts.md), the reference script's optional `[train]` lines, the worker's own
  `elastic-worker:` lines. `parse_line` is the one parser of all of them.
"""

from __future__ import annotations

import base64
import http.client
import importlib.util
import json
import re
import ssl
import sys
import urllib.parse
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from localrun.cluster.images import HostImage, Images
from localrun.cluster.runtime import BindMount

Obj = dict[str, Any]

COMPONENT = "app.kubernetes.io/component"
GROUP = "elastic-job.pytorch.org/group"
RENDEZVOUS = "rendezvous"
WORKER = "worker"

#: The worker image's examples (train.py), from the checkout.
IMAGE_EXAMPLES = "/opt/elastic-worker/examples"
EXAMPLES_SOURCE = Path("images") / "worker" / "examples"
#: The injected worker (worker.entrypoint=injected): the init container that copies it, and
#: where the init-topology image it runs holds the bundle (images/init-topology/Dockerfile).
INJECT_CONTAINER = "inject-worker"
BUNDLE_IMAGE_PATH = "/opt/elastic-worker-bundle"
BUNDLE_BUILDER = Path("images") / "worker" / "bundle" / "build.py"

#: The worker's job id (the chart's `job.id`, else derived from release and namespace).
JOB_ID_ENV = "ELASTIC_JOB_ID"
RDZV_BACKEND_ENV = "ELASTIC_RDZV_BACKEND"
#: etcd's client port: the rendezvous container's port of this name, else the default.
CLIENT_PORT_NAME = "client"
DEFAULT_CLIENT_PORT = 2379


# -- roles -------------------------------------------------------------------------------


def is_rendezvous(labels: Mapping[str, str]) -> bool:
    return labels.get(COMPONENT) == RENDEZVOUS


def is_worker(labels: Mapping[str, str]) -> bool:
    return not is_rendezvous(labels) and (labels.get(COMPONENT) == WORKER or GROUP in labels)


def group(name: str, labels: Mapping[str, str]) -> str:
    """The worker group a StatefulSet runs (its name when it has no group label)."""
    return labels.get(GROUP, name)


def find_statefulset(sets: Iterable[tuple[str, Mapping[str, str]]], target: str) -> str | None:
    """The StatefulSet `--scale TARGET=N` means: a StatefulSet name, a worker group, or a
    unique name suffix."""
    items = list(sets)
    if any(name == target for name, _ in items):
        return target
    groups = [n for n, labels in items if is_worker(labels) and group(n, labels) == target]
    if len(groups) == 1:
        return groups[0]
    suffix = [n for n, _ in items if n.endswith("-" + target)]
    return suffix[0] if len(suffix) == 1 else None


def service_account(statefulsets: Iterable[Obj]) -> str:
    """The identity of the fake API server's token: the first pod template's account (the
    chart gives the workers theirs; the fake has one identity)."""
    for sts in statefulsets:
        name = sts["spec"]["template"]["spec"].get("serviceAccountName")
        if name:
            return str(name)
    return "default"


def images(
    root: Path,
    statefulsets: Iterable[Obj],
    ours_path: list[str],
    mapped: Mapping[str, Path],
    system_path: str,
) -> Images:
    """What each image of the run is on this machine. The project's own (the worker and
    init-topology images, and any image not named) run from `ours_path` (the checkout's
    venv) with the worker image's examples at their path; the image the inject-worker init
    container runs (init-topology's) holds the bundle there too, built from the checkout
    (cached) when a pod injects it. An image `mapped` names (`--image NAME=VENV`) runs from
    that environment, VENV/bin first on PATH, and holds nothing of the project's. (The
    init-topology image holds no examples: the worker image does.)"""
    examples = root / EXAMPLES_SOURCE
    shown = (BindMount(str(examples), IMAGE_EXAMPLES, True),) if examples.is_dir() else ()
    ours = HostImage({"PATH": ":".join(ours_path)}, shown)
    named: dict[str, HostImage] = {}
    for c in _init_containers(statefulsets, INJECT_CONTAINER):
        bundle = BindMount(str(worker_bundle(root)), BUNDLE_IMAGE_PATH, True)
        named[str(c.get("image", ""))] = HostImage(ours.env, (bundle,))
    for name, venv in mapped.items():
        named[name] = HostImage({"PATH": f"{venv / 'bin'}:{system_path}"})
    return Images(ours, named)


def _init_containers(statefulsets: Iterable[Obj], name: str) -> list[Obj]:
    return [
        c
        for sts in statefulsets
        for c in sts["spec"]["template"]["spec"].get("initContainers") or []
        if c.get("name") == name
    ]


def worker_bundle(root: Path) -> Path:
    """The injected worker's bundle of this checkout, as the init-topology image's build
    makes it (images/worker/bundle/build.py), built once per content."""
    spec = importlib.util.spec_from_file_location(
        "elastic_worker_bundle_build", root / BUNDLE_BUILDER
    )
    assert spec is not None and spec.loader is not None
    builder = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(builder)
    path: Path = builder.cached(sys.executable)
    return path


# -- completion --------------------------------------------------------------------------


def job_id(env: Mapping[str, str]) -> str:
    return env.get(JOB_ID_ENV, "")


def rdzv_backend(env: Mapping[str, str]) -> str:
    """The worker's rendezvous backend: the etcd API its keys (the marker) are on."""
    return env.get(RDZV_BACKEND_ENV) or "etcd-v2"


def client_port(pod_spec: Obj) -> int:
    for c in pod_spec.get("containers") or []:
        for p in c.get("ports") or []:
            if p.get("name") == CLIENT_PORT_NAME:
                return int(p["containerPort"])
    return DEFAULT_CLIENT_PORT


@dataclass(frozen=True)
class Endpoint:
    """How etcd serves its clients, from the rendezvous container's own flags: the scheme
    of --listen-client-urls, and the host of --advertise-client-urls (the name its
    certificate covers; the run connects to the pod's IP and checks that name)."""

    scheme: str = "http"
    server_name: str = ""


def client_endpoint(pod_spec: Obj) -> Endpoint:
    flags: dict[str, str] = {}
    for c in pod_spec.get("containers") or []:
        for arg in [*(c.get("command") or []), *(c.get("args") or [])]:
            key, sep, value = str(arg).partition("=")
            if sep and key in ("--listen-client-urls", "--advertise-client-urls"):
                flags[key] = value.split(",")[0]
    listen = urllib.parse.urlsplit(flags.get("--listen-client-urls", "http://"))
    advertise = urllib.parse.urlsplit(flags.get("--advertise-client-urls", ""))
    return Endpoint(listen.scheme or "http", advertise.hostname or "")


@dataclass(frozen=True)
class ClientTls:
    """The run's own credentials for an etcd serving https: the cluster CA, and a client
    certificate it signed (sent when etcd asks for one)."""

    ca: Path
    cert: Path
    key: Path

    def context(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=str(self.ca))
        ctx.load_cert_chain(str(self.cert), str(self.key))
        return ctx


@dataclass(frozen=True)
class Marker:
    """Where the worker's completion marker (elastic_worker.completion) is read: on
    etcd-v2 a GET of the v2 key, on etcd-v3 a range request for the key through the v3
    gateway (the API the worker wrote it with: etcd keeps the two stores apart)."""

    url: str
    v3_key: str | None = None


def completion_url(
    ip: str, port: int, job: str, scheme: str = "http", backend: str = "etcd-v2"
) -> Marker:
    key = f"/elastic-job/{job}/complete"
    if backend == "etcd-v3":
        return Marker(f"{scheme}://{ip}:{port}/v3/kv/range", key)
    return Marker(f"{scheme}://{ip}:{port}/v2/keys{key}")


class _NamedHttps(http.client.HTTPSConnection):
    """HTTPS to an address, checking the certificate against another name (the Service
    name the pod answers for)."""

    def __init__(self, host: str, port: int | None, name: str, **kw: Any) -> None:
        super().__init__(host, port, **kw)
        self._name = name

    def connect(self) -> None:
        http.client.HTTPConnection.connect(self)
        self.sock = self._context.wrap_socket(self.sock, server_hostname=self._name)  # type: ignore[attr-defined]


def read_completion(
    marker: Marker, timeout: float = 2.0, tls: ClientTls | None = None, server_name: str = ""
) -> bool | None:
    """True: the job is complete; False: not yet; None: etcd did not answer (or its
    certificate did not verify)."""
    parts = urllib.parse.urlsplit(marker.url)
    host, port = parts.hostname or "", parts.port
    try:
        if parts.scheme == "https":
            if tls is None:
                return None
            ctx = tls.context()
            conn: http.client.HTTPConnection = _NamedHttps(
                host, port, server_name or host, timeout=timeout, context=ctx
            )
        else:
            conn = http.client.HTTPConnection(host, port, timeout=timeout)
        try:
            if marker.v3_key is None:
                conn.request("GET", parts.path)
                status = conn.getresponse().status
            else:
                key = base64.b64encode(marker.v3_key.encode()).decode()
                conn.request("POST", parts.path, json.dumps({"key": key}))
                resp = conn.getresponse()
                status, body = resp.status, resp.read()
        finally:
            conn.close()
    except (OSError, http.client.HTTPException):
        return None
    if marker.v3_key is not None:
        try:
            return bool(json.loads(body).get("kvs")) if status == 200 else None
        except ValueError:
            return None
    if status == 200:
        return True
    return False if status == 404 else None


# -- TLS Secrets a user brings -------------------------------------------------------------

#: Where the charts mount the TLS Secrets a user may bring instead of cert-manager's
#: (etcd-rendezvous `tls.existingSecret`, elastic-job `rendezvous.tls.caSecret` and
#: `clientCertSecret`): etcd's server certificate, and the workers' CA and client cert.
SERVER_TLS_MOUNT = "/etc/etcd/tls"
CLIENT_TLS_MOUNTS = ("/etc/elastic-job/rendezvous-ca", "/etc/elastic-job/rendezvous-client")


def brought_certificates(statefulsets: Iterable[Obj], present: set[str]) -> list[Obj]:
    """Certificates for the run's cert-manager standing in for the TLS Secrets the pods
    mount that nothing renders or issues (`present`): the server's names are the host of
    etcd's --advertise-client-urls plus localhost; a CA-only or client Secret becomes a
    client certificate (it carries ca.crt). One Secret named for both is the server's."""
    wanted: dict[str, list[str]] = {}
    for sts in statefulsets:
        spec = sts["spec"]["template"]["spec"]
        secrets = {
            v["name"]: v["secret"]["secretName"]
            for v in spec.get("volumes") or []
            if "secret" in v and v["secret"].get("secretName")
        }
        for c in spec.get("containers") or []:
            for m in c.get("volumeMounts") or []:
                name = secrets.get(m.get("name", ""))
                if not name or name in present:
                    continue
                if m.get("mountPath") == SERVER_TLS_MOUNT:
                    host = client_endpoint(spec).server_name
                    wanted[name] = [host, "localhost"] if host else ["localhost"]
                elif m.get("mountPath") in CLIENT_TLS_MOUNTS:
                    wanted.setdefault(name, [])
    return [
        {
            "apiVersion": "cert-manager.io/v1",
            "kind": "Certificate",
            "metadata": {"name": f"elastic-local-{name}"},
            "spec": {
                "secretName": name,
                "commonName": dns[0] if dns else "elastic-local-client",
                "dnsNames": dns,
                "ipAddresses": ["127.0.0.1"] if dns else [],
                # A server certificate the user brings needs client auth too (as the
                # chart's own Certificate has): etcd's gateway dials etcd with it.
                "usages": [
                    *(["server auth", "client auth"] if dns else ["client auth"]),
                    "digital signature",
                ],
            },
        }
        for name, dns in sorted(wanted.items())
    ]


# -- the pods' lines ---------------------------------------------------------------------

_ATTEMPT = re.compile(r"\[elastic-worker\] attempt (.*)$")
_TRAIN = re.compile(r"\[train\]\s+(?:(start|resumed|checkpoint|sigterm|done)\s+)?(step=.*)$")
_KV = re.compile(r"(\w+)=(\S+)")
WORKER_PREFIX = "elastic-worker:"
#: The worker's line for a restore its training process reported (docs/contracts.md,
#: "Progress": the `restored=` line of packages/elastic-snapshot).
_RESTORED = re.compile(
    r"elastic-worker: state restored at step (\d+) from (peer-memory|local-memory|checkpoint)"
    r" \((\d+|\?) steps? lost\)"
)
_BARRIER_WAIT = re.compile(r"exit barrier: .*waiting (?:up to \S+ s )?for: (.+)$")
_BARRIER_LEFT = re.compile(
    r"exit barrier: left after ([\d.]+) s(?:, its timeout; had not finished: (.+)|[;:] .*)$"
)
_TEARDOWN = re.compile(
    r"training process \d+ \((.+?)\) still running (\d+) s after its script returned "
    r"(-?\d+) .*: stopped it"
)


@dataclass(frozen=True)
class Attempt:
    """One attempt torchrun started (the worker's shim, LOCAL_RANK 0 only). Exactly one
    member of each rendezvous round has group_rank 0."""

    run_id: str
    restart: int
    group_rank: int
    nodes: int
    world_size: int


@dataclass(frozen=True)
class TrainEvent:
    """A `[train]` line of the reference script: step detail, when a script prints them."""

    kind: str  # step | start | resumed | checkpoint | sigterm | done
    step: int
    world_size: int | None = None
    restart: int | None = None
    loss: float | None = None


@dataclass(frozen=True)
class Restore:
    """Where the state of a pod's new round came from, as its worker says it (a script that
    keeps snapshots: packages/elastic-snapshot)."""

    step: int
    source: str  # peer-memory, local-memory or checkpoint
    lost: int | None


@dataclass(frozen=True)
class ExitBarrier:
    """The worker's word on torch's exit barrier (launch.ExitBarrier): this node's training
    processes exited 0 and it waits for `whom` (pods; empty: nobody left; None: it cannot
    tell), or it left after `left_after` s (`timed_out`: by the timeout, `whom` unfinished)."""

    whom: tuple[str, ...] | None
    left_after: float | None = None
    timed_out: bool = False


@dataclass(frozen=True)
class TeardownStopped:
    """The warm server stopped a training process still running after its script returned."""

    process: str  # "rank 1, local rank 0"
    seconds: float
    code: int


@dataclass(frozen=True)
class WorkerMessage:
    """A line worth showing: the worker's own, or a warning or error of another container."""

    text: str
    shown: bool  # printed as an event, or only kept as one of the pod's last lines


def parse_attempt_line(line: str) -> Attempt | None:
    m = _ATTEMPT.search(line)
    if not m:
        return None
    kv = dict(_KV.findall(m.group(1)))
    try:
        return Attempt(
            run_id=kv["run_id"],
            restart=int(kv["restart"]),
            group_rank=int(kv["group_rank"]),
            nodes=int(kv["nodes"]),
            world_size=int(kv["world_size"]),
        )
    except (KeyError, ValueError):
        return None


def parse_train_line(line: str) -> TrainEvent | None:
    """One `[train] ...` line of docs/contracts.md, or None for any other line."""
    m = _TRAIN.search(line)
    if not m:
        return None
    kv = dict(_KV.findall(m.group(2)))
    kind = m.group(1) or "step"
    try:
        step = int(kv["step"])
        world = int(kv["world_size"]) if "world_size" in kv else None
        restart = int(kv["restart"]) if "restart" in kv else None
        loss = float(kv["loss"]) if "loss" in kv else None
    except (KeyError, ValueError):
        return None
    return TrainEvent(kind, step, world, restart, loss)


def parse_restore_line(line: str) -> Restore | None:
    m = _RESTORED.search(line)
    if not m:
        return None
    return Restore(int(m[1]), m[2], None if m[3] == "?" else int(m[3]))


def _whom(text: str) -> tuple[str, ...] | None:
    """The pods a waiting line names; None for `the other nodes (which: unknown ...)`."""
    if text.startswith("the other nodes"):
        return None
    return tuple(name.strip() for name in text.split(","))


def parse_worker_line(text: str) -> ExitBarrier | TeardownStopped | None:
    """The worker's lines the run keeps as facts (the end of a job), from their text."""
    if m := _BARRIER_WAIT.search(text):
        return ExitBarrier(_whom(m[1]))
    if m := _BARRIER_LEFT.search(text):
        timed_out = m[2] is not None
        return ExitBarrier(_whom(m[2]) if timed_out else (), float(m[1]), timed_out)
    if m := _TEARDOWN.search(text):
        return TeardownStopped(m[1], float(m[2]), int(m[3]))
    return None


Parsed = Attempt | TrainEvent | Restore | ExitBarrier | TeardownStopped | WorkerMessage


def parse_line(container: str, line: str) -> Parsed | None:
    """What a pod's line says, or None when it says nothing the run tracks. A worker line
    that is also a fact (ExitBarrier, TeardownStopped) is shown like the others."""
    attempt = parse_attempt_line(line)
    if attempt is not None:
        return attempt
    restore = parse_restore_line(line)
    if restore is not None:
        return restore
    train = parse_train_line(line)
    if train is not None:
        return train
    text = line.strip()
    if container == WORKER and text.startswith(WORKER_PREFIX):
        fact = parse_worker_line(text)
        if fact is not None:
            return fact
    if text.startswith(WORKER_PREFIX) or (
        container not in {WORKER, "etcd"}
        and any(w in text.lower() for w in ("warn", "error", "fail"))
    ):
        return WorkerMessage(text, shown=True)
    if container == WORKER and ("Error" in text or "error:" in text):
        return WorkerMessage(text, shown=False)
    return None
