"""Fixtures for init-topology: the fake API server over HTTPS and a runner for the real
console script (a subprocess, as the container runs it)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from localrun.apiserver import FakeApiServer, load_nodes

BIN = Path(sys.executable).parent
INIT_TOPOLOGY = BIN / "init-topology"
SH = "/bin/sh"  # dash on Debian: the strict POSIX shell the contract is tested with


@dataclass
class Run:
    returncode: int
    stdout: str
    stderr: str
    output: Path

    @property
    def lines(self) -> list[str]:
        return self.stderr.splitlines()


def source_env_file(path: Path, names: list[str]) -> dict[str, str]:
    """Source `path` with POSIX sh and read back the named variables, byte for byte."""
    script = '. "$1"; shift; for n in "$@"; do eval "printf \'%s\\0\' \\"\\${$n-<unset>}\\""; done'
    done = subprocess.run(
        [SH, "-c", script, "sh", str(path), *names],
        capture_output=True,
        check=True,
        env={"PATH": "/usr/bin:/bin"},
    )
    values = done.stdout.split(b"\0")[:-1]
    return {n: v.decode("utf-8") for n, v in zip(names, values, strict=True)}


def read_env_file(path: Path) -> dict[str, str]:
    """All variables in the file, in order, as sh sees them (names from the KEY= prefixes)."""
    names = []
    for line in path.read_text(encoding="utf-8").split("\n"):
        key, sep, _ = line.partition("='")
        if sep and key.isidentifier() and key.upper() == key:
            names.append(key)
    return source_env_file(path, names)


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
