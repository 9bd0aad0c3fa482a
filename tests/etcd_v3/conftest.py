"""Fixtures of the etcd v3 backend's tests: a real etcd (3.4 and 3.5) per test with the v2
API off."""

from __future__ import annotations

import contextlib
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from etcd3_helpers import LEASES
from lease_helpers import HANDLERS
from testlib import ETCD_VERSIONS, EtcdServer, start_etcd


@pytest.fixture(autouse=True)
def _stop_leases() -> Iterator[None]:
    yield
    while LEASES:
        LEASES.pop().stop()
    while HANDLERS:  # etcd-lease's: each leaves (its lease revoked, its threads stopped)
        h = HANDLERS.pop()
        with contextlib.suppress(Exception):
            h.leave()
        h.rendezvous.membership.stop()


@pytest.fixture(params=ETCD_VERSIONS, ids=lambda v: f"etcd{v}")
def etcd3(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[EtcdServer]:
    """Each test against Debian's etcd 3.4 and the official 3.5 (scripts/bootstrap)."""
    server = start_etcd(tmp_path / "etcd", v2=False, version=request.param)
    # The backend must not lean on the v2 API: prove it is really absent.
    with pytest.raises(urllib.error.HTTPError) as absent:
        urllib.request.urlopen(f"{server.url}/v2/keys/", timeout=5)
    assert absent.value.code == 404
    yield server
    server.stop()
