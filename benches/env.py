"""Where the benches run: the checkout, its venv, and the one preamble that moves a bench
started with the system python (`scripts/bench`, as the README runs it) into the venv.

Standard library only: the entry points import this before anything of the venv's.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
VENV_BIN = ROOT / ".venv" / "bin"
VENV_PYTHON = VENV_BIN / "python"


def in_venv(name: str) -> None:
    """Go on in the project's venv (torch, elastic_worker, matplotlib): re-exec this
    script there unless it already runs there; one line and exit 1 when there is none."""
    if Path(sys.prefix).resolve() == VENV_PYTHON.parents[1].resolve():
        return
    if not VENV_PYTHON.exists():
        sys.exit(f"{name}: no .venv: run scripts/bootstrap first")
    os.execv(str(VENV_PYTHON), [str(VENV_PYTHON), sys.argv[0], *sys.argv[1:]])


def report(path: Path, results: dict[str, Any], lines: Iterable[str]) -> None:
    """A bench's end: every run in `path` (JSON), its table on stdout, and where it went."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=2) + "\n")
    for line in lines:
        print(line)
    print(f"\nwrote {path}")
