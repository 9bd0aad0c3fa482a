"""CONTRIBUTING.md's facts about the tests, checked against the tree: what scripts/test
runs, in order, and a row for every folder of tests/."""

from __future__ import annotations

import re

from testlib import ROOT

CONTRIBUTING = (ROOT / "CONTRIBUTING.md").read_text()
#: Shell that only sets scripts/test up or says something: not a step of the run.
NOT_A_STEP = re.compile(
    r"^(set |ROOT=|cd |export |echo |eval |fi$|else$|then$|\[ |quick=|shift$|elif |if \$quick)"
)


def steps(script: str) -> list[str]:
    """The commands scripts/test runs, in order: each line's command (the one inside
    `$(...)` for an assignment or a test), without `exec` and its arguments' "$@"."""
    out = []
    for raw in script.splitlines():
        line = raw.split(" #", 1)[0].strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("if ["):
            continue  # a condition on the user or the machine, not a step
        inner = re.search(r"\$\(([^)]*)\)", line)
        if inner and line.startswith(("if ", "exports=")):
            line = inner[1]
        if NOT_A_STEP.match(line):
            continue
        line = line.removeprefix("exec ").replace(' "$@"', "")
        out.append("pytest" if line.startswith("pytest ") else line)  # its options aside
    return out


def test_scripts_test_runs_what_contributing_says_in_that_order() -> None:
    ran = steps((ROOT / "scripts" / "test").read_text())
    assert ran[0] == "scripts/bootstrap" and ran[-1] == "pytest", ran
    assert "`scripts/test` runs, in order:" in CONTRIBUTING, "CONTRIBUTING.md names no steps"
    sentence = " ".join(
        CONTRIBUTING.split("`scripts/test` runs, in order:", 1)[1].split("\n\n")[0].split()
    )
    said = [s for s in re.findall(r"`([^`]+)`", sentence) if s in ran]
    assert said == ran, f"scripts/test runs {ran}; CONTRIBUTING.md says {said}"


def test_every_tests_folder_has_a_row_saying_what_it_covers() -> None:
    folders = {p.parent.name for p in (ROOT / "tests").glob("*/test_*.py")}
    table = CONTRIBUTING.split("| tests/ | covers |", 1)[1].split("\n\n", 1)[0]
    first_cells = [line.split("|")[1] for line in table.splitlines() if line.startswith("| `")]
    rows = {name for cell in first_cells for name in re.findall(r"`(\w+)/`", cell)}
    assert rows == folders, f"missing {sorted(folders - rows)}, gone {sorted(rows - folders)}"
