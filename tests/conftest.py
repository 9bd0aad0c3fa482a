"""Fixtures every test area shares; the helpers behind them live in testlib.py."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from testlib import (
    HELMS,
    RENDER_CACHE_ENV,
    ROOT,
    EtcdServer,
    build_chart_dependencies,
    start_etcd,
)

EXTENDED = "ELASTIC_TEST_EXTENDED"


#: Tests that share something outside their own files (the machine's podman images and
#: containers, the release's local registry): one worker runs each group, whatever its files.
SHARED = {
    "podman": (
        "tests/images/",
        "tests/release/",
        "tests/ci/test_ci_workflow_run.py",
        "tests/docs/test_docs_build_commands.py",
    ),
}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Variants marked `extended` run only when asked: CI keeps a representative subset.
    Under xdist (scripts/test), a file's tests run on one worker, and so do the files of a
    SHARED group (`--dist loadgroup`)."""
    skip = pytest.mark.skip(reason=f"an extended variant: set {EXTENDED}=1 to run it")
    for item in items:
        if "extended" in item.keywords and os.environ.get(EXTENDED) != "1":
            item.add_marker(skip)
        if item.get_closest_marker("xdist_group") is None:
            path = item.nodeid.split("::")[0]
            group = next((g for g, paths in SHARED.items() if path.startswith(paths)), path)
            item.add_marker(pytest.mark.xdist_group(group))


@pytest.hookimpl(tryfirst=True)
def pytest_sessionstart(session: pytest.Session) -> None:
    """The charts' file:// dependencies built from the checkout as it is now, once: by the
    controller before it starts any xdist worker (a worker has `workerinput`). And a
    directory for the session's chart renders, which the workers inherit through their
    environment (chart_render.py: a case rendered on one worker is read on the others)."""
    if not hasattr(session.config, "workerinput"):
        build_chart_dependencies()
        if RENDER_CACHE_ENV not in os.environ:
            cache = tempfile.mkdtemp(prefix="elastic-test-renders-")
            os.environ[RENDER_CACHE_ENV] = cache
            session.config.add_cleanup(lambda: _forget_renders(cache))


def _forget_renders(cache: str) -> None:
    shutil.rmtree(cache, ignore_errors=True)
    os.environ.pop(RENDER_CACHE_ENV, None)


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return ROOT


@pytest.fixture(scope="session", params=sorted(HELMS))
def helm(request: pytest.FixtureRequest) -> Path:
    """Each test that takes `helm` runs once with Helm 3 and once with Helm 4."""
    path = HELMS[request.param]
    if not path.exists():
        pytest.fail(f"{path} is missing: run scripts/bootstrap")
    return path


@pytest.fixture(scope="session")
def helm3() -> Path:
    if not HELMS["helm3"].exists():
        pytest.fail(f"{HELMS['helm3']} is missing: run scripts/bootstrap")
    return HELMS["helm3"]


@pytest.fixture
def etcd_factory(tmp_path: Path) -> Iterator[Callable[..., EtcdServer]]:
    """Start as many real etcd servers as a test needs; all are stopped afterwards."""
    started: list[EtcdServer] = []

    def make(*, v2: bool = True, version: str = "3.4") -> EtcdServer:
        data = tmp_path / f"etcd-{len(started)}"
        server = start_etcd(data, v2=v2, version=version)
        started.append(server)
        return server

    yield make
    for server in started:
        server.stop()


@pytest.fixture
def etcd(etcd_factory: Callable[..., EtcdServer]) -> EtcdServer:
    return etcd_factory()
