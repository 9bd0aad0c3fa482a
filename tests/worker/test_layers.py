"""The worker's packages import each other in one direction (elastic_worker/__init__.py):
no cycle between its folders and top-level modules, at import time or under TYPE_CHECKING."""

from __future__ import annotations

import ast
from graphlib import CycleError, TopologicalSorter
from pathlib import Path

from worker.worker_helpers import ROOT

SRC = ROOT / "images" / "worker" / "src" / "elastic_worker"


def unit(path: Path) -> str:
    """A folder of the package (`recovery`), or a top-level module (`pod.py`)."""
    rel = path.relative_to(SRC)
    return rel.parts[0] if len(rel.parts) > 1 else rel.name


def imported_units(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names: list[str] = []
        if isinstance(node, ast.ImportFrom) and node.module:
            names = [f"{node.module}.{alias.name}" for alias in node.names]
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        for name in names:
            parts = name.split(".")
            if parts[0] != "elastic_worker" or len(parts) < 2:
                continue
            if (SRC / parts[1]).is_dir():
                found.add(parts[1])
            elif (SRC / f"{parts[1]}.py").is_file():
                found.add(f"{parts[1]}.py")
    return found


def graph() -> dict[str, set[str]]:
    edges: dict[str, set[str]] = {}
    for path in SRC.rglob("*.py"):
        source = unit(path)
        edges.setdefault(source, set()).update(imported_units(path) - {source})
    return edges


def test_the_packages_import_each_other_without_a_cycle() -> None:
    try:
        order = list(TopologicalSorter(graph()).static_order())
    except CycleError as exc:
        raise AssertionError(
            f"an import cycle between the worker's packages: {exc.args[1]}"
        ) from None
    assert {"recovery", "launch", "gate", "observe", "settings"} <= set(order)


def test_launch_knows_nothing_of_the_node_loss_policy() -> None:
    """The supervisor hears the policy through its Hooks: launch/ never imports recovery/."""
    assert "recovery" not in graph()["launch"]


def test_the_finder_sees_an_import_cycle() -> None:
    """The check above can fail: a cycle made on purpose is found."""
    edges = graph()
    edges["settings"] = edges["settings"] | {"recovery"}
    try:
        list(TopologicalSorter(edges).static_order())
    except CycleError:
        return
    raise AssertionError("a cycle settings -> recovery -> settings went unseen")
