"""torch's key-value Store on etcd v3: the agents' store (master address, rank assignment,
barriers). Keys live under `<key_prefix>/store/<run_id>/`, each attached to the writing
agent's lease.

`add` is the exit barrier's counter (torch 2.4+: every agent adds 1 to one key as its
workers finish, and they finish together), so it must not be a compare-and-set that n
agents retry: a counter is its base and the key's version when the base was written
(`\\0add\\0<base>:<version>`), and adding 1 is one transaction that bumps the key's version
without touching its value (etcd's ignore_value) and reads it back: no retry, whatever
the number of agents. Other amounts, and a key that set() wrote, take a compare-and-set
that writes a new base. Every read decodes a counter to its decimal value, as TCPStore
keeps one.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from datetime import timedelta

from torch._C._distributed_c10d import Store  # torch.distributed's, typed (re-export is not)
from torch.distributed import DistStoreError

from . import ops
from .client import EtcdClient, KeyValue, b64, chunks
from .lease import AgentLease

#: The start of a value that add() keeps as a counter (a value no caller writes: a NUL).
COUNTER = b"\0add\0"
#: Seconds between a waiting get's looks at its interrupt (when it has one).
INTERRUPT_POLL = 0.5

# What torch's Store methods receive: str from Python callers, bytes from C++ (PrefixStore).
Data = str | bytes


def _bytes(data: Data) -> bytes:
    return data.encode() if isinstance(data, str) else bytes(data)


def _counter(base: int, version: int) -> bytes:
    return COUNTER + b"%d:%d" % (base, version)


def value_of(kv: KeyValue) -> bytes:
    """What a key holds as torch reads it: a counter as its decimal value."""
    if not kv.value.startswith(COUNTER):
        return kv.value
    base, _, at = kv.value[len(COUNTER) :].partition(b":")
    return str(int(base) + kv.version - int(at)).encode()


class EtcdV3Store(Store):
    def __init__(
        self,
        client: EtcdClient,
        prefix: bytes,
        lease: AgentLease,
        timeout: timedelta | None = None,
        interrupt: Callable[[], str | None] | None = None,
    ) -> None:
        super().__init__()  # the pybind trampoline needs it
        self._client = client
        self._prefix = prefix
        self._lease = lease
        #: Asked while a get waits (every INTERRUPT_POLL s): a reason ends the wait at once
        #: with DistStoreError (etcd-lease: the round the wait belongs to lost a member, so
        #: the key will never come; torch's agent would otherwise wait the store's 300 s).
        self._interrupt = interrupt
        if timeout is not None:
            self.set_timeout(timeout)

    @property
    def client(self) -> EtcdClient:
        """The etcd client (shared with the rendezvous backend)."""
        return self._client

    @property
    def lease(self) -> AgentLease:
        """The agent's lease (shared with the rendezvous backend)."""
        return self._lease

    def _key(self, key: Data) -> bytes:
        return self._prefix + _bytes(key)

    def _put_if(self, key: bytes, current: KeyValue | None, value: bytes) -> bool:
        """Write `value` if the key is still as read (`current`, None = absent)."""
        revision = None if current is None else current.mod_revision
        return self._lease.write(lambda lease: self._client.put_if(key, value, lease, revision))[0]

    def set(self, key: Data, value: Data) -> None:
        full, data = self._key(key), _bytes(value)
        self._lease.write(lambda lease: self._client.put(full, data, lease))

    def get(self, key: Data) -> bytes:
        """The value, waiting up to the store's timeout for the key to appear."""
        return self._wait_get([self._key(key)], None)[0]

    def add(self, key: Data, num: int) -> int:
        """Add `num` to the decimal integer at `key` (0 if absent); the new value."""
        full = self._key(key)
        if num == 1:
            reply = self._lease.write(
                lambda lease: self._client.txn(
                    compare=[ops.absent(full)],
                    success=[ops.put(full, _counter(1, 1), lease)],
                    failure=[
                        ops.put(full, ignore_value=True, ignore_lease=True),
                        ops.get(full),
                    ],
                )
            )
            if reply.get("succeeded", False):
                return 1
            found = ops.kvs(ops.responses(reply)[1])
            if found and found[0].value.startswith(COUNTER):
                return int(value_of(found[0]))
        while True:  # another amount, or a value set() wrote: a new base
            current, _ = self._client.get(full)
            value = (int(value_of(current)) if current is not None else 0) + num
            version = current.version + 1 if current is not None else 1
            if self._put_if(full, current, _counter(value, version)):
                return value

    def append(self, key: Data, value: Data) -> None:
        full = self._key(key)
        while True:
            current, _ = self._client.get(full)
            old = value_of(current) if current is not None else b""
            if self._put_if(full, current, old + _bytes(value)):
                return

    def compare_set(self, key: Data, expected_value: Data, desired_value: Data) -> bytes:
        """torch's semantics: set `desired` if the value is `expected` (or the key is absent
        and `expected` is empty); return the value the key holds afterwards (or `expected`
        for an absent key that was not created)."""
        full, expected, desired = self._key(key), _bytes(expected_value), _bytes(desired_value)
        while True:
            current, _ = self._client.get(full)
            if current is None and expected:
                return expected
            if current is not None and value_of(current) != expected:
                return value_of(current)
            if self._put_if(full, current, desired):
                return desired

    def delete_key(self, key: Data) -> bool:
        return self._client.delete(self._key(key)) > 0

    def num_keys(self) -> int:
        return self._client.count(self._prefix)

    def check(self, keys: list[str]) -> bool:
        found, _ = self._client.get_many([self._key(k) for k in keys])
        return len(found) == len(set(keys))

    def wait(self, keys: list[str], timeout: timedelta | None = None) -> None:
        self._wait_get([self._key(k) for k in keys], timeout)

    def multi_get(self, keys: list[str]) -> list[bytes]:
        return self._wait_get([self._key(k) for k in keys], None)

    def multi_set(self, keys: list[str], values: Sequence[Data]) -> None:
        pairs = [(b64(self._key(k)), b64(_bytes(v))) for k, v in zip(keys, values, strict=True)]

        def put_all(lease: int) -> None:
            # Not atomic past TXN_OPS keys; torch's readers wait for each key anyway.
            for chunk in chunks(pairs):
                puts = [
                    {"request_put": {"key": k, "value": v, "lease": str(lease)}} for k, v in chunk
                ]
                self._client.txn(compare=[], success=puts, failure=[])

        self._lease.write(put_all)

    def _wait_get(self, keys: list[bytes], timeout: timedelta | None) -> list[bytes]:
        """The values of all `keys`, once all exist; DistStoreError after the timeout
        (the store's own unless given), as torch's TCPStore raises."""
        # torch 2.13's stub lacks Store.timeout; the binding has it (set_timeout sets it).
        own: timedelta = self.timeout  # type: ignore[attr-defined]
        wait = own if timeout is None else timeout
        deadline = time.monotonic() + wait.total_seconds()
        while True:
            found, revision = self._client.get_many(keys)
            if all(k in found for k in keys):
                return [value_of(found[k]) for k in keys]
            missing = [k for k in keys if k not in found]
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise DistStoreError(
                    f"etcd-v3 store: timed out after {wait.total_seconds():g} s waiting for "
                    f"{', '.join(k.decode(errors='replace') for k in missing)}"
                )
            reason = self._interrupt() if self._interrupt is not None else None
            if reason is not None:
                raise DistStoreError(f"etcd-v3 store: stopped waiting for {missing[0]!r}: {reason}")
            if self._interrupt is not None:
                remaining = min(remaining, INTERRUPT_POLL)
            # Wake on a change after the read, then re-read: of the one key missing (n
            # agents each waiting for their own rank must not each wake on every agent's
            # write: O(n^2) at a bring-up), else of any key under the store's prefix.
            if len(missing) == 1:
                self._client.wait_for_change(missing[0], revision, remaining, exact=True)
            else:
                self._client.wait_for_change(self._prefix, revision, remaining)
