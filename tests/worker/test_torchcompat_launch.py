"""torchcompat.py's other fences, pinned against the installed torch (2.13): torchrun's exit
barrier timeout (the launcher), the default process group a warm child keeps (issue 24) and
a warm child's env:// rendezvous, which waits for rank 0's store (warm/master.py)."""

from __future__ import annotations

import ast
import importlib.util
import inspect
import socket
import sys
import types
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import torch
from elastic_worker import torchcompat
from torch.distributed import HashStore
from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent

from worker.worker_helpers import ROOT

SRC = ROOT / "images" / "worker" / "src" / "elastic_worker"


# -- torchrun's exit barrier (the launcher's fence) ---------------------------------------


def test_the_installed_torch_takes_the_exit_barrier_timeout_through_the_fence() -> None:
    """Pinned against torch 2.13: launch_agent builds `LocalElasticAgent(...)` by its
    module's name with no exit_barrier_timeout of its own (default 300 s), so the fence's
    subclass gives every torchrun agent the job's (launch/test_torchrun.py runs torchrun)."""
    assert torchcompat.exit_barrier_problem() is None, torch.__version__
    default = inspect.signature(LocalElasticAgent.__init__).parameters["exit_barrier_timeout"]
    assert default.default == 300

    class Agent:
        def __init__(self, spec: Any, exit_barrier_timeout: float = 300) -> None:
            self.timeout = exit_barrier_timeout

    api = types.SimpleNamespace(LocalElasticAgent=Agent)
    torchcompat.set_exit_barrier_timeout(7.5, api)
    assert api.LocalElasticAgent(spec=None).timeout == 7.5
    assert api.LocalElasticAgent(None, exit_barrier_timeout=3).timeout == 3  # given: kept
    assert issubclass(api.LocalElasticAgent, Agent)


def _launcher(path: Path, takes_timeout: bool) -> types.SimpleNamespace:
    """A stand-in for torch.distributed.launcher.api: `launch_agent` from the file at
    `path` (inspect reads a function's source from its file), and an agent class that
    takes exit_barrier_timeout or not."""
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    loaded = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(loaded)

    class Agent:
        def __init__(self, spec: Any, exit_barrier_timeout: float = 300) -> None: ...

    class Old:
        def __init__(self, spec: Any) -> None: ...

    agent = Agent if takes_timeout else Old
    return types.SimpleNamespace(launch_agent=loaded.launch_agent, LocalElasticAgent=agent)


@pytest.mark.parametrize(
    ("source", "takes", "problem"),
    [
        ("def launch_agent(spec):\n    agent = LocalElasticAgent(spec=spec)\n", True, None),
        (
            "def launch_agent(spec):\n"
            "    agent = LocalElasticAgent(spec, exit_barrier_timeout=9)\n",
            True,
            "launch_agent passes an exit_barrier_timeout of its own",
        ),
        (
            "def launch_agent(spec):\n    agent = make_agent(spec)\n",
            True,
            "launch_agent builds no LocalElasticAgent by that name",
        ),
        (
            "def launch_agent(spec):\n    agent = LocalElasticAgent(spec=spec)\n",
            False,
            "LocalElasticAgent takes no exit_barrier_timeout",
        ),
    ],
)
def test_a_launcher_the_fence_would_not_reach_is_named(
    tmp_path: Path, source: str, takes: bool, problem: str | None
) -> None:
    """The shapes the fence relies on, each missing in turn: launch/torchrun.py then says
    so in one line and runs torch's torchrun with its own timeout."""
    module = tmp_path / "launcher_api.py"
    module.write_text(source)
    assert torchcompat.exit_barrier_problem(_launcher(module, takes)) == problem


# -- a warm child's default process group, kept for its exit (issue 24) -------------------


def _dist_names(dist: Any) -> types.SimpleNamespace:
    """torch.distributed's names the fence reads and sets, on a namespace of their own (the
    fence then patches the namespace, not the test process's torch)."""
    return types.SimpleNamespace(
        destroy_process_group=dist.destroy_process_group,
        distributed_c10d=types.SimpleNamespace(destroy_process_group=dist.destroy_process_group),
        group=dist.group,
    )


def test_the_installed_torch_keeps_the_destroyed_default_group_through_the_fence() -> None:
    """Pinned against torch 2.13: destroy_process_group is distributed_c10d's under both
    names a script calls it by, group.WORLD is the default group until it is destroyed; the
    fence's destroy_process_group keeps that group (the first only) and is torch's in all
    else. Fails loudly when torch moves either (warm/child.py then keeps nothing and the
    warm server says so once: test_warm.py)."""
    import torch.distributed as dist  # noqa: PLC0415

    assert torchcompat.keep_group_problem(dist) is None, torch.__version__
    assert dist.destroy_process_group is dist.distributed_c10d.destroy_process_group
    names = _dist_names(dist)
    kept: list[object] = []
    torchcompat.keep_destroyed_group(names, kept)
    patched = names.destroy_process_group
    assert patched is names.distributed_c10d.destroy_process_group
    assert patched.__name__ == "destroy_process_group" and patched.__doc__ == (
        dist.destroy_process_group.__doc__
    )
    assert inspect.signature(patched) == inspect.signature(dist.destroy_process_group)
    firsts = []
    for _ in range(2):
        dist.init_process_group("gloo", store=HashStore(), rank=0, world_size=1)
        firsts.append(dist.group.WORLD)
        assert firsts[-1] is not None
        patched()
        assert dist.group.WORLD is None and not dist.is_initialized()  # torch destroyed it
    assert len(kept) == 1 and kept[0] is firsts[0]  # kept alive: the first one only


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        (
            lambda ns: setattr(ns.distributed_c10d, "destroy_process_group", print),
            "torch.distributed.destroy_process_group is not distributed_c10d's",
        ),
        (
            lambda ns: delattr(ns, "distributed_c10d"),
            "torch.distributed.destroy_process_group is not distributed_c10d's",
        ),
        (lambda ns: delattr(ns, "group"), "torch.distributed has no group.WORLD"),
        (
            lambda ns: setattr(ns, "group", types.SimpleNamespace()),
            "torch.distributed has no group.WORLD",
        ),
    ],
    ids=["another-destroy", "no-distributed_c10d", "no-group", "no-WORLD"],
)
def test_a_torch_distributed_the_group_fence_would_not_reach_is_named(
    change: Any, problem: str
) -> None:
    import torch.distributed as dist  # noqa: PLC0415

    names = _dist_names(dist)
    change(names)
    assert torchcompat.keep_group_problem(names) == problem


def test_only_the_fence_replaces_or_names_torchs_destroy_process_group_internals() -> None:
    """distributed_c10d (torch's module behind torch.distributed) is named by the fence
    alone, and only the fence sets destroy_process_group."""
    users = set()
    for path in SRC.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute):
                sets = node.attr == "destroy_process_group" and isinstance(node.ctx, ast.Store)
                found = sets or node.attr == "distributed_c10d"
            else:
                found = isinstance(node, ast.Name) and node.id == "distributed_c10d"
            if found:
                users.add(path.relative_to(SRC).as_posix())
    assert users == {"torchcompat.py"}


# -- a warm child's env:// rendezvous (warm/master.py) --------------------------------------


def test_the_installed_torch_runs_env_rendezvous_through_the_fence(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Pinned against torch 2.13: init_process_group's env:// handler is the entry "env" of
    torch.distributed.rendezvous._rendezvous_handlers; the fence's handler calls the wait
    with the URL and timeout torch's got, then is torch's (its store, rank and world size),
    named as torch's. Fails loudly when torch moves it (the warm server then says so and
    waits for nothing: warm/test_master.py's children show the handler)."""
    rdzv = sys.modules["torch.distributed.rendezvous"]
    assert torchcompat.env_rendezvous_problem(rdzv) is None, torch.__version__
    names = types.SimpleNamespace(_rendezvous_handlers=dict(rdzv._rendezvous_handlers))
    calls: list[tuple[str, Any]] = []
    torchcompat.wait_before_env_rendezvous(names, lambda url, timeout: calls.append((url, timeout)))
    handler = names._rendezvous_handlers["env"]
    assert handler.__name__ == rdzv._rendezvous_handlers["env"].__name__
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    for key, value in {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}.items():
        monkeypatch.setenv(key, value)
    timeout = timedelta(seconds=20)
    rendezvous = handler("env://?rank=0&world_size=1", timeout=timeout)
    assert calls == []  # a generator, as torch's: nothing runs before init asks for it
    store, rank, world = next(rendezvous)
    assert calls == [("env://?rank=0&world_size=1", timeout)]
    assert (rank, world) == (0, 1)
    store.set("key", "value")
    assert store.get("key") == b"value"


def test_a_torch_without_the_env_handler_table_is_named() -> None:
    for names in (types.SimpleNamespace(), types.SimpleNamespace(_rendezvous_handlers={})):
        assert torchcompat.env_rendezvous_problem(names) == (
            "torch.distributed.rendezvous has no env:// handler in _rendezvous_handlers"
        )
