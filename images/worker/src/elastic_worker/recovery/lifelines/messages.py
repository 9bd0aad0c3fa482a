"""The lifelines' messages, in one module: what a lifeline says to a peer (server.py to
client.py) and what the helper is asked and answers (helper.py). Standard library only.

A lifeline, on connect: one JSON line `{"pid": <this pod's torchrun's pid, or null>}`;
then nothing until `bye` (the elastic-worker ends on purpose) or the close of the
connection (its process died). docs/contracts.md, "Lifelines".

The helper, one request per line on its stdin, one JSON line answering each on stdout:

    participants              -> {"nodes": [[addr, pid], ...]}
    round                     -> {"round": R, "complete": bool, "ranks": [[addr, pid, rank], ...],
                                  "keep_alive": seconds}
    remove ADDR PID SINCE     -> {"removed": bool}   another pod's node, dead since SINCE
    leave ADDR PID            -> {"removed": bool}   this pod's own node (a SIGTERM)
    anything that fails       -> {"error": "..."}
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from elastic_worker.torchcompat import RdzvNode, RoundView

BYE = b"bye\n"  # the only thing a lifeline sends after its greeting


def greeting(pid: int | None) -> bytes:
    return (json.dumps({"pid": pid}) + "\n").encode()


def greeted_pid(line: bytes) -> int | None:
    """The pid of a greeting line; raises ValueError, KeyError or TypeError for anything
    else (ConnectionResetError for a line cut short: the peer closed before it ended)."""
    if not line.endswith(b"\n"):
        raise ConnectionResetError("closed before its greeting")
    pid = json.loads(line)["pid"]
    return pid if isinstance(pid, int) else None


class HelperError(RuntimeError):
    """The lifelines' helper did not answer, or answered with an error."""


def participants_request() -> str:
    return "participants"


def round_request() -> str:
    return "round"


def round_reply(view: RoundView) -> str:
    ranks = [[addr, pid, rank] for (addr, pid), rank in view.ranks.items()]
    return reply(round=view.round, complete=view.complete, ranks=ranks, keep_alive=view.keep_alive)


def round_of(reply: dict[str, Any]) -> RoundView:
    ranks = {(str(a), int(p)): int(r) for a, p, r in reply["ranks"]}
    return RoundView(
        int(reply["round"]), bool(reply["complete"]), ranks, float(reply["keep_alive"])
    )


def remove_request(node: RdzvNode, since: float) -> str:
    return f"remove {node[0]} {node[1]} {since!r}"


def leave_request(node: RdzvNode) -> str:
    return f"leave {node[0]} {node[1]}"


def parse_reply(line: bytes) -> dict[str, Any]:
    """A helper's answer; HelperError for one that is not JSON or says an error."""
    try:
        reply: dict[str, Any] = json.loads(line)
    except ValueError as exc:
        raise HelperError(f"the lifelines' helper answered {line!r}") from exc
    if "error" in reply:
        raise HelperError(reply["error"])
    return reply


def nodes_of(reply: dict[str, Any]) -> list[RdzvNode]:
    return [(str(a), int(p)) for a, p in reply["nodes"]]


@dataclass(frozen=True)
class Request:
    """One request as the helper reads it: `kind` participants, round, remove or leave."""

    kind: str
    node: RdzvNode | None = None
    since: float | None = None


def read_request(line: str) -> Request:
    """The request on `line`; ValueError for anything else."""
    words = line.split()
    if words in (["participants"], ["round"]):
        return Request(words[0])
    if len(words) == 4 and words[0] == "remove":
        return Request("remove", (words[1], int(words[2])), float(words[3]))
    if len(words) == 3 and words[0] == "leave":
        return Request("leave", (words[1], int(words[2])))
    raise ValueError(f"unknown request {line.strip()!r}")


def reply(**fields: object) -> str:
    """One answer line (without its newline)."""
    return json.dumps(fields)
