"""Render the charts with the real helm binaries and pick objects out of the result.

Shared by every test in tests/charts. Renders are cached per (helm, chart, values, sets),
so a case rendered by several tests costs one `helm template`: in this process, and, under
scripts/test, in a directory every xdist worker of the session shares (RENDER_CACHE_ENV,
set by conftest.py), keyed by the bytes helm reads, so that another worker's render of the
same case is read, not made again.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.resources
import json
import os
import re
import subprocess
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate.utils as kvu
import yaml
from referencing import Registry, Resource
from testlib import RENDER_CACHE_ENV

ROOT = Path(__file__).resolve().parents[2]
CHARTS = ROOT / "charts"
ELASTIC_JOB = CHARTS / "elastic-job"
ETCD = CHARTS / "etcd-rendezvous"
# What a cluster admin installs once for every job (the node reader, alerts, dashboard).
CLUSTER = CHARTS / "elastic-job-cluster"
EXAMPLES = ROOT / "values-examples"
# values-examples for the cluster chart (the files directly in EXAMPLES are elastic-job's).
CLUSTER_EXAMPLES = EXAMPLES / "cluster"
# Configurations only the tests render (they need Secrets or an outside etcd to install).
TEST_VALUES = Path(__file__).resolve().parent / "values"
TOOLS = ROOT / ".tools"
HELM3 = TOOLS / "helm3" / "helm"
HELM4 = TOOLS / "helm4" / "helm"
RELEASE = "run42"
NAMESPACE = "ml"
KUBERNETES_VERSIONS = ("1.29", "1.30", "1.31", "1.32", "1.33", "1.34", "1.35")

# Helm prints this (on stderr) for the charts/etcd-rendezvous symlink in elastic-job/charts.
_SYMLINK_NOTE = re.compile(r"symbolic link", re.IGNORECASE)


@dataclass(frozen=True)
class Case:
    """One configuration to render: a chart and the values files applied to it."""

    name: str
    chart: Path
    values: tuple[Path, ...] = ()
    sets: tuple[str, ...] = field(default=())

    def __str__(self) -> str:
        return self.name


def cases() -> list[Case]:
    """Defaults of every chart, each chart's ci/*-values.yaml, each values-examples file and
    the test-only values in tests/charts/values/."""
    out: list[Case] = []
    for chart in (ETCD, ELASTIC_JOB, CLUSTER):
        out.append(Case(f"{chart.name}:defaults", chart))
        for values in sorted((chart / "ci").glob("*-values.yaml")):
            out.append(Case(f"{chart.name}:ci/{values.name}", chart, (values,)))
    for values in sorted(EXAMPLES.glob("*.yaml")):
        out.append(Case(f"elastic-job:values-examples/{values.name}", ELASTIC_JOB, (values,)))
    for values in sorted(CLUSTER_EXAMPLES.glob("*.yaml")):
        case = f"elastic-job-cluster:values-examples/cluster/{values.name}"
        out.append(Case(case, CLUSTER, (values,)))
    for values in sorted(TEST_VALUES.glob("*.yaml")):
        out.append(Case(f"elastic-job:tests/{values.name}", ELASTIC_JOB, (values,)))
    return out


class RenderError(Exception):
    def __init__(self, returncode: int, stderr: str) -> None:
        super().__init__(stderr)
        self.returncode = returncode
        self.stderr = stderr


def _env() -> dict[str, str]:
    env = dict(os.environ)
    # Keep helm away from the user's repositories, plugins and caches.
    for var, sub in (("HELM_CACHE_HOME", "cache"), ("HELM_CONFIG_HOME", "config")):
        env[var] = str(ROOT / ".tools" / "helm-home" / sub)
    env["HELM_DATA_HOME"] = str(ROOT / ".tools" / "helm-home" / "data")
    return env


def helm_run(helm: Path, *args: str) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        [str(helm), *args], capture_output=True, text=True, env=_env(), timeout=120, check=False
    )
    proc.stderr = "\n".join(
        line for line in proc.stderr.splitlines() if not _SYMLINK_NOTE.search(line)
    )
    return proc


def _render_key(helm: Path, chart: Path, values: tuple[Path, ...], args: list[str]) -> str:
    """What a render depends on: the helm binary, every file of the chart (its built
    dependencies with it) and of the values files, as they are now, and the arguments."""
    digest = hashlib.sha256()

    def add(*parts: str | bytes) -> None:
        for part in parts:
            digest.update(part if isinstance(part, bytes) else part.encode())
            digest.update(b"\0")

    st = helm.stat()
    add(str(helm), str(st.st_size), str(st.st_mtime_ns), *args)
    if chart.is_file():  # a packaged chart
        add(chart.read_bytes())
    for dirpath, dirnames, filenames in os.walk(chart, followlinks=True):
        dirnames.sort()
        for name in sorted(filenames):
            path = Path(dirpath, name)
            add(path.relative_to(chart).as_posix(), path.read_bytes())
    for path in values:
        add(Path(path).read_bytes())
    return digest.hexdigest()


@functools.cache
def _template(
    helm: Path,
    chart: Path,
    *,
    values: tuple[Path, ...],
    sets: tuple[str, ...],
    release: str,
    namespace: str,
    extra: tuple[str, ...],
) -> subprocess.CompletedProcess[str]:
    args = ["template", release, str(chart), "--namespace", namespace]
    for path in values:
        args += ["-f", str(path)]
    for item in sets:
        args += ["--set", item]
    args += extra
    shared = os.environ.get(RENDER_CACHE_ENV)
    if not shared or not Path(shared).is_dir():
        return helm_run(helm, *args)
    try:
        key = _render_key(helm, chart, values, args)
    except OSError:  # a file helm would fail on: let it say so
        return helm_run(helm, *args)
    cached = Path(shared) / f"{key}.json"
    if cached.is_file():
        got = json.loads(cached.read_text())
        return subprocess.CompletedProcess(
            got["args"], got["returncode"], got["stdout"], got["stderr"]
        )
    proc = helm_run(helm, *args)
    record = {k: getattr(proc, k) for k in ("args", "returncode", "stdout", "stderr")}
    partial = cached.with_name(f"{key}.{os.getpid()}.tmp")
    partial.write_text(json.dumps(record))
    partial.replace(cached)  # whole or absent, for the other workers
    return proc


def render(
    chart: Path | Case,
    *,
    helm: Path = HELM3,
    values: Iterable[Path] = (),
    sets: Iterable[str] = (),
    release: str = RELEASE,
    namespace: str = NAMESPACE,
    extra: Iterable[str] = (),
) -> str:
    """`helm template` output; raises RenderError when helm fails."""
    if isinstance(chart, Case):
        values = (*chart.values, *values)
        sets = (*chart.sets, *sets)
        chart = chart.chart
    proc = _template(
        Path(helm),
        chart,
        values=tuple(values),
        sets=tuple(sets),
        release=release,
        namespace=namespace,
        extra=tuple(extra),
    )
    if proc.returncode != 0:
        raise RenderError(proc.returncode, proc.stderr)
    return proc.stdout


def render_error(chart: Path, *, helm: Path = HELM3, **kwargs: Any) -> RenderError:
    """The error of a render that must fail; fails the test when it renders."""
    try:
        out = render(chart, helm=helm, **kwargs)
    except RenderError as exc:
        return exc
    raise AssertionError(f"expected helm template to fail, but it rendered:\n{out[:2000]}")


# libyaml's loader where PyYAML has it (its wheels do): the same objects as safe_load_all,
# a tenth of the time on large renders (1,000 worker groups: 5 s instead of 65 s).
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def load(text: str) -> list[dict[str, Any]]:
    return [doc for doc in yaml.load_all(text, Loader=_LOADER) if doc]


def objects(chart: Path | Case, **kwargs: Any) -> list[dict[str, Any]]:
    return load(render(chart, **kwargs))


def of_kind(objs: Iterable[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [obj for obj in objs if obj.get("kind") == kind]


def one(objs: Iterable[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    found = [o for o in of_kind(objs, kind) if name is None or o["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
    return found[0]


def pod_spec(obj: dict[str, Any]) -> dict[str, Any]:
    if obj["kind"] == "Pod":
        return obj["spec"]
    return obj["spec"]["template"]["spec"]


def container(obj: dict[str, Any], name: str) -> dict[str, Any]:
    spec = pod_spec(obj)
    for item in [*spec.get("initContainers", []), *spec["containers"]]:
        if item["name"] == name:
            return item
    raise AssertionError(f"no container {name} in {obj['kind']} {obj['metadata']['name']}")


def env_of(ctr: dict[str, Any]) -> dict[str, Any]:
    """name -> value (str) or the valueFrom mapping."""
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in ctr.get("env", [])}


def worker_statefulsets(objs: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        o
        for o in of_kind(objs, "StatefulSet")
        if o["metadata"]["labels"]["app.kubernetes.io/component"] == "worker"
    ]


def etcd_statefulset(objs: Iterable[dict[str, Any]]) -> dict[str, Any]:
    found = [
        o
        for o in of_kind(objs, "StatefulSet")
        if o["metadata"]["labels"]["app.kubernetes.io/component"] == "rendezvous"
    ]
    assert len(found) == 1
    return found[0]


def walk(node: Any, path: str = "") -> Iterator[tuple[str, Any]]:
    """Every (json-pointer-ish path, value) in a nested structure."""
    yield path, node
    if isinstance(node, dict):
        for key, value in node.items():
            yield from walk(value, f"{path}/{key}")
    elif isinstance(node, list):
        for index, value in enumerate(node):
            yield from walk(value, f"{path}/{index}")


def selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


@functools.cache
def _k8s_validator(version: str, kind: str, api_version: str) -> Any:
    """kubernetes-validate's strict schema for one kind, compiled once per Kubernetes minor.

    The same files and validator class as `kubernetes_validate.validate(..., strict=True)`,
    which re-reads its 20 MB definitions file on every call; this keeps the suite fast.
    """
    versions = [v for v in kvu.all_versions() if kvu.major_minor(v) <= version]
    schema_dir = f"v{versions[-1]}-local-strict"
    api = re.sub(r"^([^./]*)(?:\.[^/]*)?/", r"\1-", api_version)
    base = importlib.resources.files("kubernetes_validate") / "kubernetes-json-schema" / schema_dir
    path = base / f"{kind.lower()}-{api}.json"
    if not path.is_file():
        raise kvu.SchemaNotFoundError(version=version, kind=kind, api_version=api_version)
    schema = json.loads(path.read_text())
    definitions = json.loads((base / "_definitions.json").read_text())
    registry = Resource.from_contents(definitions) @ (Resource.from_contents(schema) @ Registry())
    return jsonschema.validators.Draft202012Validator(schema, registry=registry)


def kubernetes_errors(obj: dict[str, Any], version: str) -> list[str]:
    """Strict validation errors of one object for a Kubernetes minor ("1.29")."""
    validator = _k8s_validator(version, obj["kind"], obj["apiVersion"])
    return [
        f"{'/'.join(str(p) for p in err.absolute_path)}: {err.message}"
        for err in validator.iter_errors(obj)
    ]
