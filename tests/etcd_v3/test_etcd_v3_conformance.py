"""torch's contract for a rendezvous backend, held against etcd-v3 on a real etcd (3.4 and
3.5, v2 API off).

Two parts, each test named after the torch test whose behaviour it checks (torch 2.13.0,
test/distributed/elastic/rendezvous/):
- what `RendezvousBackendTestMixin` (rendezvous_backend_test.py) asks of every backend:
  get_state/set_state, tokens, a corrupt state;
- what etcd_rendezvous_backend_test.py's `CreateBackendTest` asks of torch's etcd-v2
  create_backend, for etcd-v3: the backend and store it returns, the read timeout, bad
  protocol or timeout, an etcd that cannot be reached, a store get that waits.
Written here, against the documented contract (torch's `RendezvousBackend` docstrings); the
test file of torch's own mixin runs too when a copy of it is given
(test_etcd_v3_torch_suite.py).
"""

from __future__ import annotations

import base64
import json
import threading
import time
import urllib.request
from collections.abc import Iterator

import pytest
from etcd3_helpers import LEASES, params
from testlib import EtcdServer, free_port
from torch._C._distributed_c10d import Store
from torch.distributed.elastic.rendezvous import (
    RendezvousConnectionError,
    RendezvousParameters,
    RendezvousStateError,
)
from torch.distributed.elastic.rendezvous.api import RendezvousStoreInfo
from torch.distributed.elastic.rendezvous.dynamic_rendezvous import RendezvousBackend
from torch_etcd_v3 import EtcdV3Store, create_backend

RUN_ID = "dummy_run_id"


def _range(etcd: EtcdServer, key: bytes) -> dict[str, str] | None:
    """The key as etcd holds it, read with plain HTTP (not the code under test)."""
    body = json.dumps({"key": base64.b64encode(key).decode()}).encode()
    req = urllib.request.Request(f"{etcd.url}/v3/kv/range", data=body, method="POST")
    with urllib.request.urlopen(req, timeout=5) as resp:
        kvs = json.load(resp).get("kvs") or []
    return dict(kvs[0]) if kvs else None


def _put(etcd: EtcdServer, key: bytes, value: bytes) -> None:
    body = json.dumps(
        {"key": base64.b64encode(key).decode(), "value": base64.b64encode(value).decode()}
    ).encode()
    req = urllib.request.Request(f"{etcd.url}/v3/kv/put", data=body, method="POST")
    urllib.request.urlopen(req, timeout=5).close()


def _lease_ttl(etcd: EtcdServer, lease: str) -> int:
    body = json.dumps({"ID": lease}).encode()
    req = urllib.request.Request(f"{etcd.url}/v3/lease/timetolive", data=body, method="POST")
    with urllib.request.urlopen(req, timeout=5) as resp:
        return int(json.load(resp)["TTL"])


def _create(rdzv: RendezvousParameters) -> tuple[RendezvousBackend, Store]:
    backend, store = create_backend(rdzv)
    LEASES.append(store.lease)
    return backend, store


# -- RendezvousBackendTestMixin ----------------------------------------------------------


@pytest.fixture
def backend(etcd3: EtcdServer) -> Iterator[RendezvousBackend]:
    yield _create(params(etcd3.endpoint, RUN_ID))[0]


def _set(
    backend: RendezvousBackend, state: bytes, token: object = None
) -> tuple[bytes, object, bool]:
    result = backend.set_state(state, token)
    assert result is not None
    return result


def test_get_state_returns_backend_state(backend: RendezvousBackend) -> None:
    backend.set_state(b"x")
    result = backend.get_state()
    assert result is not None
    state, token = result
    assert state == b"x"
    assert token is not None


def test_get_state_returns_none_if_backend_state_does_not_exist(
    backend: RendezvousBackend,
) -> None:
    assert backend.get_state() is None


@pytest.mark.parametrize(
    "stored",
    [b"non_base64", b"eA", b"\x80\x04\x95 a raw pickle, as earlier builds stored it"],
    ids=["not-base64", "cut-short", "raw-bytes"],
)
def test_get_state_raises_error_if_backend_state_is_corrupt(
    etcd3: EtcdServer, backend: RendezvousBackend, stored: bytes
) -> None:
    """A state key that holds anything but what the backend writes (torch's own backends:
    base64 of the state) is torch's RendezvousStateError, not bytes handed to pickle."""
    _put(etcd3, f"/torch/elastic/rendezvous/{RUN_ID}".encode(), stored)
    with pytest.raises(RendezvousStateError, match="corrupt"):
        backend.get_state()


def test_set_state_sets_backend_state_if_it_does_not_exist(backend: RendezvousBackend) -> None:
    state, token, has_set = _set(backend, b"x")
    assert state == b"x"
    assert token is not None
    assert has_set


def test_set_state_sets_backend_state_if_token_is_current(backend: RendezvousBackend) -> None:
    _, token1, has_set1 = _set(backend, b"x")
    state2, token2, has_set2 = _set(backend, b"y", token1)
    assert state2 == b"y"
    assert token1 != token2
    assert has_set1 and has_set2


def test_set_state_returns_current_backend_state_if_token_is_old(
    backend: RendezvousBackend,
) -> None:
    _, token1, _ = _set(backend, b"x")
    state2, token2, _ = _set(backend, b"y", token1)
    state3, token3, has_set = _set(backend, b"z", token1)
    assert (state3, token3, has_set) == (state2, token2, False)


def test_set_state_returns_current_backend_state_if_token_is_none(
    backend: RendezvousBackend,
) -> None:
    state1, token1, _ = _set(backend, b"x")
    assert _set(backend, b"y") == (state1, token1, False)


def test_set_state_returns_current_backend_state_if_token_is_invalid(
    backend: RendezvousBackend,
) -> None:
    state1, token1, _ = _set(backend, b"x")
    assert _set(backend, b"y", token="invalid") == (state1, token1, False)


# -- CreateBackendTest (torch's etcd-v2 create_backend, for etcd-v3) ----------------------


def _conf(etcd: EtcdServer, **conf: str) -> RendezvousParameters:
    return RendezvousParameters(
        backend="etcd-v3", endpoint=etcd.endpoint, run_id=RUN_ID, min_nodes=1, max_nodes=1, **conf
    )


@pytest.mark.parametrize(
    ("conf", "read_timeout"),
    [
        ({"protocol": "hTTp", "read_timeout": "10"}, 10),
        ({"read_timeout": "10"}, 10),  # protocol not specified: http
        ({"protocol": "hTTp"}, 60),  # read_timeout not specified: 60 s, as etcd-v2's
    ],
    ids=["returns_backend", "if_protocol_is_not_specified", "if_read_timeout_is_not_specified"],
)
def test_create_backend_returns_backend(
    etcd3: EtcdServer, conf: dict[str, str], read_timeout: int
) -> None:
    backend, store = _create(_conf(etcd3, **conf))
    assert backend.name == "etcd-v3"
    assert isinstance(store, EtcdV3Store)
    assert isinstance(store, Store)
    assert store.client.settings.read_timeout == read_timeout

    backend.set_state(b"dummy_state")
    state = _range(etcd3, f"/torch/elastic/rendezvous/{RUN_ID}".encode())
    assert state is not None
    # Stored as torch's etcd-v2 backend stores it: base64 of the state.
    assert base64.b64decode(state["value"]) == base64.b64encode(b"dummy_state")
    assert 0 < _lease_ttl(etcd3, state["lease"]) <= 60  # the agent's lease, lease_ttl 60 s

    store.set("dummy_key", "dummy_value")
    value = _range(etcd3, f"/torch/elastic/store/{RUN_ID}/dummy_key".encode())
    assert value is not None
    assert base64.b64decode(value["value"]) == b"dummy_value"


def test_create_backend_raises_error_if_etcd_is_unreachable() -> None:
    """Nothing listens at the endpoint: torch's RendezvousConnectionError when the backend
    is made, naming the endpoint, as torch's etcd-v2 create_backend raises (not a backend
    whose first use fails, seconds into torchrun's rendezvous)."""
    endpoint = f"127.0.0.1:{free_port()}"
    rdzv = RendezvousParameters("etcd-v3", endpoint, RUN_ID, 1, 1, read_timeout="5")
    with pytest.raises(RendezvousConnectionError, match=f"etcd at {endpoint}"):
        create_backend(rdzv)


def test_create_backend_raises_error_if_protocol_is_invalid(etcd3: EtcdServer) -> None:
    with pytest.raises(ValueError, match="protocol='dummy': use http or https"):
        create_backend(_conf(etcd3, protocol="dummy"))


@pytest.mark.parametrize("read_timeout", ["0", "-10"])
def test_create_backend_raises_error_if_read_timeout_is_invalid(
    etcd3: EtcdServer, read_timeout: str
) -> None:
    with pytest.raises(ValueError, match=f"read_timeout='{read_timeout}': must be a whole"):
        create_backend(_conf(etcd3, read_timeout=read_timeout))


def test_get_waits_for_store_prefix_key(etcd3: EtcdServer) -> None:
    """A get of a key not yet set waits for it (RendezvousStoreInfo's MASTER_ADDR, set by
    rank 0 two seconds later) instead of failing or returning early."""
    backend, store = _create(_conf(etcd3))
    backend.set_state(b"dummy_state")
    got: dict[str, object] = {}

    def get() -> None:
        start = time.perf_counter()
        got["value"] = store.get(RendezvousStoreInfo.MASTER_ADDR_KEY)
        got["seconds"] = time.perf_counter() - start

    reader = threading.Thread(target=get)
    reader.start()
    time.sleep(2)
    store.set(RendezvousStoreInfo.MASTER_ADDR_KEY, b"foo")
    reader.join(30)
    assert got["value"] == b"foo"
    assert isinstance(got["seconds"], float) and got["seconds"] >= 2
