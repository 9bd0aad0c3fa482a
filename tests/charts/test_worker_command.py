"""job.command: the worker container's args. Empty arguments are refused only where they
can only be a mistake (tests/charts/test_bad_values.py); elsewhere they pass through."""

from __future__ import annotations

from pathlib import Path

import pytest
from chart_render import ELASTIC_JOB, container, objects, worker_statefulsets


@pytest.mark.parametrize(
    "command",
    [
        ["python", "/w/train.py", "--prefix", ""],  # an empty option value is data
        ["python", "-u", "/w/train.py"],
        ["python", "-c", ""],
        ["bash", "-c", "", "arg0"],
        ["/w/run.sh", ""],
    ],
)
def test_empty_arguments_after_the_program_and_script_render(
    tmp_path: Path, command: list[str]
) -> None:
    values = tmp_path / "command.yaml"
    values.write_text(f"job:\n  command: {command!r}\n".replace("'", '"'))
    (sts,) = worker_statefulsets(objects(ELASTIC_JOB, values=[values]))
    assert container(sts, "worker")["args"] == command
