"""Fixtures for init-topology: the fake API server over HTTPS and a runner for the real
console script (a subprocess, as the container runs it)."""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from topology_helpers import BIN, INIT_TOPOLOGY, Run

from localrun.apiserver import FakeApiServer, load_nodes


@pytest.fixture
def api(tmp_path: Path) -> Iterator[FakeApiServer]:
    with FakeApiServer(load_nodes("all"), workdir=tmp_path / "api", hang_seconds=60) as server:
        yield server


@pytest.fixture
def run_init(tmp_path: Path, api: FakeApiServer) -> Callable[..., Run]:
    """Run the installed console script against `api` with the chart's environment."""

    def run(node_name: str, **overrides: str | None) -> Run:
        """`overrides`: variables to set, or None to remove one."""
        output = tmp_path / "inject" / "env"
        output.parent.mkdir(exist_ok=True)
        env: dict[str, str | None] = {
            "PATH": f"{BIN}:/usr/bin:/bin",
            "NODE_NAME": node_name,
            "POD_NAME": "run42-elastic-job-default-0",
            "POD_NAMESPACE": "default",
            "TOPOLOGY_OUTPUT": str(output),
            "TOPOLOGY_STRICT": "false",
            "TOPOLOGY_TIMEOUT_SECONDS": "10",
            "TOPOLOGY_USER_ENV": "",
            "TOPOLOGY_SERVICEACCOUNT_DIR": str(api.serviceaccount_dir),
            **api.env(),
        }
        env.update(overrides)
        done = subprocess.run(
            [str(INIT_TOPOLOGY)],
            env={k: v for k, v in env.items() if v is not None},
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        return Run(done.returncode, done.stdout, done.stderr, output)

    return run
