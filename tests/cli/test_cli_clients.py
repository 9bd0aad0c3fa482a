"""The command works with the kubernetes clients its range admits, not only the dev venv's:
tests/cli's API tests (status, logs, list against the fake API server) run again in a
subprocess whose `kubernetes` (and what it needs) is another release, installed with pip
into a folder of .tools/ put first on PYTHONPATH.

36.x decodes pods/log and pods/proxy bodies into the text "b'...'" (kubernetes-client/python
#2596): the command printed "b'hello from 1\\n'" and could parse no pod's metrics until it
read those bodies raw (kube.body_text). Needs PyPI the first time (about 25 s), then the
folder is reused.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from testlib import ROOT, TOOLS

#: Releases inside the command's range that behave differently from the dev venv's pin.
CLIENTS = ["36.0.3"]


@pytest.mark.slow
@pytest.mark.parametrize("version", CLIENTS)
def test_the_api_tests_pass_with_another_client(version: str) -> None:
    target = TOOLS / "cli-clients" / version
    if not (target / ".complete").exists():
        install = subprocess.run(
            [sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check",
             "--target", str(target), f"kubernetes=={version}"],
            capture_output=True, text=True, timeout=600, check=False,
        )  # fmt: skip
        if install.returncode != 0:
            pytest.skip(f"cannot install kubernetes=={version} from PyPI: {install.stderr[-300:]}")
        (target / ".complete").touch()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(target), str(ROOT / "tests")])}
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly",
         "tests/cli/test_cli_api.py", "tests/cli/test_cli_list.py"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=900, check=False,
    )  # fmt: skip
    check = subprocess.run(
        [sys.executable, "-c", "import kubernetes; print(kubernetes.__version__)"],
        env=env, capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert check.stdout.strip() == version
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
