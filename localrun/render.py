"""`helm template` -> the rendered objects, sorted by kind.

The chart directory is copied to a temporary directory first, so `helm dependency build`
(needed for the `file://` dependency on etcd-rendezvous) never writes into the checkout.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from localrun.cluster import certmanager

log = logging.getLogger(__name__)

Obj = dict[str, Any]

ROOT = Path(__file__).resolve().parents[1]


class RenderError(RuntimeError):
    pass


def find_helm() -> str:
    for cand in (ROOT / ".tools" / "helm3" / "helm", ROOT / ".tools" / "helm4" / "helm"):
        if cand.exists():
            return str(cand)
    found = shutil.which("helm")
    if found:
        return found
    raise RenderError("helm not found: run scripts/bootstrap (it installs .tools/helm3/helm)")


@dataclass
class Rendered:
    objects: list[Obj]
    namespace: str
    release: str
    statefulsets: list[Obj] = field(default_factory=list)
    services: list[Obj] = field(default_factory=list)
    configmaps: dict[str, Obj] = field(default_factory=dict)
    secrets: dict[str, Obj] = field(default_factory=dict)
    service_accounts: dict[str, Obj] = field(default_factory=dict)
    certificates: list[Obj] = field(default_factory=list)  # cert-manager.io Certificates

    @classmethod
    def from_objects(cls, objects: list[Obj], namespace: str, release: str) -> Rendered:
        r = cls(objects, namespace, release)
        for o in objects:
            kind, name = o.get("kind"), o.get("metadata", {}).get("name", "")
            if kind == "StatefulSet":
                r.statefulsets.append(o)
            elif kind == "Service":
                r.services.append(o)
            elif kind == "ConfigMap":
                r.configmaps[name] = o
            elif kind == "Secret":
                r.secrets[name] = o
            elif kind == "ServiceAccount":
                r.service_accounts[name] = o
            elif certmanager.is_certificate(o):
                r.certificates.append(o)
        return r


def parse_stream(text: str) -> list[Obj]:
    return [d for d in yaml.safe_load_all(text) if isinstance(d, dict) and d.get("kind")]


def _chart_copy(chart: Path, tmp: Path) -> Path:
    """Copy the chart with its siblings (file:// dependencies point at ../<name>)."""
    parent = chart.resolve().parent
    dest_parent = tmp / "charts"
    shutil.copytree(
        parent,
        dest_parent,
        symlinks=True,
        ignore=shutil.ignore_patterns(".git", "*.tgz", "tmpcharts*"),
    )
    return dest_parent / chart.resolve().name


def render(
    chart: Path,
    values: list[Path],
    sets: list[str],
    *,
    release: str,
    namespace: str,
    helm: str | None = None,
) -> Rendered:
    helm = helm or find_helm()
    if not (chart / "Chart.yaml").exists():
        raise RenderError(f"{chart} is not a chart (no Chart.yaml)")
    with tempfile.TemporaryDirectory(prefix="elastic-local-render-") as tmpdir:
        tmp = Path(tmpdir)
        copy = _chart_copy(chart, tmp)
        chart_yaml = yaml.safe_load((copy / "Chart.yaml").read_text()) or {}
        if chart_yaml.get("dependencies"):
            dep = subprocess.run(
                [helm, "dependency", "build", "--skip-refresh", str(copy)],
                capture_output=True,
                text=True,
                check=False,
                env=_helm_env(tmp),
            )
            if dep.returncode != 0:
                raise RenderError(f"helm dependency build failed: {dep.stderr.strip()}")
        cmd = [helm, "template", release, str(copy), "--namespace", namespace]
        for v in values:
            cmd += ["-f", str(v.resolve())]
        for s in sets:
            cmd += ["--set", s]
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False, env=_helm_env(tmp))
        if proc.returncode != 0:
            raise RenderError(f"helm template failed: {proc.stderr.strip()}")
    objects = parse_stream(proc.stdout)
    for o in objects:
        o.setdefault("metadata", {}).setdefault("namespace", namespace)
    return Rendered.from_objects(objects, namespace, release)


def _helm_env(tmp: Path) -> dict[str, str]:
    env = dict(os.environ)
    for var, sub in (
        ("HELM_CACHE_HOME", "cache"),
        ("HELM_CONFIG_HOME", "config"),
        ("HELM_DATA_HOME", "data"),
    ):
        env.setdefault(var, str(tmp / "helm" / sub))
    return env
