"""The API server's answers as the command reads them: the client is untyped, so what it
answers is checked here, once, into these shapes (ObjectList, WatchEvent); a body of another
shape is None here and one error in kube.py, not a KeyError later."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, TypedDict

from elastic_job_cli.objects import Obj

if TYPE_CHECKING:
    from urllib3.response import BaseHTTPResponse

    #: A client method called with `_preload_content=False`: it answers the urllib3
    #: response, unread (the client's own typing says nothing; this is what it returns).
    RawCall = Callable[..., BaseHTTPResponse]


class ListMeta(TypedDict, total=False):
    resourceVersion: str


class ObjectList(TypedDict):
    """A list the API server serves (StatefulSetList, PodList, EventList, NodeList): what
    the command reads of it."""

    metadata: ListMeta
    items: list[Obj]


class WatchEvent(TypedDict):
    """One change of a watch: ADDED, MODIFIED, DELETED (or ERROR) and the object as served."""

    type: str
    object: Obj


def _mapping(data: object) -> Mapping[str, object] | None:
    if isinstance(data, Mapping) and all(isinstance(k, str) for k in data):
        return data
    return None


def _objects(data: object) -> list[Obj] | None:
    """`data` as a list of objects (JSON objects), or None. `null` is none: Go encodes an
    empty slice so."""
    if data is None:
        return []
    if not isinstance(data, list):
        return None
    items: list[Obj] = []
    for item in data:
        if not isinstance(item, dict):
            return None
        items.append(item)
    return items


def object_list(data: object) -> ObjectList | None:
    """A decoded list body as the command reads it, or None when it is not one (no `items`
    list of objects)."""
    body = _mapping(data)
    items = None if body is None or "items" not in body else _objects(body["items"])
    if body is None or items is None:
        return None
    meta = _mapping(body.get("metadata")) or {}
    version = meta.get("resourceVersion")
    return {
        "metadata": {"resourceVersion": version} if isinstance(version, str) else {},
        "items": items,
    }


def watch_event(data: object) -> WatchEvent | None:
    """A change the client's Watch yields (a dict; `raw_object` the object as served,
    where the client also made its own model of it), or None when it is not one."""
    change = _mapping(data)
    if change is None:
        return None
    kind = change.get("type")
    obj = change.get("raw_object") or change.get("object")
    if not isinstance(kind, str) or not isinstance(obj, dict):
        return None
    return {"type": kind, "object": obj}
