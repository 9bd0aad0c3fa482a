"""etcd-lease when its etcd comes back empty (the bundled etcd's pod made again on an
emptyDir): every lease, round and decision is gone and etcd's revisions count from 1
again. The members see their round end, join anew, and a round forms; a node waiting for a
decision is not left watching a revision etcd will not reach for a long time."""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest
from lease_helpers import Join, handler, join_all
from test_etcd_v3_etcd_return import Member
from worker.worker_helpers import wait_until


@pytest.fixture(params=["3.4", "3.5"], ids=lambda v: f"etcd{v}")
def member(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Member]:
    etcd = Member(tmp_path, request.param)
    etcd.start()
    yield etcd
    etcd.stop()


def _as_server(member: Member) -> SimpleNamespace:
    """What lease_helpers.handler reads of a test etcd: its endpoint."""
    return SimpleNamespace(endpoint=member.url.removeprefix("http://"))


def test_a_round_forms_again_after_etcd_came_back_without_its_data(
    member: Member, tmp_path: Path
) -> None:
    server = _as_server(member)
    hs = [handler(server, min_nodes=2, max_nodes=2) for _ in range(2)]  # type: ignore[arg-type]
    join_all(hs)
    # Many writes first, so that the old revisions are far beyond the new etcd's.
    for _ in range(30):
        hs[0].rendezvous.client.put(b"/pad", b"x")
    member.stop()
    shutil.rmtree(tmp_path / "data")
    member.start()
    # The members' leases are gone with the data: their round is over.
    wait_until(
        "the members to see their round end", lambda: all(h.num_nodes_waiting() for h in hs), 20
    )
    started = time.monotonic()
    infos = [Join(h) for h in hs]
    results = [j.wait(30) for j in infos]
    assert {r.world_size for r in results} == {2}
    assert sorted(r.rank for r in results) == [0, 1]
    assert time.monotonic() - started < 10  # not a fallback's worth of waits per step
