"""The maps of modules the docs give, against the tree: localrun/README.md's table, and
each benches package's `__init__` docstring (STYLE.md: a package's `__init__` is its map)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
from testlib import ROOT

BENCHES = ROOT / "benches"


def modules(package: Path) -> set[str]:
    """The modules and subpackages directly in `package`, as the map names them."""
    found = {p.name for p in package.glob("*.py") if p.name != "__init__.py"}
    found |= {p.name + "/" for p in package.iterdir() if (p / "__init__.py").exists()}
    return found


@pytest.mark.parametrize(
    "package",
    [BENCHES, *sorted(p for p in BENCHES.iterdir() if (p / "__init__.py").exists())],
    ids=lambda p: p.name,
)
def test_each_benches_package_docstring_names_its_modules(package: Path) -> None:
    doc = ast.get_docstring(ast.parse((package / "__init__.py").read_text()), clean=False) or ""
    named = set(re.findall(r"(?m)^ *(\w+(?:\.py|/))  ", doc))
    assert named == modules(package), (
        f"{package.name}/__init__.py names {sorted(named)}; the tree has {sorted(modules(package))}"
    )


def test_localrun_readmes_table_names_every_module() -> None:
    text = (ROOT / "localrun" / "README.md").read_text()
    rows = [line.split("|")[1] for line in text.splitlines() if line.startswith("| `")]
    named = {name for cell in rows for name in re.findall(r"`([\w/]+\.py)`", cell)}
    tree = {
        str(p.relative_to(ROOT / "localrun"))
        for p in (ROOT / "localrun").rglob("*.py")
        if p.name != "__init__.py"
    }
    assert named == tree, f"missing {sorted(tree - named)}, gone {sorted(named - tree)}"
