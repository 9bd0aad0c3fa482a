"""Every Store operation torch's agents use, against a real etcd with only the v3 API."""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest
import torch.distributed as dist
from etcd3_helpers import connect
from lease_helpers import revision
from testlib import EtcdServer
from torch._C._distributed_c10d import PrefixStore
from torch_etcd_v3.store import EtcdV3Store


def make_store(etcd3: EtcdServer, run_id: str = "job", **conf: str) -> EtcdV3Store:
    return connect(etcd3.endpoint, run_id, **conf)[1]


def test_set_get_bytes_and_str(etcd3: EtcdServer) -> None:
    store = make_store(etcd3)
    store.set("text", "héllo")
    store.set("bin", b"\x00\xff\x01")
    assert store.get("text") == "héllo".encode()
    assert store.get("bin") == b"\x00\xff\x01"


def test_get_waits_for_a_key_set_later(etcd3: EtcdServer) -> None:
    store = make_store(etcd3)
    other = make_store(etcd3)  # another agent: its own client and lease
    threading.Timer(0.5, lambda: other.set("late", "v")).start()
    started = time.monotonic()
    assert store.get("late") == b"v"
    assert 0.4 < time.monotonic() - started < 5


def test_get_of_a_missing_key_times_out_with_the_store_timeout(etcd3: EtcdServer) -> None:
    store = make_store(etcd3)
    store.set_timeout(timedelta(seconds=1))
    started = time.monotonic()
    with pytest.raises(dist.DistStoreError, match="missing"):
        store.get("missing")
    assert 0.9 < time.monotonic() - started < 4


def test_wait_with_its_own_timeout(etcd3: EtcdServer) -> None:
    store = make_store(etcd3)
    store.set("a", "1")
    started = time.monotonic()
    with pytest.raises(dist.DistStoreError, match="/b"):
        store.wait(["a", "b"], timedelta(seconds=1))
    assert 0.9 < time.monotonic() - started < 4
    threading.Timer(0.3, lambda: store.set("b", "2")).start()
    store.wait(["a", "b"], timedelta(seconds=10))


def test_add_from_many_threads_loses_no_increment(etcd3: EtcdServer) -> None:
    stores = [make_store(etcd3) for _ in range(4)]
    results: list[int] = []
    lock = threading.Lock()

    def work(store: EtcdV3Store) -> None:
        for _ in range(10):
            value = store.add("counter", 1)
            with lock:
                results.append(value)

    threads = [threading.Thread(target=work, args=(s,)) for s in stores]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert sorted(results) == list(range(1, 41))
    assert stores[0].add("counter", 0) == 40
    assert stores[0].add("counter", -5) == 35


def test_compare_set_follows_torch_semantics(etcd3: EtcdServer) -> None:
    store = make_store(etcd3)
    assert store.compare_set("k", "x", "y") == b"x"  # absent, expected not empty: no write
    assert not store.check(["k"])
    assert store.compare_set("k", "", "first") == b"first"  # absent + empty expected: create
    assert store.compare_set("k", "wrong", "second") == b"first"
    assert store.compare_set("k", "first", "second") == b"second"
    assert store.get("k") == b"second"


def test_check_delete_and_num_keys(etcd3: EtcdServer) -> None:
    store = make_store(etcd3)
    other_job = make_store(etcd3, run_id="other")
    other_job.set("x", "1")
    assert store.num_keys() == 0
    store.set("a", "1")
    store.set("b", "2")
    assert store.check(["a", "b"])
    assert not store.check(["a", "c"])
    assert store.num_keys() == 2
    assert store.delete_key("a")
    assert not store.delete_key("a")
    assert not store.check(["a"])
    assert store.num_keys() == 1


def test_multi_set_multi_get_and_append_through_prefix_store(etcd3: EtcdServer) -> None:
    # torch's agent reaches the store through a PrefixStore (C++), as here. The Python
    # object must outlive the PrefixStore (dynamic rendezvous holds it), or C++ finds no
    # override.
    inner = make_store(etcd3)
    store = PrefixStore("torch.rendezvous.job.0", inner)
    # torch 2.13's stub lacks PrefixStore.multi_set and .append; the binding has them.
    store.multi_set(["r0", "r1"], ["zero", "one"])  # type: ignore[attr-defined]
    assert store.multi_get(["r1", "r0"]) == [b"one", b"zero"]
    store.append("r0", "+more")  # type: ignore[attr-defined]
    assert store.get("r0") == b"zero+more"
    store.set_timeout(timedelta(seconds=1))
    with pytest.raises(dist.DistStoreError):
        store.multi_get(["r0", "never"])


def test_multi_set_and_multi_get_of_more_keys_than_one_etcd_transaction_takes(
    etcd3: EtcdServer,
) -> None:
    # torch's rank assignment multi_gets one key per agent; etcd allows 128 operations in
    # a transaction (--max-txn-ops): a 300-node job must still work.
    store = make_store(etcd3)
    keys = [f"role_info/{i}" for i in range(300)]
    store.multi_set(keys, [str(i) for i in range(300)])
    assert store.multi_get(keys) == [str(i).encode() for i in range(300)]
    assert store.check(keys)
    store.set_timeout(timedelta(seconds=1))
    with pytest.raises(dist.DistStoreError, match="role_info/300"):
        store.multi_get([*keys, "role_info/300"])


def test_add_of_one_is_one_write_without_a_retry_and_other_amounts_and_set_mix(
    etcd3: EtcdServer,
) -> None:
    """add(key, 1), torch 2.4+'s exit barrier, is one transaction whatever the number of
    agents adding at once (the key's version counts them); other amounts and a value set()
    wrote take a compare-and-set; every read sees the decimal value, as TCPStore keeps it."""
    store = make_store(etcd3)
    before = revision(etcd3)
    assert [store.add("n", 1) for _ in range(3)] == [1, 2, 3]
    assert revision(etcd3) - before == 3  # one write each
    assert store.add("n", 5) == 8
    assert store.add("n", 1) == 9
    assert store.add("n", -2) == 7
    assert store.get("n") == b"7"
    assert store.multi_get(["n"]) == [b"7"]
    store.set("s", "40")
    assert store.add("s", 1) == 41
    assert store.add("s", 1) == 42
    assert store.get("s") == b"42"
    assert store.compare_set("s", "42", "x") == b"x"
