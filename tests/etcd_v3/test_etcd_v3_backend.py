"""The rendezvous state: compare-and-set under many writers, leases, the torch registry."""

from __future__ import annotations

import json
import logging
import multiprocessing
import os
import threading
import time
import urllib.request
from types import SimpleNamespace

import pytest
from etcd3_helpers import connect
from testlib import EtcdServer
from torch.distributed.elastic.rendezvous import RendezvousParameters
from torch.distributed.elastic.rendezvous.registry import get_rendezvous_handler
from torch_etcd_v3 import backend as backend_module
from torch_etcd_v3 import backoff as backoff_module
from torch_etcd_v3 import config
from torch_etcd_v3 import handler as handler_module
from torch_etcd_v3.backend import EtcdV3RendezvousBackend


def _increment(backend: EtcdV3RendezvousBackend, times: int) -> int:
    """Add 1 to the state `times` times by compare-and-set, as dynamic rendezvous does:
    on a lost race, retry from the state set_state returned. Returns the retries."""
    retries = 0
    current = backend.get_state()
    for _ in range(times):
        while True:
            if current is None:
                result = backend.set_state(b"1", None)
            else:
                value, token = current
                result = backend.set_state(str(int(value) + 1).encode(), token)
            assert result is not None
            state, token, won = result
            current = (state, token)
            if won:
                break
            retries += 1
    return retries


def _process_writer(endpoint: str, times: int, out: multiprocessing.Queue[int]) -> None:
    backend = connect(endpoint)[0]
    out.put(_increment(backend, times))


def test_compare_and_set_loses_no_write_among_threads(etcd3: EtcdServer) -> None:
    backends = [connect(etcd3.endpoint)[0] for _ in range(6)]
    retries: list[int] = []
    threads = [
        threading.Thread(target=lambda b=b: retries.append(_increment(b, 15))) for b in backends
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    state = backends[0].get_state()
    assert state is not None
    assert state[0] == b"90"
    assert sum(retries) > 0, "the writers never raced: the test proves nothing"


@pytest.mark.slow
def test_compare_and_set_loses_no_write_among_processes(etcd3: EtcdServer) -> None:
    ctx = multiprocessing.get_context("spawn")
    out: multiprocessing.Queue[int] = ctx.Queue()
    procs = [ctx.Process(target=_process_writer, args=(etcd3.endpoint, 10, out)) for _ in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    state = connect(etcd3.endpoint)[0].get_state()
    assert state is not None
    assert state[0] == b"40"


def test_a_lost_write_backs_off_doubling_up_to_half_a_second_and_a_won_one_resets(
    etcd3: EtcdServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After each lost compare-and-set in a row the agent waits longer (at random, up to
    10 ms x 2^n in a job of up to 32 nodes, never above 0.5 s there: a heartbeat must
    still land within 1 s x 3), then gets the state as the winner left it; a won write
    waits for nothing."""
    waits: list[float] = []
    monkeypatch.setattr(backoff_module, "random", SimpleNamespace(uniform=lambda lo, hi: hi))
    monkeypatch.setattr(backend_module, "time", SimpleNamespace(sleep=waits.append))
    backend = connect(etcd3.endpoint, keep_alive_interval="1")[0]
    first = backend.set_state(b"a")
    assert first is not None and first[2]
    second = backend.set_state(b"b", first[1])
    assert second is not None and second[2]
    for _ in range(8):  # a stale token: lost every time
        assert backend.set_state(b"stale", first[1]) == (b"b", second[1], False)
    assert waits == [0.02, 0.04, 0.08, 0.16, 0.32, 0.5, 0.5, 0.5]
    waits.clear()
    won = backend.set_state(b"c", second[1])
    assert won is not None and won[2]
    assert backend.set_state(b"stale", first[1]) == (b"c", won[1], False)
    assert waits == [0.02]  # the win reset the count


@pytest.mark.parametrize(
    ("max_nodes", "interval", "first", "most"),
    [
        (3, None, 0.01, 0.625),  # torch's keep-alive interval: 5 s
        (32, "1", 0.01, 0.5),
        (33, "2", 0.02, 0.5),
        (128, "4", 0.04, 0.5),
        (256, "8", 0.08, 1.0),
    ],
)
def test_the_backoff_grows_with_the_job_and_a_heartbeat_still_lands_in_its_window(
    max_nodes: int, interval: str | None, first: float, most: float
) -> None:
    """The more nodes may join together, the longer the first wait (10 ms per 32); the
    longest stays within half the keep-alive interval, so a joined agent's heartbeat that
    loses a race still lands within interval x attempts and nobody is evicted."""
    conf = {} if interval is None else {"keep_alive_interval": interval}
    params = RendezvousParameters("etcd-v3", "127.0.0.1:2379", "job", 1, max_nodes, **conf)
    backoff = config.load(params).backoff
    assert (backoff.first, backoff.most) == (pytest.approx(first), pytest.approx(most))
    assert backoff.most <= int(interval or config.TORCH_KEEP_ALIVE_INTERVAL) / 2


def test_stale_or_foreign_token_does_not_write(etcd3: EtcdServer) -> None:
    backend = connect(etcd3.endpoint)[0]
    assert backend.get_state() is None
    first = backend.set_state(b"a")
    assert first is not None and first[2]
    assert backend.set_state(b"b", None) == (b"a", first[1], False)  # exists already
    second = backend.set_state(b"b", first[1])
    assert second is not None and second[2]
    assert backend.set_state(b"c", first[1]) == (b"b", second[1], False)  # stale token
    assert backend.set_state(b"c", "not-a-revision") == (b"b", second[1], False)


def test_runs_do_not_share_state(etcd3: EtcdServer) -> None:
    one = connect(etcd3.endpoint, "run-one")[0]
    two = connect(etcd3.endpoint, "run-two")[0]
    one.set_state(b"1")
    assert two.get_state() is None


def _leases(etcd3: EtcdServer) -> list[str]:
    req = urllib.request.Request(f"{etcd3.url}/v3/lease/leases", data=b"{}", method="POST")
    with urllib.request.urlopen(req, timeout=5) as resp:
        return [lease["ID"] for lease in json.load(resp).get("leases") or []]


@pytest.mark.slow
def test_keys_live_while_kept_alive_and_expire_after_the_agent_stops(etcd3: EtcdServer) -> None:
    backend, store = connect(etcd3.endpoint, lease_ttl="2")
    backend.set_state(b"state")
    store.set("k", "v")
    assert len(_leases(etcd3)) == 1, "one lease per agent, shared by the state and the store"
    time.sleep(4)  # twice the TTL: only the keep-alive keeps them
    assert backend.get_state() is not None
    assert store.check(["k"])
    store.lease.stop()  # what an agent's exit (or SIGKILL) does to its keep-alive
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and backend.get_state() is not None:
        time.sleep(0.2)
    assert backend.get_state() is None
    assert not store.check(["k"])
    assert _leases(etcd3) == []


def test_torch_registry_finds_etcd_v3_through_the_entry_point(
    etcd3: EtcdServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(handler_module.SHARED_STORE_SWITCH, raising=False)
    handler = get_rendezvous_handler(
        RendezvousParameters("etcd-v3", etcd3.endpoint, "reg", 1, 1, last_call_timeout="1")
    )
    assert handler.get_backend() == "etcd-v3"
    # torch's shared TCPStore off (test_etcd_v3_torchrun: a node joining a later round)
    assert os.environ[handler_module.SHARED_STORE_SWITCH] == "1"
    assert handler.use_agent_store is False
    info = handler.next_rendezvous()
    assert (info.rank, info.world_size) == (0, 1)
    handler.set_closed()  # type: ignore[no-untyped-call]  # untyped in torch 2.13
    assert handler.is_closed()
    handler.shutdown()


def test_a_user_who_chose_torchs_shared_store_keeps_it_and_is_warned(
    etcd3: EtcdServer, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv(handler_module.SHARED_STORE_SWITCH, "0")
    with caplog.at_level(logging.WARNING, logger=handler_module.__name__):
        handler = get_rendezvous_handler(
            RendezvousParameters("etcd-v3", etcd3.endpoint, "reg", 1, 1)
        )
    assert handler.use_agent_store is True
    assert "a node that joins a later round can wait for MASTER_ADDR" in caplog.text


def test_a_lost_lease_is_replaced_on_the_next_write(etcd3: EtcdServer) -> None:
    # etcd forgets a lease it could not renew (unreachable longer than the TTL) or that
    # an operator revoked: the agent's next writes must still succeed.
    backend, store = connect(etcd3.endpoint)
    first = backend.set_state(b"state")
    assert first is not None
    lost = _leases(etcd3)
    req = urllib.request.Request(
        f"{etcd3.url}/v3/lease/revoke", data=json.dumps({"ID": lost[0]}).encode(), method="POST"
    )
    urllib.request.urlopen(req, timeout=5).close()
    assert backend.get_state() is None  # the revoke took the state with it
    store.set("k", "v")
    assert store.get("k") == b"v"
    again = backend.set_state(b"state")
    assert again is not None and again[2]
    store.multi_set(["a"], ["1"])
    assert store.add("n", 1) == 1
    assert _leases(etcd3) not in ([], lost)
