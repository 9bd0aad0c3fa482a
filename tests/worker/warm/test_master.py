"""warm/master.py: a rank other than 0 connects to rank 0's store once it listens, from
inside its env:// rendezvous; a warm child gets that rendezvous from the server."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from elastic_worker.warm import master
from elastic_worker.warm import server as warm

from worker.warm.warmlib import client

ENV = {"RANK": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}


@pytest.mark.parametrize(
    ("url", "env", "expected"),
    [
        ("env://", ENV, ("127.0.0.1", 29500)),
        ("env://?rank=2&world_size=3", {**ENV, "RANK": "0"}, ("127.0.0.1", 29500)),
        ("env://", {**ENV, "RANK": "0"}, None),  # rank 0 hosts the store
        ("env://?rank=0&world_size=3", ENV, None),
        ("env://", {**ENV, master.AGENT_STORE_ENV: "True"}, None),  # torchrun's agent hosts it
        ("env://", {**ENV, "MASTER_PORT": ""}, None),  # torch says what is missing
        ("env://", {k: v for k, v in ENV.items() if k != "MASTER_ADDR"}, None),
        ("env://", {k: v for k, v in ENV.items() if k != "RANK"}, None),
    ],
)
def test_only_a_rank_other_than_0_without_the_agents_store_waits(
    url: str, env: dict[str, str], expected: tuple[str, int] | None
) -> None:
    assert master.master_to_wait_for(url, env) == expected


@pytest.fixture
def bound() -> Iterator[socket.socket]:
    """A port bound but not listening: connections to it are refused, as to a rank 0 that
    has not created its store yet."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    yield sock
    sock.close()


def _env(monkeypatch: pytest.MonkeyPatch, port: int) -> None:
    for key, value in {**ENV, "MASTER_PORT": str(port)}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv(master.AGENT_STORE_ENV, raising=False)


def test_it_returns_once_rank_0_listens_and_not_before(
    bound: socket.socket, monkeypatch: pytest.MonkeyPatch
) -> None:
    _env(monkeypatch, bound.getsockname()[1])
    waiter = threading.Thread(target=master.wait_for_master, args=("env://",), daemon=True)
    waiter.start()
    waiter.join(0.5)
    assert waiter.is_alive()  # refused, again and again
    bound.listen(1)
    waiter.join(10)
    assert not waiter.is_alive()


def test_it_gives_up_at_the_rendezvous_timeout(
    bound: socket.socket, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Then torch connects (and fails) as it would have: its own error, its own timeout."""
    _env(monkeypatch, bound.getsockname()[1])
    waiter = threading.Thread(
        target=master.wait_for_master, args=("env://", timedelta(seconds=0.2)), daemon=True
    )
    waiter.start()
    waiter.join(10)
    assert not waiter.is_alive()


def test_anything_but_a_refused_connection_is_left_to_torch(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An address that does not resolve: no wait (the timeout is torch's 30 min default)."""
    _env(monkeypatch, 29500)
    monkeypatch.setenv("MASTER_ADDR", "no-such-host.invalid")
    master.wait_for_master("env://")


RANK_1 = """
import sys, torch, torch.distributed as dist
handler = sys.modules["torch.distributed.rendezvous"]._rendezvous_handlers["env"]
print("wrapped", hasattr(handler, "__wrapped__"), flush=True)
dist.init_process_group("gloo")
t = torch.ones(1)
dist.all_reduce(t)
print("sum", int(t.item()), flush=True)
dist.destroy_process_group()
"""
RANK_0 = """
import torch, torch.distributed as dist
dist.init_process_group("gloo")
t = torch.ones(1)
dist.all_reduce(t)
dist.destroy_process_group()
"""


@pytest.mark.slow
def test_a_warm_rank_1_started_before_rank_0_joins_through_torchs_store(
    server: warm.Handle, tmp_path: Path, bound: socket.socket
) -> None:
    """The server's children run env:// through the wait (the handler is torch's, wrapped),
    and a rank 1 whose script reaches init_process_group before rank 0 exists joins once rank
    0 (a cold interpreter) creates the store: the group forms and a collective runs."""
    port = bound.getsockname()[1]
    bound.close()  # rank 0's store binds it
    env = {
        **os.environ,
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
        "WORLD_SIZE": "2",
        "GLOO_SOCKET_IFNAME": "lo",
    }
    env.pop(master.AGENT_STORE_ENV, None)
    (tmp_path / "rank1.py").write_text(RANK_1)
    (tmp_path / "rank0.py").write_text(RANK_0)
    rank1 = subprocess.Popen(
        client(server, str(tmp_path / "rank1.py")),
        env={**env, "RANK": "1"},
        stdout=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
    )
    assert rank1.stdout is not None
    assert rank1.stdout.readline().split() == ["wrapped", "True"]
    rank0 = subprocess.run(
        [sys.executable, str(tmp_path / "rank0.py")],
        env={**env, "RANK": "0"},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    out, _ = rank1.communicate(timeout=60)
    assert rank0.returncode == 0, rank0.stderr
    assert rank1.returncode == 0
    assert out.split() == ["sum", "2"]
