"""A long-lived etcd v3 watch (standard library only): the events of a key range from a
revision on, read by a daemon thread into a queue, so that the thread that waits can
also wait for a deadline (a socket that timed out cannot be read again in Python).

One connection per watch, closed by `close()` from any thread. The rounds of `etcd-lease`
hold one while they wait for a decision and while their round trains
(rounds/protocol.py); etcd sends only the changes of the range, so a waiter costs
nothing while nothing changes."""

from __future__ import annotations

import contextlib
import http.client
import json
import queue
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass

from .client import EtcdClient, EtcdError, KeyValue, b64, kv_of

PUT = "PUT"
DELETE = "DELETE"


@dataclass(frozen=True)
class Event:
    kind: str  # PUT or DELETE
    #: A DELETE carries the key and the revision of the delete only.
    kv: KeyValue


class WatchEnded(EtcdError):
    """The stream ended: etcd went away, closed it, or compacted the history it needed.
    The reader reads the state afresh and watches again from there."""

    def __init__(self, message: str, *, compacted: bool = False, lost: bool = False) -> None:
        super().__init__(message)
        #: etcd no longer has the history from the watch's start: watch from now on.
        self.compacted = compacted or lost
        #: ... because it lost its data (its revisions count from 1 again).
        self.lost = lost


class Watch:
    def __init__(
        self,
        client: EtcdClient,
        key: bytes,
        end: bytes | None,
        start_revision: int = 0,
        until: Callable[[Event], bool] | None = None,
    ) -> None:
        """Watch [key, end) (`end` None: `key` alone) from `start_revision` on (0: from
        now on: no change made before is replayed; `revision` says where it starts).
        `until`: the stream ends after the first batch with an event it holds true for,
        in the reader's thread, so that the changes after it are never parsed (a member
        of a round of n nodes would otherwise read every join of its re-form). Raises
        EtcdError when etcd does not answer."""
        self._until = until
        request: dict[str, object] = {"key": b64(key)}
        if start_revision:
            request["start_revision"] = str(start_revision)
        if end is not None:
            request["range_end"] = b64(end)
        self._conn, self._resp = client.open_stream("/v3/watch", {"create_request": request}, None)
        self._queue: queue.SimpleQueue[list[Event] | Exception] = queue.SimpleQueue()
        self._closed = threading.Event()
        self._ended = False
        #: The store's revision when etcd created the watch: it sees every change after.
        self.revision = self._created()
        if start_revision and self.revision < start_revision - 1:
            # etcd is behind what this client has seen: it lost its data (a new member
            # on an empty disk) and counts from 1 again; the start is in its future.
            self.close()
            raise WatchEnded(
                f"etcd's revision {self.revision} is behind {start_revision - 1}: it lost its data",
                compacted=True,
            )
        thread = threading.Thread(target=self._read, name="etcd-watch", daemon=True)
        thread.start()

    def _created(self) -> int:
        """Read etcd's first answer, which says the watch exists (and from when): a read
        of etcd made after this returns sees nothing the watch will not."""
        try:
            line = self._resp.readline()
            message = json.loads(line) if line else {}
        except (OSError, ValueError, http.client.HTTPException) as exc:
            self.close()
            raise WatchEnded(f"the etcd watch did not start: {exc}") from exc
        result = message.get("result", {})
        if "error" in message or not result.get("created"):
            self.close()
            raise WatchEnded(f"etcd did not create the watch: {message}")
        return int(result.get("header", {}).get("revision", 0))

    def _read(self) -> None:
        error: Exception = WatchEnded("the etcd watch stream ended")
        try:
            while True:
                line = self._resp.readline()
                if not line:
                    break
                message = json.loads(line)
                if "error" in message:
                    error = WatchEnded(f"etcd watch failed: {message['error']}")
                    break
                result = message.get("result", {})
                if int(result.get("compact_revision", 0) or 0) > 0:
                    error = WatchEnded(
                        "etcd compacted the history this watch started from", compacted=True
                    )
                    break
                if result.get("canceled"):
                    error = WatchEnded(f"etcd cancelled the watch: {result.get('cancel_reason')}")
                    break
                events = [
                    Event(raw.get("type", PUT), kv_of(raw["kv"]))
                    for raw in result.get("events") or []
                ]
                if events:
                    self._queue.put(events)
                    if self._until is not None and any(self._until(e) for e in events):
                        error = WatchEnded("the watch saw what it waited for")
                        break
        except (OSError, ValueError, AttributeError, http.client.HTTPException) as exc:
            # AttributeError: http.client's response, closed by close() while read here
            if not self._closed.is_set():
                error = WatchEnded(f"the etcd watch stream broke: {exc}")
        finally:
            self._queue.put(error)
            with contextlib.suppress(OSError):
                self._conn.close()

    def next(self, timeout: float) -> list[Event]:
        """The next events, waiting up to `timeout` s ([] when none came). Raises
        WatchEnded once the stream has ended."""
        if self._ended:
            raise WatchEnded("the etcd watch stream ended")
        try:
            item = self._queue.get(timeout=max(timeout, 0.0))
        except queue.Empty:
            return []
        if isinstance(item, Exception):
            self._ended = True
            raise item
        return item

    def wake(self) -> None:
        """Make a `next` waiting now (or the next one) return [] at once (from any thread)."""
        self._queue.put([])

    def close(self) -> None:
        """End the stream (from any thread); its reader thread ends with it."""
        if self._closed.is_set():
            return
        self._closed.set()
        sock = self._conn.sock
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(OSError):
            self._conn.close()

    def __enter__(self) -> Watch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
