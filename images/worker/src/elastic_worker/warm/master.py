"""A warm child's first connection to its round's store, made once rank 0 listens.

Under elastic-worker's rendezvous (etcd-v2 or etcd-v3: torch's agent-shared store is off),
worker rank 0's `init_process_group` (env://) hosts the round's TCPStore on MASTER_PORT and
every other rank connects to it. A rank whose connection comes before rank 0 listens is
refused, and torch retries after an exponential backoff with jitter, tenths of a second
after the server is up. The ranks start together after a re-form, so one of them loses
that race on most re-forms, and the whole group waits for it (measured:
docs/notes/2026-11-26-warm-starts.md).

So in a warm child (torchcompat.wait_before_env_rendezvous) a rank other than 0 polls
rank 0's port (timings.py: every MASTER_POLL, every MASTER_SLOW_POLL once rank 0 is late
by more than MASTER_FAST_FOR, as when its script does work of its own first) from inside
its env:// rendezvous, and lets torch connect once the port accepts. Inside the
rendezvous, not before the script: the wait overlaps nothing the script does first. The
address is resolved once and every address tried, as torch's client does. It gives up
where torch would (the rendezvous's timeout), or at once on anything but a refused
connection, and torch goes on as before with its own error. A probe that connects and
closes is one the store drops unread.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Mapping
from datetime import timedelta
from urllib.parse import parse_qs, urlparse

from elastic_worker import timings

#: torch's default process group timeout, for a rendezvous called without one.
DEFAULT_TIMEOUT = timedelta(minutes=30)
#: torchrun's variable for its agent-shared store: then the agent listens before any worker.
AGENT_STORE_ENV = "TORCHELASTIC_USE_AGENT_STORE"


def master_to_wait_for(url: str, env: Mapping[str, str]) -> tuple[str, int] | None:
    """The address and port of rank 0's store that this rank connects to through `url`
    (env://, the rank from its query or RANK), or None when there is nothing to wait for:
    this is rank 0, the agent hosts the store, or the address is not given."""
    query = parse_qs(urlparse(url).query)
    rank = query.get("rank", [env.get("RANK", "")])[0]
    address, port = env.get("MASTER_ADDR", ""), env.get("MASTER_PORT", "")
    if env.get(AGENT_STORE_ENV) == str(True) or not address or not port.isdigit():
        return None
    if not rank.lstrip("-").isdigit() or int(rank) == 0:
        return None
    return address, int(port)


def wait_for_master(url: str, timeout: timedelta | None = None) -> None:
    """Return once rank 0's store accepts a connection (see the module's docstring), after
    `timeout`, or at once when there is nothing to wait for or the failure is not a
    refused connection (torch reports it)."""
    target = master_to_wait_for(url, os.environ)
    if target is None:
        return
    try:  # resolved once; each poll tries every address, as torch's client does
        addresses = [
            (family, kind, proto, address)
            for family, kind, proto, _, address in socket.getaddrinfo(
                *target, type=socket.SOCK_STREAM
            )
        ]
    except OSError:
        return
    started = time.monotonic()
    deadline = started + (timeout or DEFAULT_TIMEOUT).total_seconds()
    while True:
        for family, kind, proto, address in addresses:
            try:
                with socket.socket(family, kind, proto) as sock:
                    sock.settimeout(timings.MASTER_CONNECT_TIMEOUT)
                    sock.connect(address)
                    return
            except ConnectionRefusedError:
                continue
            except OSError:
                return
        now = time.monotonic()
        if now >= deadline:
            return
        time.sleep(
            timings.MASTER_POLL
            if now - started < timings.MASTER_FAST_FOR
            else timings.MASTER_SLOW_POLL
        )
