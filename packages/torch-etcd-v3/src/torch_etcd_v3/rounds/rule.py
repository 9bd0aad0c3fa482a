"""When a round is decided, and who is in it: pure functions of what etcd counts.

torch's dynamic rendezvous, kept where it matters to its agent:
- the first round forms at `max_nodes`, or at `min_nodes` once the last call has passed
  with no new node (`last_call_timeout`);
- a later round forms only once the round before it is broken up (torch moves to the next
  round when the last participant has left the completed one): a member of it has left
  (rejoined, or was taken out). Spares waiting while a round trains never form one of
  their own;
- it forms at once when every live node of the job has joined it (a re-form need not wait
  the last call: nobody else is coming), else at `max_nodes`, else at `min_nodes` once the
  last call has passed;
- nodes beyond `max_nodes` wait as spares for the next round (torch's redundancy list).

Ranks: the members of the round before keep their order (rank 0 stays where it was, so
the master moves only when its node left), then the others by the order they joined in.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Counts:
    """What one read of etcd says about the open round."""

    #: Nodes with a membership key (their lease alive).
    live: int
    #: Of them, those that joined the open round (wrote their key after the last decision).
    joined: int
    #: No round was decided yet (or the last decision's lease lapsed: all its members died).
    first: bool
    #: A member of the last round has left it (rejoined, or was taken out).
    broken: bool


def now(c: Counts, min_nodes: int, max_nodes: int) -> bool:
    """The open round may be decided at once."""
    if c.first:
        return c.joined >= max_nodes
    if c.joined >= min_nodes and c.joined >= c.live:
        return True  # every live node has joined: nobody else is coming
    return c.broken and c.joined >= max_nodes


def at_last_call(c: Counts, min_nodes: int) -> bool:
    """The open round may be decided once the last call has passed with no new node."""
    return c.joined >= min_nodes and (c.first or c.broken)


def rank_order(previous: Sequence[str], joined: Iterable[str], max_nodes: int) -> list[str]:
    """The members of the round, in rank order: the nodes of `previous` (the round before,
    in its rank order) that joined, then the others in `joined`'s order (the order they
    joined in); at most `max_nodes`."""
    joined = list(joined)
    present = set(joined)
    kept = [n for n in previous if n in present]
    seen = set(kept)
    return (kept + [n for n in joined if n not in seen])[:max_nodes]
