"""etcd's events on the round's directory (a v2 watch): every refresh of a member's key,
the gap between two of them by etcd's clock (how late a refresh came), and every lapse."""

from __future__ import annotations

import http.client
import json
import threading
import urllib.request
from datetime import datetime
from typing import Any

from benches.worker import liveness


class Events:
    """etcd's events on the round's directory: refresh gaps per member, and lapses."""

    def __init__(self, endpoint: str, directory: str) -> None:
        self.url = f"http://{endpoint}/v2/keys{directory}?wait=true&recursive=true"
        self.last: dict[str, datetime] = {}
        self.gaps: list[float] = []
        self.lapses: list[str] = []
        self.stop = threading.Event()

    def run(self) -> None:
        index = 0
        while not self.stop.is_set():
            url = self.url + (f"&waitIndex={index}" if index else "")
            try:
                with urllib.request.urlopen(url, timeout=5) as resp:
                    event = json.loads(resp.read())
            except (OSError, http.client.HTTPException, ValueError):
                continue  # no event within 5 s, or etcd slow: ask again from `index`
            index = self.record(event, index)

    def record(self, event: dict[str, Any], index: int) -> int:
        """One event of the watch: a lapse (`expire`) or a member's refresh (its value
        ALIVE with a TTL); the index to watch from next."""
        node = event.get("node", {})
        index = int(node.get("modifiedIndex", index)) + 1
        key = node.get("key", "")
        if event.get("action") == "expire":
            self.lapses.append(key)
        elif node.get("value") == liveness.ALIVE and "expiration" in node:
            # expiration = the moment etcd applied the refresh + TTL: gaps by etcd's clock
            at = datetime.fromisoformat(node["expiration"][:26].rstrip("Z"))
            if key in self.last:
                self.gaps.append((at - self.last[key]).total_seconds())
            self.last[key] = at
        return index
