"""etcd-lease's rounds as torch's agent and elastic-worker use them, against a real etcd
(3.4 and 3.5, v2 API off): a round forms, takes spares and newcomers, loses members (taken
out, silent, shut down) and closes at the end of the job."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
import time
from datetime import timedelta
from pathlib import Path

import pytest
from lease_helpers import Join, handler, join_all, keys_under, revision
from testlib import EtcdServer
from torch.distributed import DistStoreError
from torch.distributed.elastic.rendezvous import (
    RendezvousClosedError,
    RendezvousGracefulExitError,
)
from torch_etcd_v3.rounds.view import Rounds
from worker.worker_helpers import wait_until

PREFIX = b"/torch/elastic/rounds/job/"


def rounds(etcd: EtcdServer, run_id: str = "job") -> Rounds:
    return Rounds.connect(etcd.endpoint, run_id, {})


def test_a_bring_up_at_max_nodes_forms_one_round_with_every_rank_and_one_master(
    etcd3: EtcdServer,
) -> None:
    hs = [handler(etcd3, max_nodes=4) for _ in range(4)]
    infos = join_all(hs)
    assert sorted(i.rank for i in infos) == [0, 1, 2, 3]
    assert {i.world_size for i in infos} == {4}
    masters = {
        (i.bootstrap_store_info.master_addr, i.bootstrap_store_info.master_port) for i in infos
    }
    assert len(masters) == 1 and next(iter(masters))[1] > 0
    assert [h.num_nodes_waiting() for h in hs] == [0, 0, 0, 0]
    # The round's store is one per round, shared by its members (torch's rank assignment).
    infos[0].store.set("k", "v")
    assert infos[3].store.get("k") == b"v"


def test_fewer_than_max_form_after_the_last_call_and_a_later_node_is_waiting(
    etcd3: EtcdServer,
) -> None:
    first = [handler(etcd3, min_nodes=2, max_nodes=3) for _ in range(2)]
    started = time.monotonic()
    join_all(first)
    assert time.monotonic() - started >= 1.0  # the last call (1 s) waited for a third
    late = handler(etcd3, min_nodes=2, max_nodes=3)
    joining = Join(late)
    # torch's agent asks every monitor interval; the answer comes from a watch.
    wait_until(
        "the members to see the late node",
        lambda: all(h.num_nodes_waiting() > 0 for h in first),
        10,
    )
    infos = [*join_all(first), joining.wait()]
    assert {i.world_size for i in infos} == {3}
    assert sorted(i.rank for i in infos) == [0, 1, 2]


def test_nodes_beyond_max_wait_as_spares_that_nobody_restarts_for_and_one_takes_a_lost_place(
    etcd3: EtcdServer,
) -> None:
    members = [handler(etcd3, min_nodes=1, max_nodes=3) for _ in range(3)]
    ranks = {i.rank: h for i, h in zip(join_all(members), members, strict=True)}
    spare = handler(etcd3, min_nodes=1, max_nodes=3)
    waiting = Join(spare)
    time.sleep(1.5)
    assert waiting.thread.is_alive()  # a spare: the round is full
    assert [h.num_nodes_waiting() for h in members] == [0, 0, 0]  # no restart for it
    lost = ranks[1]
    assert rounds(etcd3).take_out(str(lost.node))  # its lifeline closed: whoever saw it
    survivors = [ranks[0], ranks[2]]
    wait_until(
        "the survivors to see the loss", lambda: all(h.num_nodes_waiting() for h in survivors), 10
    )
    before = revision(etcd3)
    infos = [*join_all(survivors), waiting.wait()]
    # The round was re-formed by the take-out: the survivors adopt it, writing nothing.
    assert revision(etcd3) == before
    assert {i.world_size for i in infos} == {3}
    assert sorted(i.rank for i in infos) == [0, 1, 2]
    assert infos[0].rank == 0  # rank 0 stays where it was


def test_a_silent_member_is_dropped_when_its_lease_lapses_and_the_others_re_form(
    etcd3: EtcdServer,
) -> None:
    hs = [handler(etcd3, min_nodes=1, max_nodes=3) for _ in range(3)]
    join_all(hs)
    frozen = hs[2]
    frozen.rendezvous.membership.stop()  # no more keep-alives: a frozen node, a cut link
    lapsed = time.monotonic()
    wait_until("the lease to lapse", lambda: all(h.num_nodes_waiting() for h in hs[:2]), 10)
    assert time.monotonic() - lapsed < 3 + 2  # its TTL (1 s x 3) and etcd's expiry tick
    infos = join_all(hs[:2])
    assert {i.world_size for i in infos} == {2}


def test_a_member_out_of_restarts_leaves_and_the_others_go_on(etcd3: EtcdServer) -> None:
    hs = [handler(etcd3, min_nodes=1, max_nodes=3) for _ in range(3)]
    join_all(hs)
    assert hs[0].shutdown()  # torch's launcher after its agent failed
    assert not hs[1].is_closed()  # torch's own would close the rendezvous for everyone
    wait_until("the others to see it gone", lambda: all(h.num_nodes_waiting() for h in hs[1:]), 10)
    assert {i.world_size for i in join_all(hs[1:])} == {2}


def test_the_job_done_closes_the_rendezvous_and_a_spare_ends_gracefully(
    etcd3: EtcdServer,
) -> None:
    members = [handler(etcd3, min_nodes=1, max_nodes=2) for _ in range(2)]
    join_all(members)
    spare = Join(handler(etcd3, min_nodes=1, max_nodes=2))
    time.sleep(1)
    for h in members:  # every member's agent ends: torch's launcher calls shutdown()
        assert h.shutdown()
    with pytest.raises(RendezvousGracefulExitError):
        spare.wait()
    assert rounds(etcd3).is_closed()
    with pytest.raises(RendezvousClosedError):
        handler(etcd3).next_rendezvous()
    # Every node left: no membership key stays.
    assert not [k for k in keys_under(etcd3, PREFIX + b"m/")]


def test_a_handler_made_only_to_ask_is_no_node_of_the_job(etcd3: EtcdServer) -> None:
    before = revision(etcd3)
    asker = handler(etcd3)
    assert not asker.is_closed()
    assert asker.num_nodes_waiting() == 0
    assert asker.node is None
    assert revision(etcd3) == before  # it wrote nothing


def test_set_closed_ends_every_waiting_node(etcd3: EtcdServer) -> None:
    waiting = Join(handler(etcd3, min_nodes=2, max_nodes=2))
    time.sleep(0.5)
    handler(etcd3).set_closed()
    with pytest.raises(RendezvousClosedError):
        waiting.wait(10)


def test_a_node_whose_lease_lapsed_while_it_waited_joins_again_under_a_new_id(
    etcd3: EtcdServer,
) -> None:
    a, b = handler(etcd3, min_nodes=2, max_nodes=2), handler(etcd3, min_nodes=2, max_nodes=2)
    waiting = Join(a)
    wait_until("a's lease", lambda: a.node is not None, 5)
    old = a.node
    rounds(etcd3).take_out(str(old))  # as when etcd loses it: its keys go
    time.sleep(0.5)
    infos = [Join(b).wait(), waiting.wait()]
    assert {i.world_size for i in infos} == {2}
    assert a.node != old


def test_a_node_whose_process_exits_leaves_at_once_not_after_its_lease(
    etcd3: EtcdServer, tmp_path: Path
) -> None:
    """A torchrun stopped by a signal never calls shutdown(): the handler leaves at exit,
    so that the others need not wait for its lease (3 s here; with the default 5 s x 3)."""
    script = tmp_path / "node.py"
    script.write_text(
        textwrap.dedent(
            f"""
            from torch.distributed.elastic.rendezvous import RendezvousParameters
            from torch.distributed.elastic.rendezvous.registry import get_rendezvous_handler
            params = RendezvousParameters("etcd-lease", "{etcd3.endpoint}", "job", 1, 2,
                                          last_call_timeout=1, keep_alive_interval=30)
            get_rendezvous_handler(params).next_rendezvous()
            print("joined", flush=True)
            input()
            """
        )
    )
    node = subprocess.Popen(
        [sys.executable, str(script)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert node.stdout is not None and node.stdout.readline() == "joined\n"
    assert keys_under(etcd3, PREFIX + b"m/")
    node.communicate("\n", timeout=30)  # it exits (its lease would last 90 s)
    assert not keys_under(etcd3, PREFIX + b"m/")


@pytest.mark.slow
def test_a_heartbeat_keeps_an_idle_member_for_many_lease_lives(etcd3: EtcdServer) -> None:
    hs = [handler(etcd3, min_nodes=2, max_nodes=2) for _ in range(2)]
    join_all(hs)
    time.sleep(7)  # over two leases of 3 s
    assert [h.num_nodes_waiting() for h in hs] == [0, 0]
    assert len(keys_under(etcd3, PREFIX + b"m/")) == 2


def test_the_worker_reads_the_round_and_a_nodes_ring_of_neighbours(etcd3: EtcdServer) -> None:
    hs = [handler(etcd3, max_nodes=4) for _ in range(4)]
    infos = join_all(hs)
    view = rounds(etcd3)
    now = view.current()
    assert now is not None and len(now.members) == 4
    by_rank = {i.rank: h for i, h in zip(infos, hs, strict=True)}
    first = str(by_rank[0].node)
    assert [m.rank for m in view.neighbours(first, 2)] == [1, 2]
    last = str(by_rank[3].node)
    assert [m.rank for m in view.neighbours(last, 2)] == [0, 1]  # a ring
    member = view.neighbours(first, 1)[0]
    assert member.info is not None and member.info.addr == "127.0.0.1"
    assert view.find("127.0.0.1", member.info.pid) is not None
    assert view.broken(first) is None
    view.take_out(last)
    assert view.broken(first) is None  # re-formed without it at once
    assert view.current() is not None and len(view.current().members) == 3  # type: ignore[union-attr]


def test_a_member_waiting_in_the_rounds_store_for_a_dead_member_stops_at_once(
    etcd3: EtcdServer,
) -> None:
    """torch's agent reads the ranks a round's rank 0 writes after the round forms; a member
    lost then leaves the others waiting in the store for a key nobody will write (300 s,
    the store's timeout). Here the wait ends as the round is re-formed without it."""
    hs = [handler(etcd3, min_nodes=1, max_nodes=3) for _ in range(3)]
    infos = join_all(hs)
    store = infos[0].store
    store.set_timeout(timedelta(seconds=60))
    started = time.monotonic()
    lost = threading.Timer(1.0, lambda: rounds(etcd3).take_out(str(hs[2].node)))
    lost.start()
    with pytest.raises(DistStoreError, match="etcd-lease"):
        store.get("torchelastic/assigned_ranks/2")
    assert time.monotonic() - started < 10
    lost.join(10)  # its re-form written before etcd stops
