"""The worker's settings are defined once (settings.py): config.py reads only what the
table defines, nothing else in the package reads a setting from the environment, and
docs/contracts.md holds the table generated from it."""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

from elastic_worker.settings import config
from elastic_worker.settings.definitions import BY_NAME, SETTINGS

from worker.worker_helpers import ROOT

SRC = ROOT / "images" / "worker" / "src" / "elastic_worker"


class Recording(dict[str, str]):
    """An environment that remembers every name read from it."""

    def __init__(self, *args: object, **kwargs: str) -> None:
        super().__init__(*args, **kwargs)
        self.read: set[str] = set()

    def get(self, key: str, default: str | None = None) -> str | None:  # type: ignore[override]
        self.read.add(key)
        return super().get(key, default)

    def __getitem__(self, key: str) -> str:
        self.read.add(key)
        return super().__getitem__(key)

    def __contains__(self, key: object) -> bool:
        self.read.add(str(key))
        return super().__contains__(key)


def test_config_reads_every_defined_variable_and_nothing_else(tmp_path: Path) -> None:
    (tmp_path / "token").write_text("t")
    env = Recording(
        ELASTIC_JOB_ID="j",
        ELASTIC_RDZV_ENDPOINT="etcd:2379",
        ELASTIC_MIN_NODES="1",
        ELASTIC_MAX_NODES="2",
        ELASTIC_INJECT_ENV="/nonexistent",
        ELASTIC_SERVICEACCOUNT_DIR=str(tmp_path),
        KUBERNETES_SERVICE_HOST="10.0.0.1",
    )
    assert config.load(["train.py"], env).kube_api is not None
    assert env.read == set(BY_NAME)


def test_names_are_unique_and_required_ones_have_no_default() -> None:
    assert len(BY_NAME) == len(SETTINGS)
    for setting in SETTINGS:
        assert setting.meaning and setting.chart, setting.name


def _environ_reads() -> Iterator[tuple[str, int]]:
    for path in sorted(SRC.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr in {"environ", "getenv"}:
                yield path.relative_to(SRC).as_posix(), node.lineno


def test_only_config_reads_settings_from_os_environ() -> None:
    """pod.py passes os.environ on as torchrun's environment; the warm start carries a
    training process's environment whole (warm/client.py sends it, warm/child.py installs
    it, warm/master.py reads torchrun's RANK and MASTER_* there) and reads no setting from
    it; nothing else touches it."""
    carriers = ["warm/child.py", "warm/client.py", "warm/master.py"]
    assert sorted({name for name, _ in _environ_reads()}) == [
        "pod.py",
        "settings/config.py",
        *carriers,
    ]
    for name in carriers:
        tree = ast.parse((SRC / name).read_text())
        strings = {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant)}
        assert not set(BY_NAME) & strings, name
    pod_uses = [line for name, line in _environ_reads() if name == "pod.py"]
    assert len(pod_uses) == 1
    line = (SRC / "pod.py").read_text().splitlines()[pod_uses[0] - 1]
    assert "argv.build_env(" in line


def test_the_contracts_table_is_generated_from_the_definition() -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gen-worker-settings-doc"), "--check"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    doc = (ROOT / "docs" / "contracts.md").read_text()
    for setting in SETTINGS:
        assert f"| `{setting.name}` |" in doc
