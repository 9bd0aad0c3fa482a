"""How the warm tests run a script through the warm server (conftest.py starts it)."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

from elastic_worker.warm import server as warm

from worker.worker_helpers import PYTHON


def client(handle: warm.Handle, *args: str) -> list[str]:
    return [str(PYTHON), "-m", "elastic_worker.warm.client", handle.socket_path, "-u", *args]


def run(
    handle: warm.Handle, tmp_path: Path, code: str, *args: str, **kw: Any
) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "script.py"
    script.write_text(code)
    return subprocess.run(  # noqa: PLW1510 - asserted by the callers
        client(handle, str(script), *args),
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
        **kw,
    )
