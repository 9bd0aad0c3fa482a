"""The fake API server's objects: one resourceVersion counter, objects by resource,
namespace and name, label and field selectors, and the change history its watches stream.

    store = Store()
    store.put("pods", pod)                    # ADDED or MODIFIED (None: nothing changed)
    store.delete("pods", "ml", "run42-w-0")   # DELETED
    items, rv = store.list_objects("pods", "ml", label_selector="app=x")
    for change in store.watch("pods", "ml", since=rv, stop=..., timeout=30): ...

Changes are kept for the last HISTORY versions, as etcd compacts: a watch from an older
resourceVersion gets 410 Gone (`TooOld`), as from the real server.
"""

from __future__ import annotations

import copy
import re
import threading
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

JsonObject = dict[str, Any]

HISTORY = 10000


class SelectorError(ValueError):
    """A label or field selector that cannot be parsed (400 from the real server)."""


class TooOld(Exception):
    """A watch from a resourceVersion older than the kept history (410 Gone)."""


@dataclass(frozen=True)
class Change:
    version: int
    resource: str
    type: str  # ADDED, MODIFIED, DELETED
    obj: JsonObject


# -- selectors ---------------------------------------------------------------------------

_SET_EXPR = re.compile(r"^\s*(?P<key>[^\s!=,()]+)\s+(?P<op>in|notin)\s+\((?P<values>[^)]*)\)\s*$")


def _split_terms(selector: str) -> list[str]:
    """Split on commas outside parentheses (`a in (x,y),b=c`)."""
    terms, depth, cur = [], 0, ""
    for ch in selector:
        depth += ch == "("
        depth -= ch == ")"
        if ch == "," and depth == 0:
            terms.append(cur)
            cur = ""
        else:
            cur += ch
    terms.append(cur)
    return [t.strip() for t in terms if t.strip()]


def label_matches(selector: str, labels: dict[str, str]) -> bool:
    """Kubernetes label selector syntax: `k=v`, `k==v`, `k!=v`, `k`, `!k`, `k in (a,b)`,
    `k notin (a,b)`, joined by commas (all must hold)."""
    for term in _split_terms(selector):
        if m := _SET_EXPR.match(term):
            values = {v.strip() for v in m["values"].split(",") if v.strip()}
            present = m["key"] in labels and labels[m["key"]] in values
            if present != (m["op"] == "in"):
                return False
        elif "!=" in term:
            key, value = (s.strip() for s in term.split("!=", 1))
            if labels.get(key) == value:
                return False
        elif "=" in term:
            key, value = (s.strip() for s in term.replace("==", "=").split("=", 1))
            if labels.get(key) != value:
                return False
        elif term.startswith("!"):
            if term[1:].strip() in labels:
                return False
        elif re.fullmatch(r"[A-Za-z0-9./_-]+", term):
            if term not in labels:
                return False
        else:
            raise SelectorError(f"unable to parse requirement: {term!r}")
    return True


def _field(obj: JsonObject, path: str) -> str:
    cur: Any = obj
    for part in path.split("."):
        cur = cur.get(part) if isinstance(cur, dict) else None
    return "" if cur is None else str(cur)


def field_matches(selector: str, obj: JsonObject) -> bool:
    """Field selectors: `a.b=v`, `a.b==v`, `a.b!=v`, joined by commas."""
    for term in _split_terms(selector):
        if "!=" in term:
            path, value = term.split("!=", 1)
            if _field(obj, path.strip()) == value.strip():
                return False
        elif "=" in term:
            path, value = term.replace("==", "=").split("=", 1)
            if _field(obj, path.strip()) != value.strip():
                return False
        else:
            raise SelectorError(f"invalid field selector: {term!r}")
    return True


def selected(obj: JsonObject, label_selector: str, field_selector: str) -> bool:
    labels = (obj.get("metadata") or {}).get("labels") or {}
    return label_matches(label_selector, labels) and field_matches(field_selector, obj)


# -- the store ---------------------------------------------------------------------------


def _key(obj: JsonObject) -> tuple[str, str]:
    meta = obj["metadata"]
    return meta.get("namespace", ""), meta["name"]


def _without_version(obj: JsonObject) -> JsonObject:
    out = dict(obj)
    out["metadata"] = {k: v for k, v in obj["metadata"].items() if k != "resourceVersion"}
    return out


class Store:
    """Thread-safe; every method copies what goes in and what comes out."""

    def __init__(self, first_version: int = 1000) -> None:
        self._version = first_version
        self._objects: dict[str, dict[tuple[str, str], JsonObject]] = {}
        self._history: deque[Change] = deque(maxlen=HISTORY)
        self._changed = threading.Condition(threading.RLock())

    @property
    def lock(self) -> threading.Condition:
        return self._changed

    @property
    def version(self) -> int:
        with self._changed:
            return self._version

    def next_version(self) -> str:
        with self._changed:
            self._version += 1
            return str(self._version)

    def note(self, resource: str, type_: str, obj: JsonObject) -> None:
        """Record a change of an object kept elsewhere (nodes, StatefulSets) for watches;
        the caller has set its resourceVersion (next_version)."""
        with self._changed:
            version = int(obj["metadata"].get("resourceVersion") or self._version)
            self._history.append(Change(version, resource, type_, copy.deepcopy(obj)))
            self._changed.notify_all()

    def put(self, resource: str, obj: JsonObject) -> Change | None:
        """Create or replace; None when the object is unchanged (no new version)."""
        with self._changed:
            objects = self._objects.setdefault(resource, {})
            key = _key(obj)
            old = objects.get(key)
            if old is not None and _without_version(old) == _without_version(obj):
                return None
            new = copy.deepcopy(obj)
            new["metadata"]["resourceVersion"] = self.next_version()
            objects[key] = new
            change = Change(
                int(self._version),
                resource,
                "ADDED" if old is None else "MODIFIED",
                copy.deepcopy(new),
            )
            self._history.append(change)
            self._changed.notify_all()
            return Change(change.version, resource, change.type, copy.deepcopy(new))

    def delete(self, resource: str, namespace: str, name: str) -> JsonObject | None:
        with self._changed:
            old = self._objects.get(resource, {}).pop((namespace, name), None)
            if old is None:
                return None
            old["metadata"]["resourceVersion"] = self.next_version()  # the copy kept is `old`
            self._history.append(Change(int(self._version), resource, "DELETED", old))
            self._changed.notify_all()
            return copy.deepcopy(old)

    def get(self, resource: str, namespace: str, name: str) -> JsonObject | None:
        with self._changed:
            obj = self._objects.get(resource, {}).get((namespace, name))
            return copy.deepcopy(obj) if obj is not None else None

    def names(self, resource: str) -> list[tuple[str, str]]:
        with self._changed:
            return list(self._objects.get(resource, {}))

    def list_objects(
        self,
        resource: str,
        namespace: str = "",
        *,
        label_selector: str = "",
        field_selector: str = "",
    ) -> tuple[list[JsonObject], str]:
        """The objects (of one namespace unless ""), sorted by namespace and name, and the
        list's resourceVersion to watch from."""
        with self._changed:
            items = [
                copy.deepcopy(o)
                for (ns, _), o in sorted(self._objects.get(resource, {}).items())
                if (not namespace or ns == namespace)
                and selected(o, label_selector, field_selector)
            ]
            return items, str(self._version)

    def watch(
        self,
        resource: str,
        namespace: str = "",
        *,
        since: str = "",
        label_selector: str = "",
        field_selector: str = "",
        initial: list[JsonObject] | None = None,
        stop: threading.Event,
        timeout: float,
    ) -> Iterator[Change]:
        """Changes after `since` (a list's resourceVersion); without `since`, every current
        object as ADDED first (`initial` for objects kept outside the store), as the real
        server does. Ends after `timeout` seconds or when `stop` is set."""
        deadline = time.monotonic() + timeout
        with self._changed:
            if since and since != "0":
                start = int(since)
                oldest = self._history[0].version if self._history else self._version
                if start < oldest - 1 and start < self._version:
                    raise TooOld(f"too old resource version: {start} ({oldest - 1})")
                pending: list[Change] = []
            else:
                start = self._version
                current = initial
                if current is None:
                    current = self.list_objects(resource, namespace)[0]
                pending = [
                    Change(int(o["metadata"].get("resourceVersion") or 0), resource, "ADDED", o)
                    for o in current
                    if selected(o, label_selector, field_selector)
                ]
        yield from pending
        seen = start
        while not stop.is_set():
            with self._changed:
                fresh = [
                    c
                    for c in self._history
                    if c.version > seen
                    and c.resource == resource
                    and (not namespace or c.obj["metadata"].get("namespace", "") == namespace)
                    and selected(c.obj, label_selector, field_selector)
                ]
                newest = self._history[-1].version if self._history else seen
                if not fresh:
                    seen = max(seen, newest)
                    left = deadline - time.monotonic()
                    if left <= 0:
                        return
                    self._changed.wait(min(left, 0.5))
                    continue
            seen = max(seen, newest)
            for c in fresh:
                yield Change(c.version, c.resource, c.type, copy.deepcopy(c.obj))
