"""What ci/workflows/charts.yaml's kubeconform step reads, obtained here: the pinned CRDs
of ci/crds.sha256 (from ../shared/crds, byte-identical to upstream, else downloaded and
checked by ci/fetch-verified), their generated schemas, and the renders of ci/render-all."""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from testlib import ROOT, SHARED_CACHE, shared_dir

CI = ROOT / "ci"
WORKFLOW = CI / "workflows" / "charts.yaml"
CRD_PINS = CI / "crds.sha256"


@dataclass(frozen=True)
class Pin:
    sha256: str
    url: str

    @property
    def name(self) -> str:
        return self.url.rsplit("/", 1)[-1]


def crd_pins() -> list[Pin]:
    pins = []
    for line in CRD_PINS.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            sha, url = line.split()
            pins.append(Pin(sha, url))
    return pins


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _local_files() -> dict[str, Path]:
    """sha256 -> path of every CRD file this machine has (../shared, the test cache)."""
    roots = [SHARED_CACHE / "crds", SHARED_CACHE / "ci-crds"]
    shared = shared_dir()
    if shared is not None:
        roots.insert(0, shared / "crds")
    found: dict[str, Path] = {}
    for root in roots:
        for path in sorted(root.rglob("*.yaml")) if root.is_dir() else []:
            found.setdefault(sha256(path), path)
    return found


def crd_files() -> list[Path]:
    """One local file per pin, the same bytes the workflow downloads; skips (saying why)
    when a pinned file is neither here nor downloadable."""
    local = _local_files()
    out = []
    for pin in crd_pins():
        if pin.sha256 not in local:
            target = SHARED_CACHE / "ci-crds" / pin.name
            proc = subprocess.run(
                [CI / "fetch-verified", pin.sha256, pin.url, target],
                capture_output=True,
                text=True,
                check=False,
            )
            if proc.returncode != 0:
                pytest.skip(
                    f"pinned CRD {pin.name} is not in ../shared/crds and could not be "
                    f"fetched (offline?): {proc.stderr.strip().splitlines()[-1:]}"
                )
            local[pin.sha256] = target
        out.append(local[pin.sha256])
    return out


def generate_schemas(outdir: Path, files: list[Path]) -> Path:
    proc = subprocess.run(
        [sys.executable, CI / "crd_schemas.py", outdir, *files],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    return outdir


def render_all(helm: Path, outdir: Path) -> Path:
    """ci/render-all into `outdir`, run in a copy of what it reads: its `helm dependency
    build` rewrites charts/*/charts/, which would pull a chart from under the renders the
    other test workers make of the checkout at the same moment."""
    repo = outdir.parent / "repo"
    for part in ("ci", "charts", "values-examples", "tests/charts/values"):
        shutil.copytree(ROOT / part, repo / part, symlinks=True)
    proc = subprocess.run(
        [repo / "ci" / "render-all", outdir],
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin", "HELM": str(helm), "HOME": str(outdir.parent)},
        check=False,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    return outdir
