"""images/worker/README.md states facts the code can check: its module map is the package's
tree, its exit codes are exits.py's, its torch range is the fence's."""

from __future__ import annotations

import re

from elastic_worker import exits, torchcompat

from worker.worker_helpers import ROOT

README = (ROOT / "images" / "worker" / "README.md").read_text()
SRC = ROOT / "images" / "worker" / "src" / "elastic_worker"


def _section(title: str) -> str:
    match = re.search(rf"^## {title}\n(.*?)(?=^## |\Z)", README, re.M | re.S)
    assert match, f"README has no '## {title}' section"
    return match[1]


def test_the_module_map_names_every_module_and_nothing_else() -> None:
    named = re.findall(r"^- `([\w/]+\.py)`: \S", _section("Module map"), re.M)
    modules = sorted(
        p.relative_to(SRC).as_posix() for p in SRC.rglob("*.py") if p.name != "__init__.py"
    )
    assert len(named) == len(set(named)), "a module is named twice"
    assert sorted(named) == modules


def test_every_package_init_is_its_map() -> None:
    """Each folder's __init__ docstring names the modules beside it, and nothing imports
    in it (the warm client starts once per training process)."""
    for init in SRC.rglob("__init__.py"):
        text = init.read_text()
        assert "import" not in text.split('"""')[2], init
        for module in init.parent.glob("*.py"):
            if module.name != "__init__.py":
                assert module.name in text, (init, module.name)
        for sub in (d for d in init.parent.iterdir() if (d / "__init__.py").exists()):
            assert f"{sub.name}/" in text, (init, sub.name)


def test_the_exit_codes_are_exits_py() -> None:
    rows = dict(re.findall(r"^\| (\w+) \| (.+) \|$", _section("Exit codes"), re.M))
    rows.pop("code")
    assert rows.pop("other").startswith("torchrun's exit code")
    assert {int(code): meaning for code, meaning in rows.items()} == exits.MEANINGS


def test_the_torch_range_is_the_fences() -> None:
    """In the worker's README and the project's."""
    first, last = (v.rsplit(".", 1)[0] for v in torchcompat.READ_FROM)
    assert f"torch {first} to {last}" in _section("torch")
    assert f"torch {first} to {last}" in (ROOT / "README.md").read_text()
