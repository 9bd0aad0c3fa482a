"""Each chart's README parameter table is generated from values.yaml comments and is current."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from chart_render import CHARTS, ROOT

GENERATOR = ROOT / "scripts" / "gen-chart-docs"
CHART_DIRS = sorted(p.parent for p in CHARTS.glob("*/Chart.yaml"))


def _generator() -> Any:
    loader = importlib.machinery.SourceFileLoader("gen_chart_docs", str(GENERATOR))
    spec = importlib.util.spec_from_loader("gen_chart_docs", loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def test_committed_readmes_equal_the_regenerated_text() -> None:
    """scripts/gen-chart-docs --check: README.md tables match values.yaml comments."""
    proc = subprocess.run(
        [sys.executable, GENERATOR, "--check"], capture_output=True, text=True, check=False
    )
    assert proc.returncode == 0, proc.stderr


def _leaves(node: Any, path: str = "") -> list[str]:
    if isinstance(node, dict) and node:
        out = []
        for key, value in node.items():
            out += _leaves(value, f"{path}.{key}" if path else key)
        return out
    return [path]


@pytest.mark.parametrize("chart", CHART_DIRS, ids=lambda p: p.name)
def test_every_value_is_documented(chart: Path) -> None:
    """Every leaf of values.yaml has a `# --` comment on it or on an enclosing key."""
    text = (chart / "values.yaml").read_text()
    documented = {path for path, _ in _generator().documented_keys(text)}
    missing = [
        leaf
        for leaf in _leaves(yaml.safe_load(text))
        if not any(leaf == d or leaf.startswith(d + ".") for d in documented)
    ]
    assert not missing


def test_generator_reads_multi_line_comments_and_nesting() -> None:
    """A `# --` block spanning lines is one description, keyed by its dotted path."""
    text = "a:\n  # -- first line\n  # second line\n  b: 1\n# plain comment\nc: 2\n"
    assert _generator().documented_keys(text) == [("a.b", "first line second line")]
