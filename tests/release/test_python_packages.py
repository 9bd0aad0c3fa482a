"""The release's packages job (.github/workflows/release.yaml) run here as written: it installs
requirements/release.txt by hash (build, setuptools, twine) and runs scripts/build-packages,
which builds an sdist and a wheel of each of packages/* at VERSION and checks them with
`twine check --strict`. The wheels then install by name from that directory into a fresh venv
and work: `elastic-job --version`, the v3 client, the snapshot library. PyPI's upload (trusted
publishing: GitHub's OIDC token) cannot run here and is named so.

The fresh venv gets the packages' dependencies (kubernetes, torch, ...) from the development
venv through a path entry, as a user's environment already has them: `pip install --no-index
--no-deps --ignore-installed` then installs our wheels by name and nothing else, offline (the
development venv's editable installs of the same names would otherwise count as installed)."""

from __future__ import annotations

import email
import os
import site
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import tomllib
from release_helpers import release_wheels
from testlib import ROOT, runner_python
from workflow_runner import Skip, clean_copy, load, run_job

WORKFLOW = ROOT / ".github" / "workflows" / "release.yaml"
VERSION = (ROOT / "VERSION").read_text().strip()
PACKAGES = sorted(p.parent.name for p in ROOT.glob("packages/*/pyproject.toml"))
REPOSITORY = "https://github.com/elastic-job/elastic-job"


def _dist_name(package: str) -> str:
    return package.replace("-", "_")


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The packages job run: dist/python of its checkout."""
    tmp = tmp_path_factory.mktemp("packages-job")
    python_bin = runner_python(tmp / "setup-python")
    checkout = clean_copy(ROOT, tmp / "checkout")
    run = run_job(
        WORKFLOW, "packages", checkout,
        skip={"actions/upload-artifact": Skip("GitHub's artifact store: dist/python is read")},
        path=[python_bin],
        env={"PIP_FIND_LINKS": str(release_wheels()), "PIP_NO_INDEX": "1"},
        timeout=900,
    )  # fmt: skip
    assert not run.failed, run.failed[0].name + "\n" + run.failed[0].output[-6000:]
    step = run.step("Build and check the Python packages (sdist and wheel)")
    assert step.ran
    assert step.output.count("PASSED") == 2 * len(PACKAGES), step.output[-3000:]
    assert not list((checkout / "packages").glob("*/build"))  # built from a copy
    return checkout / "dist" / "python"


def test_each_package_has_an_sdist_and_a_wheel_at_the_version(built: Path) -> None:
    want = set()
    for package in PACKAGES:
        want |= {f"{_dist_name(package)}-{VERSION}.tar.gz",
                 f"{_dist_name(package)}-{VERSION}-py3-none-any.whl"}  # fmt: skip
    assert {p.name for p in built.iterdir()} == want


@pytest.mark.parametrize("package", PACKAGES)
def test_the_wheels_metadata_is_complete(built: Path, package: str) -> None:
    """What PyPI shows and scanners read: the license and its text, the links, the
    classifiers, the README as Markdown, the Python it needs."""
    wheel = built / f"{_dist_name(package)}-{VERSION}-py3-none-any.whl"
    with zipfile.ZipFile(wheel) as zf:
        info = f"{_dist_name(package)}-{VERSION}.dist-info"
        meta = email.message_from_bytes(zf.read(f"{info}/METADATA"))
        license_text = zf.read(f"{info}/licenses/LICENSE").decode()
    assert meta["Name"] == package and meta["Version"] == VERSION
    assert meta["License-Expression"] == "Apache-2.0"
    assert license_text == (ROOT / "LICENSE").read_text()
    assert meta["Description-Content-Type"] == "text/markdown"
    assert meta["Requires-Python"] == ">=3.10"
    urls = dict(u.split(", ", 1) for u in meta.get_all("Project-URL"))
    assert urls["Homepage"] == REPOSITORY and urls["Source"].startswith(REPOSITORY + "/")
    assert "Typing :: Typed" in meta.get_all("Classifier")
    readme = (ROOT / "packages" / package / "README.md").read_text()
    assert meta.get_payload().strip() == readme.strip()
    # A link relative to the repository is broken on PyPI: the README's links are absolute.
    assert "](../" not in readme


def _user_venv(tmp_path: Path) -> Path:
    """A fresh venv whose dependencies are the development venv's (a path entry after its
    own site-packages), as a user's environment has them already."""
    venv = tmp_path / "user"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    (own,) = (venv / "lib").glob("python3*/site-packages")
    (own / "dev-deps.pth").write_text(site.getsitepackages()[0] + "\n")
    return venv


def _install(venv: Path, dist: Path, *names: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install",
         "--no-index", "--find-links", str(dist), "--no-deps", "--ignore-installed",
         "--disable-pip-version-check", *names],
        capture_output=True, text=True, timeout=300, check=False,
        env={k: v for k, v in os.environ.items() if not k.startswith("PIP_")},
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_packages_install_by_name_and_work(built: Path, tmp_path: Path) -> None:
    venv = _user_venv(tmp_path)
    _install(venv, built, *PACKAGES)
    done = subprocess.run(
        [venv / "bin" / "elastic-job", "--version"], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"elastic-job {VERSION} (kubernetes client ")
    code = (
        "import elastic_job_cli, elastic_snapshot, torch_etcd_v3.client, sys; "
        "print(*(m.__file__ for m in (elastic_job_cli, elastic_snapshot, torch_etcd_v3)))"
    )
    done = subprocess.run(
        [venv / "bin" / "python", "-c", code], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
    # Each from the wheel just installed, not from the checkout.
    assert all(str(venv) in path for path in done.stdout.split()), done.stdout
    plugin = venv / "bin" / "kubectl-elastic_job"
    assert plugin.is_file()


@pytest.mark.parametrize("package", PACKAGES)
def test_each_packages_license_is_the_repositorys(package: str) -> None:
    """The sdist and the wheel need the file beside the pyproject: a copy, held equal."""
    assert (ROOT / "packages" / package / "LICENSE").read_bytes() == (ROOT / "LICENSE").read_bytes()


def test_the_versions_are_the_version_file() -> None:
    """scripts/build-packages refuses a package whose version is not VERSION's."""
    for package in PACKAGES:
        data = tomllib.loads((ROOT / "packages" / package / "pyproject.toml").read_text())
        assert data["project"]["version"] == VERSION


def test_a_version_other_than_the_version_file_is_refused(tmp_path: Path) -> None:
    checkout = clean_copy(ROOT, tmp_path / "checkout")
    pyproject = checkout / "packages" / "torch-etcd-v3" / "pyproject.toml"
    pyproject.write_text(
        pyproject.read_text().replace(f'version = "{VERSION}"', 'version = "9.9.9"')
    )
    done = subprocess.run(
        [checkout / "scripts" / "build-packages", str(tmp_path / "out")],
        capture_output=True, text=True, check=False, timeout=300,
        env={**os.environ, "PYTHON": sys.executable},
    )  # fmt: skip
    assert done.returncode == 1
    assert done.stderr.strip() == (
        f"build-packages: packages/torch-etcd-v3/pyproject.toml has version 9.9.9 but VERSION "
        f"says {VERSION}; make them agree"
    )


def test_pypi_publishing_is_trusted_publishing_after_everything_else() -> None:
    """No token: the publish job has id-token: write in the `pypi` environment, publishes
    what the packages job built, and runs only once the charts and images are out."""
    job = load(WORKFLOW)["jobs"]["pypi"]
    assert job["permissions"] == {"id-token": "write"}
    assert job["environment"]["name"] == "pypi"
    assert set(job["needs"]) == {"packages", "charts", "images"}
    (publish,) = [s for s in job["steps"] if "gh-action-pypi-publish" in str(s.get("uses"))]
    assert "password" not in (publish.get("with") or {})
    assert publish["with"]["packages-dir"] == "dist/python/"
