"""The command's access to the API server, on the official `kubernetes` client: kubeconfig
(`--kubeconfig`, `KUBECONFIG`, ~/.kube/config; `--context`) or in-cluster config, the
namespace as kubectl picks it, and every failure turned into one line that says what to do.

Objects are read as plain JSON dicts (`_preload_content=False`), the shapes the API serves,
so the pure modules (jobstate, timeline, pricing) take exactly what a cluster returns.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import urllib3
from kubernetes import client, config, watch  # type: ignore[import-untyped]
from kubernetes.client.rest import ApiException  # type: ignore[import-untyped]
from kubernetes.config.config_exception import ConfigException  # type: ignore[import-untyped]

from elastic_job_cli import objects as o
from elastic_job_cli import promtext

Obj = dict[str, Any]

EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_NOT_FOUND = 3
EXIT_FORBIDDEN = 4
EXIT_UNREACHABLE = 5

_SA_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


class CommandError(Exception):
    """One line for the user, and the exit code."""

    def __init__(self, message: str, code: int = EXIT_ERROR) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class Release:
    name: str
    namespace: str
    statefulsets: list[Obj]
    pods: list[Obj]

    @property
    def names(self) -> set[str]:
        """The StatefulSets' names and every pod name they make (for Events): the ordinals
        up to their replicas, and at least 16, so that the Events of pods a scale-down
        removed still count."""
        out = {o.name(s) for s in self.statefulsets} | {o.name(p) for p in self.pods}
        for s in self.statefulsets:
            out |= {f"{o.name(s)}-{i}" for i in range(max(int(s["spec"].get("replicas") or 0), 16))}
        return out


def _status_message(exc: ApiException) -> str:
    try:
        return str(json.loads(exc.body)["message"])
    except (TypeError, ValueError, KeyError):
        return str(exc.reason)


class Kube:
    def __init__(self, api: Any, namespace: str, server: str) -> None:
        self.api = api
        self.core = client.CoreV1Api(api)
        self.apps = client.AppsV1Api(api)
        self.namespace = namespace
        self.server = server

    # -- errors ------------------------------------------------------------------------------

    #: Seconds a request may take (not a watch or a log follow): a cluster that went away
    #: must end the command, not hang it.
    timeout = 15.0

    def call(
        self, verb: str, resource: str, fn: Callable[..., Any], *args: Any, **kwargs: Any
    ) -> Any:
        """`fn(*args, **kwargs)`; a refusal becomes a CommandError naming the RBAC verb."""
        if not kwargs.get("follow") and not kwargs.get("watch"):
            kwargs.setdefault("_request_timeout", self.timeout)
        try:
            return fn(*args, **kwargs)
        except ApiException as exc:
            raise self.error(exc, verb, resource) from None
        except urllib3.exceptions.HTTPError as exc:
            raise CommandError(
                f"cannot reach the API server at {self.server}: {exc}; check --context and "
                "--kubeconfig (kubectl cluster-info)",
                EXIT_UNREACHABLE,
            ) from None

    def error(self, exc: ApiException, verb: str, resource: str) -> CommandError:
        message = _status_message(exc)
        scope = "" if resource == "nodes" else f" -n {self.namespace}"
        if exc.status == 403:
            return CommandError(
                f"{message}: ask for a Role granting {verb} on {resource} "
                f"(check with: kubectl auth can-i {verb} {resource}{scope})",
                EXIT_FORBIDDEN,
            )
        if exc.status == 401:
            return CommandError(
                f"the API server refused the credentials ({message}): log in again or pick "
                "another --context",
                EXIT_FORBIDDEN,
            )
        return CommandError(f"{verb} {resource}: HTTP {exc.status}: {message}")

    def json(
        self, verb: str, resource: str, fn: Callable[..., Any], *args: Any, **kwargs: Any
    ) -> Obj:
        resp = self.call(verb, resource, fn, *args, _preload_content=False, **kwargs)
        data: Obj = json.loads(resp.data)
        return data

    # -- reads -------------------------------------------------------------------------------

    def release(self, name: str) -> Release:
        ns = self.namespace
        sel = o.worker_selector(name)
        sts = self.json(
            "list",
            "statefulsets.apps",
            self.apps.list_namespaced_stateful_set,
            ns,
            label_selector=sel,
        )["items"]
        if not sts:
            raise CommandError(
                f"no elastic-job release {name!r} in namespace {ns!r} (no StatefulSet labelled "
                f"{sel}): `helm list -n {ns}` lists the releases; pass -n NAMESPACE",
                EXIT_NOT_FOUND,
            )
        return Release(name, ns, sts, self.pods(name, sts))

    def pods(self, name: str, statefulsets: list[Obj]) -> list[Obj]:
        items = self.json(
            "list", "pods", self.core.list_namespaced_pod, self.namespace,
            label_selector=o.worker_selector(name),
        )["items"]  # fmt: skip
        owners = {o.name(s) for s in statefulsets}
        return sorted((p for p in items if o.owned_by(p, owners)), key=o.name)

    def nodes(self) -> tuple[dict[str, Obj], str]:
        """Nodes by name, and a note when they cannot be read (403: a namespaced user)."""
        try:
            items = self.json("list", "nodes", self.core.list_node)["items"]
        except CommandError as exc:
            if exc.code == EXIT_FORBIDDEN:
                return {}, f"nodes not readable ({exc}); capacity and GPU columns are empty"
            raise
        return {o.name(n): n for n in items}, ""

    def events(self) -> list[Obj]:
        items: list[Obj] = self.json(
            "list", "events", self.core.list_namespaced_event, self.namespace
        )["items"]
        return items

    def metrics(self, pod: Obj) -> tuple[dict[str, float] | None, str]:
        """The worker's /metrics through the pod proxy; (None, why) when not readable."""
        if not o.has_metrics_port(pod):
            return None, "off"
        if (pod.get("status") or {}).get("phase") != "Running":
            return None, "on"
        try:
            text = self.core.connect_get_namespaced_pod_proxy_with_path(
                f"{o.name(pod)}:{o.METRICS_PORT}", self.namespace, "metrics", _request_timeout=5
            )
        except ApiException as exc:
            if exc.status == 403:
                return None, f"metrics not readable: {self.error(exc, 'get', 'pods/proxy')}"
            return None, "on"
        except urllib3.exceptions.HTTPError:
            return None, "on"
        return promtext.parse(str(text)), "on"

    def stream(
        self, resource: str, fn: Callable[..., Any], *args: Any, **kwargs: Any
    ) -> Iterator[Obj]:
        """Watch changes as raw dicts: {"type": ..., "object": {...}}."""
        w = watch.Watch()
        try:
            yield from w.stream(fn, *args, _preload_content=False, **kwargs)
        except ApiException as exc:
            raise self.error(exc, "watch", resource) from None
        except urllib3.exceptions.HTTPError as exc:
            raise CommandError(f"watching {resource} stopped: {exc}", EXIT_UNREACHABLE) from None


def connect(kubeconfig: str | None, context: str | None, namespace: str | None) -> Kube:
    """kubectl's rules: --kubeconfig, else KUBECONFIG, else ~/.kube/config, else in-cluster;
    the namespace from -n, else the context's, else the pod's, else default."""
    cfg = client.Configuration()
    ctx_namespace = ""
    path = (
        kubeconfig
        or os.environ.get("KUBECONFIG", "").split(os.pathsep)[0]
        or str(Path.home() / ".kube" / "config")
    )
    try:
        if kubeconfig or Path(path).exists() or context:
            config.load_kube_config(config_file=path, context=context, client_configuration=cfg)
            _, current = config.list_kube_config_contexts(config_file=path)
            if context:
                contexts, _ = config.list_kube_config_contexts(config_file=path)
                current = next((c for c in contexts if c["name"] == context), current)
            ctx_namespace = (current.get("context") or {}).get("namespace", "")
        else:
            config.load_incluster_config(client_configuration=cfg)
            if _SA_NAMESPACE.exists():
                ctx_namespace = _SA_NAMESPACE.read_text().strip()
    except (ConfigException, OSError) as exc:
        where = f"--kubeconfig {kubeconfig}" if kubeconfig else f"kubeconfig {path}"
        raise CommandError(
            f"no cluster access: {where}: {exc}; pass --kubeconfig or --context "
            "(kubectl config get-contexts)",
            EXIT_USAGE,
        ) from None
    cfg.retries = 1
    return Kube(client.ApiClient(cfg), namespace or ctx_namespace or "default", cfg.host)
