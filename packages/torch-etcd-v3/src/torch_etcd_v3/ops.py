"""The operations of an etcd v3 transaction, as the JSON gateway takes them, and what its
answers hold (standard library only).

A transaction's operations run at one revision, so one request can write a key and read
what the write changed: the rounds of `etcd-lease` join, count and decide this way
(rounds/protocol.py)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .client import JSON, KeyValue, b64, kv_of


def put(
    key: bytes,
    value: bytes = b"",
    lease: int = 0,
    *,
    ignore_value: bool = False,
    ignore_lease: bool = False,
) -> JSON:
    """Write `key`. `ignore_value`: keep its value (the write bumps only its version and
    revision); `ignore_lease`: keep its lease."""
    body: JSON = {"key": b64(key)}
    if ignore_value:
        body["ignore_value"] = True
    else:
        body["value"] = b64(value)
    if ignore_lease:
        body["ignore_lease"] = True
    elif lease:
        body["lease"] = str(lease)
    return {"request_put": body}


def get(
    key: bytes,
    end: bytes | None = None,
    *,
    count_only: bool = False,
    keys_only: bool = False,
    limit: int = 0,
    newest_first: bool = False,
    by_mod: bool = False,
    min_mod_revision: int = 0,
    max_mod_revision: int = 0,
) -> JSON:
    """Read `key`, or every key in [key, end). `by_mod`: sorted by the revision of their
    last write (else by key); `min_mod_revision`/`max_mod_revision`: only the keys last
    written at or after / at or before that revision (etcd filters, so a count of them
    is a few bytes however many keys there are)."""
    body: JSON = {"key": b64(key)}
    if end is not None:
        body["range_end"] = b64(end)
    if count_only:
        body["count_only"] = True
    if keys_only:
        body["keys_only"] = True
    if limit:
        body["limit"] = str(limit)
    if newest_first or by_mod:
        body["sort_target"] = "MOD" if by_mod else "KEY"
        body["sort_order"] = "DESCEND" if newest_first else "ASCEND"
    if min_mod_revision:
        body["min_mod_revision"] = str(min_mod_revision)
    if max_mod_revision:
        body["max_mod_revision"] = str(max_mod_revision)
    return {"request_range": body}


def delete(key: bytes) -> JSON:
    return {"request_delete_range": {"key": b64(key)}}


def absent(key: bytes) -> JSON:
    """Compare: `key` does not exist."""
    return {"key": b64(key), "target": "CREATE", "result": "EQUAL", "create_revision": "0"}


def unchanged(key: bytes, mod_revision: int) -> JSON:
    """Compare: `key` was last written at `mod_revision` (0: it does not exist)."""
    if mod_revision == 0:
        return absent(key)
    return {"key": b64(key), "target": "MOD", "result": "EQUAL", "mod_revision": str(mod_revision)}


def responses(reply: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """A transaction's answers, one per operation of the branch it ran."""
    return list(reply.get("responses") or [])


def kvs(response: Mapping[str, Any]) -> list[KeyValue]:
    """The keys a read of a transaction answered."""
    return [kv_of(raw) for raw in response.get("response_range", {}).get("kvs") or []]


def count(response: Mapping[str, Any]) -> int:
    """How many keys a read of a transaction matched (with count_only: without them)."""
    return int(response.get("response_range", {}).get("count", 0))


def revision(reply: Mapping[str, Any]) -> int:
    """The store's revision after a request (a write's own revision)."""
    return int(reply["header"]["revision"])
