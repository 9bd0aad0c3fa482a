"""scripts/package: every chart under charts/ packaged from a copy of the checkout, the
dependency a real chart (no symlink in the archive), every configuration rendering from
the packages exactly as from the source tree, with Helm 3 and 4; signed, each package has
Helm provenance that `helm verify` accepts with the signer's public key only."""

from __future__ import annotations

import os
import shutil
import subprocess
import tarfile
from dataclasses import dataclass
from pathlib import Path

import pytest
from release_helpers import SigningKey, make_signing_key
from testlib import ROOT

VERSION = (ROOT / "VERSION").read_text().strip()
SCRIPT = ROOT / "scripts" / "package"
CHARTS = sorted(p.parent.name for p in ROOT.glob("charts/*/Chart.yaml"))


@dataclass(frozen=True)
class Packaged:
    helm: Path
    outdir: Path
    stdout: str
    stderr: str

    def tgz(self, chart: str) -> Path:
        return self.outdir / f"{chart}-{VERSION}.tgz"


def _run_package(
    helm: Path, outdir: Path | str, root: Path = ROOT, *args: str
) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "HELM": str(helm)}
    return subprocess.run(
        [root / "scripts" / "package", *args, outdir],
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
    return Packaged(helm, outdir, proc.stdout, proc.stderr)


def _template(helm: Path, chart: Path, *values: Path) -> str:
    args = [str(helm), "template", "run42", str(chart), "--namespace", "ml"]
    for path in values:
        args += ["-f", str(path)]
    proc = subprocess.run(args, capture_output=True, text=True, check=False, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def _configurations() -> list[tuple[str, tuple[Path, ...]]]:
    out: list[tuple[str, tuple[Path, ...]]] = []
    for chart in CHARTS:
        out += [(chart, ())]
        out += [(chart, (v,)) for v in sorted(ROOT.glob(f"charts/{chart}/ci/*.yaml"))]
    out += [("elastic-job", (v,)) for v in sorted(ROOT.glob("values-examples/*.yaml"))]
    return out


def test_every_chart_is_packaged_at_the_version(packaged: Packaged) -> None:
    """One package per chart under charts/ (the two here, and any added later)."""
    assert {"elastic-job", "etcd-rendezvous"} <= set(CHARTS)
    assert packaged.stdout.split() == [str(packaged.tgz(c)) for c in CHARTS]
    assert all(packaged.tgz(c).is_file() for c in CHARTS)
    assert not list(packaged.outdir.glob("*.prov"))  # unsigned unless asked


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


@pytest.mark.slow
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
    for chart in CHARTS:
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
    assert f"charts/{CHARTS[0]}/Chart.yaml has version {VERSION} but VERSION says 9.9.9" in (
        proc.stderr
    )
    assert not (tmp_path / "dist").exists() or not list((tmp_path / "dist").iterdir())


def test_help_prints_the_usage_and_packages_nothing(helm3: Path, tmp_path: Path) -> None:
    """`--help` is not an output directory: the usage, exit 0, no directory made."""
    proc = subprocess.run(
        [SCRIPT, "--help"], cwd=tmp_path, capture_output=True, text=True, check=False
    )
    assert proc.returncode == 0, proc.stderr
    assert "scripts/package --sign KEY --keyring SECRING" in proc.stdout
    assert "Exit codes" in proc.stdout
    assert list(tmp_path.iterdir()) == []


def test_an_unknown_option_is_one_usage_error(helm3: Path, tmp_path: Path) -> None:
    proc = _run_package(helm3, tmp_path / "dist", ROOT, "--sgin", "me")
    assert proc.returncode == 2
    assert proc.stderr.splitlines() == [
        "package: unknown option '--sgin'",
        "usage: scripts/package [--sign KEY --keyring SECRING [--passphrase-file FILE] "
        "[--sign-key-url URL]] [OUTDIR]",
    ]
    assert not (tmp_path / "dist").exists()


def test_signing_without_a_keyring_is_a_usage_error(helm3: Path, tmp_path: Path) -> None:
    proc = _run_package(helm3, tmp_path / "dist", ROOT, "--sign", "me@example.invalid")
    assert proc.returncode == 2
    assert "--sign me@example.invalid needs --keyring SECRING" in proc.stderr


@pytest.fixture(scope="module")
def signing_key(tmp_path_factory: pytest.TempPathFactory) -> SigningKey:
    return make_signing_key(tmp_path_factory.mktemp("gpg"))


@pytest.mark.slow
def test_signed_packages_verify_with_the_public_key(
    helm: Path, signing_key: SigningKey, tmp_path: Path
) -> None:
    """--sign writes <chart>.tgz.prov beside each package; `helm verify` with the signer's
    public keyring accepts it and names the key; a package changed after signing fails."""
    dist = tmp_path / "dist"
    proc = _run_package(
        helm, dist, ROOT, "--sign", signing_key.name, "--keyring", str(signing_key.secring),
        "--passphrase-file", str(signing_key.passphrase_file),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    for chart in CHARTS:
        tgz = dist / f"{chart}-{VERSION}.tgz"
        assert tgz.with_name(tgz.name + ".prov").is_file()
        ok = subprocess.run(
            [helm, "verify", "--keyring", signing_key.pubring, tgz],
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        assert ok.returncode == 0, ok.stderr
        assert signing_key.fingerprint in ok.stdout + ok.stderr
    tampered = dist / f"elastic-job-{VERSION}.tgz"
    tampered.write_bytes(tampered.read_bytes() + b"\0")
    bad = subprocess.run(
        [helm, "verify", "--keyring", signing_key.pubring, tampered],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert bad.returncode != 0
