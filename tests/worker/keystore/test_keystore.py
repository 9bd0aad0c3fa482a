"""kvstore.KeyStore, the one interface of the worker's own keys, on both backends against a
real etcd: etcd-v2 (v2 keys API, TTLs) with the v2 API on, etcd-v3 (v3 API, leases) with
it off. Completion, epoch, members and round liveness rely on exactly these behaviours."""

from __future__ import annotations

import base64
import http.server
import json
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator

import pytest
from elastic_worker.keystore import interface as kvstore
from elastic_worker.keystore.interface import KeyStore
from testlib import ETCD_VERSIONS, EtcdServer, free_port

from worker.worker_helpers import BACKENDS, backend_etcd, keystore, wait_until


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(params=ETCD_VERSIONS, ids=lambda v: f"etcd{v}")
def server(
    etcd_factory: Callable[..., EtcdServer], backend: str, request: pytest.FixtureRequest
) -> EtcdServer:
    """Debian's etcd 3.4 and the official 3.5 (scripts/bootstrap)."""
    return backend_etcd(etcd_factory, backend, request.param)


@pytest.fixture
def store(server: EtcdServer, backend: str) -> KeyStore:
    return keystore(server, backend)


def test_connect_speaks_the_backends_api(store: KeyStore, backend: str) -> None:
    """ELASTIC_RDZV_BACKEND picks the API: v2 for etcd-v2, v3 for etcd-v3 (whose etcd here
    has no v2 API at all), and the API answers."""
    assert store.api == {"etcd-v2": "v2", "etcd-v3": "v3"}[backend]
    store.check_api()
    assert store.server_version().startswith("3.")


def test_get_set_and_delete(store: KeyStore) -> None:
    assert store.get_value("/elastic-job/kv/a") is None
    store.set("/elastic-job/kv/a", "1")
    assert store.get_value("/elastic-job/kv/a") == "1"
    store.set("/elastic-job/kv/a", "2")
    assert store.get_value("/elastic-job/kv/a") == "2"
    store.delete("/elastic-job/kv/a")
    assert store.get_value("/elastic-job/kv/a") is None
    store.delete("/elastic-job/kv/a")  # already gone: no error


def test_create_only_once(store: KeyStore) -> None:
    """prev_exist=False (the completion marker, the epoch's first move, a round's marker):
    the first writer wins, the next gets NodeExists and the value stays."""
    store.set("/elastic-job/kv/complete", "first", prev_exist=False)
    with pytest.raises(kvstore.NodeExists):
        store.set("/elastic-job/kv/complete", "second", prev_exist=False)
    assert store.get_value("/elastic-job/kv/complete") == "first"


def test_compare_and_swap_on_the_previous_value(store: KeyStore) -> None:
    """prev_value (the epoch's N -> N+1): one of two racing pods moves it."""
    with pytest.raises(kvstore.KeyNotFound):
        store.set("/elastic-job/kv/epoch", "2", prev_value="1")
    store.set("/elastic-job/kv/epoch", "1")
    store.set("/elastic-job/kv/epoch", "2", prev_value="1")
    with pytest.raises(kvstore.CompareFailed):
        store.set("/elastic-job/kv/epoch", "2", prev_value="1")
    assert store.get_value("/elastic-job/kv/epoch") == "2"


def test_rewrite_only_while_it_exists(store: KeyStore) -> None:
    """prev_exist=True (a liveness refresh): a key that is gone is not written again."""
    with pytest.raises(kvstore.KeyNotFound):
        store.set("/elastic-job/kv/r/pod", "alive", ttl=4, prev_exist=True)
    assert store.get_value("/elastic-job/kv/r/pod") is None
    store.set("/elastic-job/kv/r/pod", "alive", ttl=4)
    store.set("/elastic-job/kv/r/pod", "left", ttl=60, prev_exist=True)
    assert store.get_value("/elastic-job/kv/r/pod") == "left"


@pytest.mark.slow
def test_a_key_with_a_ttl_lapses_unless_written_again(store: KeyStore) -> None:
    """ttl: gone about ttl seconds after its last write (etcd's expiry runs every 0.5 s);
    each write renews it."""
    store.set("/elastic-job/kv/alive", "alive", ttl=2)
    for _ in range(4):  # 3 s of refreshes, beyond one TTL
        time.sleep(0.75)
        store.set("/elastic-job/kv/alive", "alive", ttl=2, prev_exist=True)
    assert store.get_value("/elastic-job/kv/alive") == "alive"
    written = time.monotonic()
    wait_until("the key to lapse", lambda: store.get_value("/elastic-job/kv/alive") is None, 6)
    assert time.monotonic() - written >= 1.0
    with pytest.raises(kvstore.KeyNotFound):
        store.set("/elastic-job/kv/alive", "alive", ttl=2, prev_exist=True)


def test_list_dir_gives_the_direct_children(store: KeyStore) -> None:
    assert store.list_dir("/elastic-job/kv/members") == []
    store.set("/elastic-job/kv/members/pod-0", "10.0.0.1", ttl=30)
    store.set("/elastic-job/kv/members/pod-1", "10.0.0.2")
    store.set("/elastic-job/kv/membersx", "not a child")
    names = {n.key.rsplit("/", 1)[-1]: n.value for n in store.list_dir("/elastic-job/kv/members")}
    assert names == {"pod-0": "10.0.0.1", "pod-1": "10.0.0.2"}


def test_with_timeout_is_the_same_etcd(store: KeyStore) -> None:
    store.set("/elastic-job/kv/shared", "x")
    other = store.with_timeout(2.0)
    assert other.base_url == store.base_url
    assert other.get_value("/elastic-job/kv/shared") == "x"


def _v3(server: EtcdServer, path: str, body: dict[str, object]) -> dict[str, object]:
    req = urllib.request.Request(f"{server.url}{path}", json.dumps(body).encode())
    with urllib.request.urlopen(req, timeout=5) as resp:
        reply: dict[str, object] = json.load(resp)
    return reply


def test_v3_keys_with_a_ttl_live_on_a_lease_that_delete_revokes(
    etcd_factory: Callable[..., EtcdServer],
) -> None:
    """etcd-v3: a TTL is a lease of that TTL (etcd v3 keys have no TTL of their own), one
    per key, renewed by each write; delete revokes it rather than leaving it to expire."""
    server = backend_etcd(etcd_factory, "etcd-v3")
    store = keystore(server, "etcd-v3")
    key = "/elastic-job/kv/members/pod-0"
    store.set(key, "10.0.0.1", ttl=30)
    reply = _v3(server, "/v3/kv/range", {"key": base64.b64encode(key.encode()).decode()})
    kvs = reply["kvs"]
    assert isinstance(kvs, list)
    lease = kvs[0]["lease"]
    ttl = _v3(server, "/v3/lease/timetolive", {"ID": lease})
    assert 25 <= int(str(ttl["TTL"])) <= 30
    store.set(key, "10.0.0.1", ttl=30, prev_exist=True)
    again = _v3(server, "/v3/kv/range", {"key": base64.b64encode(key.encode()).decode()})
    assert again["kvs"][0]["lease"] == lease  # type: ignore[index]  # renewed, not a new one
    store.delete(key)
    assert int(str(_v3(server, "/v3/lease/timetolive", {"ID": lease})["TTL"])) == -1


class _NotEtcd(http.server.BaseHTTPRequestHandler):
    """An HTTP server with neither etcd API: 404 on everything, as etcd's own mux does."""

    def _404(self) -> None:
        self.send_response(404)
        self.send_header("Content-Type", "text/plain")
        self.end_headers()
        self.wfile.write(b"404 page not found\n")

    do_GET = do_POST = do_PUT = _404

    def log_message(self, *_: object) -> None:
        pass


@pytest.fixture
def not_etcd() -> Iterator[EtcdServer]:
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _NotEtcd)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    port = httpd.server_address[1]
    yield EtcdServer(f"127.0.0.1:{port}", None, None, False)  # type: ignore[arg-type]
    httpd.shutdown()


def test_an_endpoint_without_the_backends_api_is_no_api(not_etcd: EtcdServer) -> None:
    """Both clients tell "this server lacks my API" (NoApi: waiting cannot help) from
    "nobody answers" (Unavailable: the gate waits)."""
    for backend in BACKENDS:
        with pytest.raises(kvstore.NoApi):
            keystore(not_etcd, backend).check_api()


def test_v2_client_finds_no_v2_api_on_an_etcd_without_it(
    etcd_factory: Callable[..., EtcdServer],
) -> None:
    with pytest.raises(kvstore.NoApi):
        keystore(etcd_factory(v2=False), "etcd-v2").check_api()


def test_nobody_listening_is_unavailable(backend: str) -> None:
    nobody = EtcdServer(f"127.0.0.1:{free_port()}", None, None, False)  # type: ignore[arg-type]
    with pytest.raises(kvstore.Unavailable):
        keystore(nobody, backend).check_api()
