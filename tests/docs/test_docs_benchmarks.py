"""The figures and durations the docs state about the benches, against their source: the
README's short table against docs/benchmarks.md's, and every `--quick` duration against the
run recorded in docs/benchmarks/bench.json (scripts/bench writes each figure's duration)."""

from __future__ import annotations

import json
import re

import pytest
from testlib import ROOT

from benches.suite import cli

README = (ROOT / "README.md").read_text()
PAGE = (ROOT / "docs" / "benchmarks.md").read_text()
RUN = json.loads((ROOT / "docs" / "benchmarks" / "bench.json").read_text())
QUICK = re.compile(r"scripts/bench --quick\s+# [^\n]*?~(\d+) min")


def table(text: str, heading: str) -> dict[str, list[str]]:
    """The rows of the first `| figure |` table after `heading`, by their first cell."""
    section = text.split(heading, 1)[1]
    lines = section.split("| figure |", 1)[1].split("\n\n", 1)[0].splitlines()[2:]
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in lines]
    return {row[0]: row[1:] for row in rows}


def numbers(cell: str) -> list[float]:
    """The figures of a cell, without the spread in parentheses."""
    return [float(n) for n in re.findall(r"\d+(?:\.\d+)?", re.sub(r"\([^)]*\)", "", cell))]


def test_the_readmes_figures_are_the_benchmarks_pages_medians() -> None:
    short = table(README, "## Performance")
    full = table(PAGE, "## The figures, with their spread")
    assert len(short) >= 5
    for title, cells in short.items():
        match = [row for name, row in full.items() if name.startswith(title)]
        assert match, f"README's row {title!r} is not on docs/benchmarks.md"
        assert [numbers(c) for c in cells] == [numbers(c) for c in match[0]], title


@pytest.mark.parametrize(
    "where,text",
    [("README.md", README), ("docs/benchmarks.md", PAGE), ("scripts/bench", cli.__doc__ or "")],
)
def test_the_quick_bench_takes_as_long_as_the_recorded_run(where: str, text: str) -> None:
    said = QUICK.search(text)
    assert said, f"{where} does not say how long `scripts/bench --quick` takes"
    assert RUN["command"].startswith("scripts/bench --quick"), RUN["command"]
    minutes = RUN["duration_s"] / 60
    assert abs(int(said[1]) - minutes) <= max(1.0, 0.15 * minutes), (
        f"{where} says ~{said[1]} min; the recorded run took {minutes:.1f} min"
    )
    parts = sum(RUN[f]["duration_s"] for f in RUN if isinstance(RUN[f], dict) and "rows" in RUN[f])
    assert parts <= RUN["duration_s"]  # the figures' own durations add up within the whole


def test_the_benchmarks_page_names_the_run_its_plots_show_and_links_them() -> None:
    words = " ".join(PAGE.split())
    assert RUN["command"] in words and RUN["started"][:10] in words
    for image in re.findall(r"!\[[^]]*\]\(([^)]+)\)", PAGE):
        assert (ROOT / "docs" / image).is_file(), image


def test_the_three_node_table_of_each_backend_is_the_recorded_runs_medians() -> None:
    """docs/rendezvous.md's whole-job table at three nodes: each cell the summary of the
    rows in docs/benchmarks/three-nodes.json (scripts/bench-rendezvous --three-nodes)."""
    recorded = json.loads((ROOT / "docs" / "benchmarks" / "three-nodes.json").read_text())
    page = (ROOT / "docs" / "rendezvous.md").read_text()
    shown = table(page, "## At three nodes: a whole job")
    from benches.rendezvous.three import BACKENDS  # noqa: PLC0415
    from benches.suite.figures import RUNS  # noqa: PLC0415

    assert set(recorded["summary"]) == set(RUNS)
    for figure, (title, _, _) in RUNS.items():
        cells = recorded["summary"][figure]
        expected = [
            [cells[b]["median"], cells[b]["min"], cells[b]["max"]] for b in BACKENDS if b in cells
        ]
        got = [[float(n) for n in re.findall(r"\d+(?:\.\d+)?", cell)] for cell in shown[title]]
        assert got == [[round(x, 2) for x in row] for row in expected], title
