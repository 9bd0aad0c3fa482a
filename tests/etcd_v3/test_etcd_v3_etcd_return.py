"""An etcd away for longer than a key's TTL, back with its data: what it does to a v2 TTL
key and to a v3 key on a lease (docs/notes/2026-11-23-silent-loss.md).

v2 keeps an absolute expiry time per key, so the key is gone as soon as etcd is back. v3
keeps leases, and a newly elected leader (a restarted single member is one) gives every
lease its full TTL again: the key stays, and lapses one TTL after etcd's return unless its
holder renews it. Measured here on Debian's etcd 3.4 and the official 3.5.
"""

from __future__ import annotations

import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from testlib import ETCD_VERSIONS, etcd_binary, etcd_command, free_port
from torch_etcd_v3.client import ClientSettings, EtcdClient

TTL = 4
AWAY = 2 * TTL


class Member:
    """One etcd member that can be stopped and started again on its data and ports."""

    def __init__(self, tmp: Path, version: str) -> None:
        self.cmd = etcd_command(
            etcd_binary(version), tmp / "data", "127.0.0.1", free_port(), free_port(), v2=True
        )
        self.url = self.cmd[4].split("=", 1)[1]  # --advertise-client-urls
        self.log = (tmp / "etcd.log").open("ab")
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen(self.cmd, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=1) as resp:
                    if resp.status == 200:
                        return
            except OSError:
                time.sleep(0.1)
        pytest.fail(f"etcd did not answer /health within 20 s: {self.cmd}")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)


@pytest.fixture(params=ETCD_VERSIONS, ids=lambda v: f"etcd{v}")
def member(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Member]:
    etcd = Member(tmp_path, request.param)
    etcd.start()
    yield etcd
    etcd.stop()
    etcd.log.close()


def _v2_key_exists(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/v2/keys/member", timeout=5):
            return True
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            return False
        raise


@pytest.mark.slow
def test_an_etcd_back_after_a_ttl_expires_v2_keys_at_once_and_renews_v3_leases(
    member: Member,
) -> None:
    host, port = urllib.parse.urlsplit(member.url).netloc.rsplit(":", 1)
    v3 = EtcdClient(ClientSettings(host, int(port), None, read_timeout=5))
    lease = v3.lease_grant(TTL)
    v3.put(b"/member", b"alive", lease)
    body = urllib.parse.urlencode({"value": "alive", "ttl": TTL}).encode()
    req = urllib.request.Request(f"{member.url}/v2/keys/member", data=body, method="PUT")
    urllib.request.urlopen(req, timeout=5).close()

    member.stop()
    time.sleep(AWAY)  # twice the TTL, nobody renewing
    member.start()
    back = time.monotonic()

    # v3: the lease is there with (about) its whole TTL again, and so is its key.
    left = v3.lease_ttl(lease)
    assert 0 < left <= TTL, f"lease TTL left after etcd's return: {left}"
    kv, _ = v3.get(b"/member")
    assert kv is not None and kv.value == b"alive"
    # v2: the key's expiry time passed while etcd was away: gone on its return.
    deadline = back + 2
    while _v2_key_exists(member.url) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _v2_key_exists(member.url), "the v2 TTL key outlived etcd's return"
    # The lease was renewed, not made permanent: unrenewed, its key lapses a TTL later.
    deadline = back + TTL + 3
    while v3.get(b"/member")[0] is not None and time.monotonic() < deadline:
        time.sleep(0.2)
    gone = time.monotonic() - back
    assert v3.get(b"/member")[0] is None, "the v3 key outlived its renewed lease"
    assert gone >= TTL - 1.5, f"the v3 key lapsed {gone:.1f} s after etcd's return"
    print(f"v3 lease: {left} s left on etcd's return, key gone {gone:.1f} s after it")
