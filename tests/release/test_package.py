"""scripts/package: both charts packaged from a copy of the checkout, the dependency a real
chart (no symlink in the archive), and every configuration renders from the packages
exactly as from the source tree, with Helm 3 and 4."""

from __future__ import annotations

import os
import shutil
import subprocess
import tarfile
from dataclasses import dataclass
from pathlib import Path

import pytest
from testlib import ROOT

VERSION = (ROOT / "VERSION").read_text().strip()
SCRIPT = ROOT / "scripts" / "package"


@dataclass(frozen=True)
class Packaged:
    helm: Path
    outdir: Path
    stdout: str
    stderr: str

    def tgz(self, chart: str) -> Path:
        return self.outdir / f"{chart}-{VERSION}.tgz"


def _run_package(helm: Path, outdir: Path, root: Path = ROOT) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "HELM": str(helm)}
    return subprocess.run(
        [root / "scripts" / "package", outdir],
        capture_output=True,
        text=True,
        env=env,
        check=False,
        timeout=300,
    )


def _git_state() -> str:
    return subprocess.run(
        ["git", "status", "--porcelain", "--ignored", "charts"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout


@pytest.fixture(scope="module")
def packaged(helm: Path, tmp_path_factory: pytest.TempPathFactory) -> Packaged:
    before = _git_state()
    outdir = tmp_path_factory.mktemp("dist")
    proc = _run_package(helm, outdir)
    assert proc.returncode == 0, proc.stderr
    assert _git_state() == before, "scripts/package changed the checkout"
    assert (ROOT / "charts" / "elastic-job" / "charts" / "etcd-rendezvous").is_symlink()
    return Packaged(helm, outdir, proc.stdout, proc.stderr)


def _template(helm: Path, chart: Path, *values: Path) -> str:
    args = [str(helm), "template", "run42", str(chart), "--namespace", "ml"]
    for path in values:
        args += ["-f", str(path)]
    proc = subprocess.run(args, capture_output=True, text=True, check=False, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def _configurations() -> list[tuple[str, tuple[Path, ...]]]:
    out: list[tuple[str, tuple[Path, ...]]] = [("etcd-rendezvous", ())]
    out += [
        ("etcd-rendezvous", (v,)) for v in sorted(ROOT.glob("charts/etcd-rendezvous/ci/*.yaml"))
    ]
    out += [("elastic-job", ())]
    out += [("elastic-job", (v,)) for v in sorted(ROOT.glob("charts/elastic-job/ci/*.yaml"))]
    out += [("elastic-job", (v,)) for v in sorted(ROOT.glob("values-examples/*.yaml"))]
    return out


def test_both_charts_are_packaged_at_the_version(packaged: Packaged) -> None:
    assert packaged.stdout.split() == [
        str(packaged.tgz("etcd-rendezvous")),
        str(packaged.tgz("elastic-job")),
    ]
    assert all(packaged.tgz(c).is_file() for c in ("etcd-rendezvous", "elastic-job"))


def test_package_holds_no_symlink_and_the_real_dependency(packaged: Packaged) -> None:
    """The archive has regular files only; the dependency is etcd-rendezvous as packaged
    on its own (same files, same bytes)."""
    with tarfile.open(packaged.tgz("elastic-job")) as tgz:
        members = tgz.getmembers()
        assert [m.name for m in members if not (m.isfile() or m.isdir())] == []
        sub = {
            m.name.removeprefix("elastic-job/charts/etcd-rendezvous/"): tgz.extractfile(m).read()  # type: ignore[union-attr]
            for m in members
            if m.name.startswith("elastic-job/charts/etcd-rendezvous/") and m.isfile()
        }
    with tarfile.open(packaged.tgz("etcd-rendezvous")) as tgz:
        alone = {
            m.name.removeprefix("etcd-rendezvous/"): tgz.extractfile(m).read()  # type: ignore[union-attr]
            for m in tgz.getmembers()
            if m.isfile()
        }
    assert sub and sub == alone


def test_packages_render_the_same_manifests_as_the_source_tree(packaged: Packaged) -> None:
    """helm template from each .tgz equals helm template from charts/, for the defaults,
    each ci/*-values.yaml and each values-examples file."""
    configurations = _configurations()
    assert len(configurations) > 10
    for chart, values in configurations:
        source = _template(packaged.helm, ROOT / "charts" / chart, *values)
        package = _template(packaged.helm, packaged.tgz(chart), *values)
        assert package == source, f"{chart} {[v.name for v in values]} differs when packaged"


def test_script_says_how_to_push_to_an_oci_registry(packaged: Packaged) -> None:
    for chart in ("etcd-rendezvous", "elastic-job"):
        assert f"helm push {packaged.tgz(chart)} oci://" in packaged.stderr
    assert f"--version {VERSION}" in packaged.stderr


def test_a_chart_version_other_than_version_file_stops_packaging(
    helm3: Path, tmp_path: Path
) -> None:
    """A Chart.yaml left behind at a bump fails with the file and both versions named."""
    root = tmp_path / "repo"
    shutil.copytree(ROOT / "charts", root / "charts", symlinks=True)
    (root / "scripts").mkdir()
    shutil.copy2(SCRIPT, root / "scripts" / "package")
    (root / "VERSION").write_text("9.9.9\n")
    proc = _run_package(helm3, tmp_path / "dist", root)
    assert proc.returncode == 1
    assert f"charts/etcd-rendezvous/Chart.yaml has version {VERSION} but VERSION says 9.9.9" in (
        proc.stderr
    )
    assert not (tmp_path / "dist").exists() or not list((tmp_path / "dist").iterdir())
