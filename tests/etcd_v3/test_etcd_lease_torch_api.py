"""etcd-lease against torch's RendezvousHandler API of every release from 2.1 to 2.14
(torchapi.py says what it takes, by release).

torch's own handler of each release is its reference implementation of the API: its
dynamic_rendezvous.py is kept in tests/worker/torch_sources (as it shipped). From each:
the methods torch's agent may call, what next_rendezvous returns (a tuple before 2.4,
RendezvousInfo from 2.4), and which names it imports from the rendezvous API (the ones
torchapi.py looks for). Then the handler runs against a real etcd with the installed torch
and with the API shaped as 2.1-2.3 shipped it.
"""

from __future__ import annotations

import ast
import types
from pathlib import Path

import pytest
from lease_helpers import Join, handler, join_all
from testlib import EtcdServer
from torch.distributed.elastic.rendezvous import api
from torch_etcd_v3.rounds import torchapi
from torch_etcd_v3.rounds.handler import EtcdLeaseRendezvousHandler

SOURCES = Path(__file__).parents[1] / "worker" / "torch_sources"
RELEASES = sorted(
    (p.name for p in SOURCES.iterdir() if p.is_dir()),
    key=lambda v: tuple(int(x) for x in v.split(".")),
)


def _handler_class(release: str) -> tuple[ast.ClassDef, set[str]]:
    """torch's DynamicRendezvousHandler of `release`, and the names its module imports
    from the rendezvous API (`from .api import ...`)."""
    tree = ast.parse((SOURCES / release / "dynamic_rendezvous.py").read_text())
    imported = {
        alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module == "api" and node.level == 1
        for alias in node.names
    }
    cls = next(
        n
        for n in ast.walk(tree)
        if isinstance(n, ast.ClassDef) and n.name == "DynamicRendezvousHandler"
    )
    return cls, imported


def test_the_releases_span_the_range_the_handler_is_written_for() -> None:
    assert (RELEASES[0], RELEASES[-1]) == ("2.1.0", "2.14.1")


@pytest.mark.parametrize("release", RELEASES)
def test_every_method_torchs_own_handler_offers_this_one_offers(release: str) -> None:
    cls, _ = _handler_class(release)
    public = {
        n.name
        for n in cls.body
        if isinstance(n, ast.FunctionDef)
        and not n.name.startswith("_")
        and n.name != "from_backend"
    }
    assert public  # the parse found them
    missing = {
        name for name in public - {"settings"} if not hasattr(EtcdLeaseRendezvousHandler, name)
    }
    assert not missing, f"torch {release}'s handler has {missing}"


@pytest.mark.parametrize("release", RELEASES)
def test_next_rendezvous_returns_what_the_release_returns(release: str) -> None:
    cls, imported = _handler_class(release)
    method = next(
        n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "next_rendezvous"
    )
    assert method.returns is not None
    returns_info = ast.unparse(method.returns) == "RendezvousInfo"
    # What torchapi.py reads of a release's API, from the names that release's handler
    # imports: it says RendezvousInfo exactly where torch's own handler returns one.
    shaped = types.SimpleNamespace(**{name: object() for name in imported})
    assert torchapi.returns_info(shaped) is returns_info
    assert returns_info is (tuple(int(x) for x in release.split(".")[:2]) >= (2, 4))
    graceful = "RendezvousGracefulExitError" in imported
    assert graceful is (tuple(int(x) for x in release.split(".")[:2]) >= (2, 3))


def _api_of_2_3() -> types.SimpleNamespace:
    """torch 2.3's rendezvous API as far as torchapi reads it: no RendezvousInfo."""
    names = ("RendezvousClosedError", "RendezvousGracefulExitError")
    return types.SimpleNamespace(**{n: getattr(api, n) for n in names})


def test_with_the_api_of_2_1_to_2_3_next_rendezvous_returns_store_rank_world(
    etcd3: EtcdServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(torchapi, "api", _api_of_2_3())
    results = join_all([handler(etcd3, max_nodes=2) for _ in range(2)])
    assert all(isinstance(r, tuple) and len(r) == 3 for r in results)
    assert sorted(rank for _, rank, _ in results) == [0, 1]
    assert {world for _, _, world in results} == {2}
    store = results[0][0]
    store.set("x", "1")  # the round's store, which 2.1-2.3's agent writes the master to
    assert results[1][0].get("x") == b"1"


def test_with_the_installed_torch_next_rendezvous_returns_rendezvous_info(
    etcd3: EtcdServer,
) -> None:
    results = join_all([handler(etcd3, max_nodes=2) for _ in range(2)])
    assert all(isinstance(r, api.RendezvousInfo) for r in results)
    assert all(r.bootstrap_store_info is not None for r in results)
    assert not handler(etcd3).use_agent_store  # the workers start their own TCPStore


def test_before_2_3_a_spare_of_a_closed_rendezvous_gets_the_closed_error(
    etcd3: EtcdServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(
        torchapi, "api", types.SimpleNamespace(RendezvousClosedError=api.RendezvousClosedError)
    )
    join_all([handler(etcd3, max_nodes=1)])
    spare = Join(handler(etcd3, max_nodes=1))
    handler(etcd3).set_closed()
    with pytest.raises(api.RendezvousClosedError):
        spare.wait(10)


def test_torchs_registry_makes_it_by_name_and_it_says_its_name(etcd3: EtcdServer) -> None:
    made = handler(etcd3, run_id="named")
    assert made.get_backend() == "etcd-lease"
    assert made.get_run_id() == "named"
