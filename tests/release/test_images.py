"""scripts/build-images and the two Dockerfiles: what a build is given (version, commit,
base), labels, pins that agree with the packages, build contexts that hold only what the
images take. The real build and run is scripts/test-images (tests/images)."""

from __future__ import annotations

import fnmatch
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib
import yaml
from testlib import ROOT

BUILD = ROOT / "scripts" / "build-images"
VERSION = (ROOT / "VERSION").read_text().strip()
DOCKERFILES = {
    "init-topology": ROOT / "images" / "init-topology" / "Dockerfile",
    "worker": ROOT / "images" / "worker" / "Dockerfile",
}
CONTEXTS = {"init-topology": ROOT, "worker": ROOT}
OCI = ("title", "description", "source", "licenses", "version", "revision")


def build_images(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(BUILD), *args],
        capture_output=True, text=True, timeout=120, check=False, env=env,
    )  # fmt: skip


def commands(out: str) -> list[list[str]]:
    return [line[2:].split() for line in out.splitlines() if line.startswith("+ ")]


def build_arg(argv: list[str], name: str) -> str | None:
    values = [argv[i + 1] for i, a in enumerate(argv) if a == "--build-arg"]
    found = [v.split("=", 1)[1] for v in values if v.startswith(f"{name}=")]
    return found[0] if found else None


def test_both_images_are_built_tagged_with_the_version_and_labelled_with_the_commit() -> None:
    done = build_images("--dry-run", "--engine", "docker")
    assert done.returncode == 0, done.stderr
    init, worker = commands(done.stdout)
    assert init[:2] == ["docker", "build"] and worker[:2] == ["docker", "build"]
    assert init[init.index("-t") + 1] == f"ghcr.io/elastic-job/init-topology:{VERSION}"
    assert worker[worker.index("-t") + 1] == f"ghcr.io/elastic-job/worker:{VERSION}"
    assert init[-1] == str(CONTEXTS["init-topology"]) and worker[-1] == str(CONTEXTS["worker"])
    head = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()
    for argv in (init, worker):
        assert build_arg(argv, "VERSION") == VERSION
        assert build_arg(argv, "REVISION") == head
        assert build_arg(argv, "BASE_IMAGE") is None  # the Dockerfile's default


def test_a_base_override_reaches_only_its_image() -> None:
    base = "mirror.local/pytorch:25.10-py3@sha256:" + "a" * 64
    done = build_images("--dry-run", "--engine", "podman", "--worker-base", base)
    init, worker = commands(done.stdout)
    assert build_arg(worker, "BASE_IMAGE") == base
    assert build_arg(init, "BASE_IMAGE") is None
    only = commands(build_images("--dry-run", "--only", "init-topology").stdout)
    assert len(only) == 1 and "init-topology" in only[0][only[0].index("-t") + 1]


def test_no_working_engine_is_one_line_that_says_what_to_do(tmp_path: Path) -> None:
    env = {**os.environ, "PATH": str(tmp_path)}  # neither podman nor docker
    done = build_images(env=env)
    assert done.returncode == 2
    assert "no working podman or docker" in done.stderr and "--install" in done.stderr


def test_the_registry_is_the_charts_default_image_repository() -> None:
    values = yaml.safe_load((ROOT / "charts" / "elastic-job" / "values.yaml").read_text())
    done = build_images("--dry-run", "--engine", "docker")
    tags = [argv[argv.index("-t") + 1].rsplit(":", 1)[0] for argv in commands(done.stdout)]
    assert tags == [
        values["initTopology"]["image"]["repository"],
        values["worker"]["image"]["repository"],
    ]


@pytest.mark.parametrize("image", sorted(DOCKERFILES))
def test_every_oci_label_is_set_from_the_build(image: str) -> None:
    text = DOCKERFILES[image].read_text()
    for key in OCI:
        assert f"org.opencontainers.image.{key}=" in text, key
    assert 'org.opencontainers.image.version="${VERSION}"' in text
    assert 'org.opencontainers.image.revision="${REVISION}"' in text
    assert 'org.opencontainers.image.licenses="Apache-2.0"' in text
    assert (ROOT / "LICENSE").read_text().lstrip().startswith("Apache License")
    assert re.search(r"^ARG BASE_IMAGE=\S+$", text, re.M), "the base is overridable"


def test_packages_are_built_with_one_pinned_setuptools_and_no_build_isolation() -> None:
    """pip's build isolation would fetch the newest setuptools at build time."""
    pins = set()
    for image, path in DOCKERFILES.items():
        text = path.read_text()
        pins |= set(re.findall(r"^ARG SETUPTOOLS_VERSION=(\S+)$", text, re.M))
        builds = re.findall(r"pip wheel(?:[^\n\\]|\\\n)*", text)
        assert builds, image
        assert all("--no-build-isolation" in b for b in builds), (image, builds)
        assert '"setuptools==${SETUPTOOLS_VERSION}"' in text, image
    assert len(pins) == 1, pins


def test_the_workers_pins_are_its_packages_dependencies() -> None:
    """The image installs with --no-deps: its pins must be the package's whole set."""
    text = DOCKERFILES["worker"].read_text()
    args = dict(re.findall(r"^ARG ([A-Z0-9_]+)_VERSION=(\S+)$", text, re.M))
    deps = tomllib.loads((ROOT / "images/worker/pyproject.toml").read_text())["project"][
        "dependencies"
    ]
    built = {"torch-etcd-v3"}  # the project's own package, built beside the worker's wheel
    for dep in deps:
        name, pin = dep.split("==")
        if name in built:
            assert "./torch-etcd-v3" in text, dep
            continue
        assert args.get(name.upper().replace("-", "_")) == pin, (dep, args)
    v3 = tomllib.loads((ROOT / "packages/torch-etcd-v3/pyproject.toml").read_text())
    assert v3["project"]["dependencies"] == []  # nothing more to pin for it


def _ignored(patterns: list[str], path: str) -> bool:
    """Docker's rule: the last matching pattern wins; `!` re-includes (and its parents)."""
    ignored = False
    for pattern in patterns:
        negate = pattern.startswith("!")
        pat = pattern[1:] if negate else pattern
        hit = fnmatch.fnmatch(path, pat) or fnmatch.fnmatch(path, pat + "/*")
        if negate and pat.startswith(path + "/"):
            hit = True  # a parent of a re-included path is sent
        if hit:
            ignored = not negate
    return ignored


@pytest.mark.parametrize("image", sorted(DOCKERFILES))
def test_the_build_context_sends_what_the_dockerfile_copies_and_nothing_else(image: str) -> None:
    context = CONTEXTS[image]
    patterns = [
        line.strip()
        for line in (context / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    sources = [
        src
        for line in re.findall(r"^COPY (?!--from)(.+)$", DOCKERFILES[image].read_text(), re.M)
        for src in line.split()[:-1]
    ]
    assert sources
    for src in sources:
        assert (context / src).exists(), src
        assert not _ignored(patterns, src.rstrip("/")), f"{src} is excluded by .dockerignore"
    for unwanted in (".venv", ".tools", ".git", "tests", "charts", "localrun"):
        assert _ignored(patterns, unwanted), unwanted
