"""Helpers for the init-topology tests (own module name: conftest.py is not unique)."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

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
