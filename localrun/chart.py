"""Everything the local run knows about the elastic-job chart and its images; the
mini-cluster (cluster/) and the host layer (host/) know none of it.

- which rendered StatefulSets are worker groups and which the rendezvous (labels);
- what the project's images are here (the checkout's venv; the worker image's examples, the
  init-topology image's injected-worker bundle at their paths), and the images `--image`
  maps to other environments (a user's own training image: its venv, nothing of ours);
- where the job's completion marker is (the etcd client port, the key, ELASTIC_JOB_ID);
- the TLS Secrets a user brings.
The lines the pods print and their parser are lines.py.
"""

from __future__ import annotations

import base64
import http.client
import importlib.util
import json
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
