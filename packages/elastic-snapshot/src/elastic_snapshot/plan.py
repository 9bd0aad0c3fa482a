"""The agreement: from what every rank of the new round holds, the one state all load.

Every rank announces the snapshot files it can read (`Held`), rank 0 also the newest
checkpoint's step; `decide` is a pure function of those announcements, so every rank,
given the same all_gather, computes the same `Plan`:

- replicated state (DDP): the newest step any own file holds; every rank holding the same
  bytes (step and digest) loads its own copy, the others get it from one of them;
- sharded state (FSDP2) of a world of W ranks: the newest step at which each of the W
  shards is held (by its owner's own file, else by the replica on the next node) and an
  own file gives the replicated part; each shard served by one holder;
- the checkpoint when it is newer than that, or when no memory covers a whole state (two
  adjacent nodes lost: `note` says which shards nobody holds); nothing on a first start.

A rank holding an older step never wins; at equal steps memory wins over the checkpoint.
No torch here: the tests give it announcements.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field

OWN, REPLICA = "own", "replica"
MEMORY, CHECKPOINT, NONE = "memory", "checkpoint", "none"


@dataclass(frozen=True)
class Held:
    """A snapshot file that rank `rank` (of the new round) can read."""

    rank: int
    node: str
    file: str
    kind: str  # OWN or REPLICA
    step: int
    last_step: int
    world: int
    owner: int
    replicated: bool  # has the replicated part (own files)
    shard: bool  # has a shard (sharded states)
    layout: int = 0  # a hash of the tensors' specs: files of one state have the same
    digest: int = 0  # of the replicated part's content (own files): equal copies, equal digest

    def key(self) -> tuple[str, str]:
        return self.node, self.file


@dataclass(frozen=True)
class Plan:
    source: str  # MEMORY, CHECKPOINT or NONE
    step: int  # the step every rank loads (0 for NONE)
    world: int = 0  # the world size of the layout the memory state was written in
    replicated_from: Held | None = None  # the file whose trailer (skeleton, specs) all use
    # One file per rank that holds those same replicated bytes (replicated_from's among them).
    replicated_holders: tuple[Held, ...] = ()
    shards: dict[int, Held] = field(default_factory=dict)  # old rank -> who serves its shard
    lost: int | None = None  # newest step completed before the loss minus `step`
    note: str = ""  # why memory was not used although some was held


def decide(
    held: Iterable[Held],
    checkpoint: int | None,
    sharded: bool,
    excluded: frozenset[tuple[str, str]] = frozenset(),
) -> Plan:
    usable = [h for h in held if h.key() not in excluded]
    best, note = (_sharded if sharded else _replicated)(usable)
    newest = max((h.last_step for h in usable), default=None)
    if checkpoint is not None and (best is None or checkpoint > best.step):
        if best is not None:
            note = f"the checkpoint (step {checkpoint}) is newer than memory (step {best.step})"
        lost = None if newest is None else max(0, newest - checkpoint)
        return Plan(CHECKPOINT, checkpoint, lost=lost, note=note)
    if best is None:
        return Plan(NONE, 0, note=note)
    lost = max(0, (newest if newest is not None else best.step) - best.step)
    return Plan(
        MEMORY,
        best.step,
        best.world,
        best.replicated_from,
        best.replicated_holders,
        best.shards,
        lost=lost,
        note=note,
    )


def _holders(server: Held, candidates: list[Held]) -> tuple[Held, ...]:
    """One file per rank holding what `server` holds (the same step and bytes)."""
    same = [h for h in candidates if (h.step, h.digest) == (server.step, server.digest)]
    by_rank: dict[int, Held] = {}
    for h in sorted(same, key=lambda h: (h.rank, h.file)):
        by_rank.setdefault(h.rank, h)
    return tuple(by_rank.values())


def _replicated(held: list[Held]) -> tuple[Plan | None, str]:
    own = [h for h in held if h.kind == OWN and h.replicated and not h.shard]
    if not own:
        return None, ""
    top = max(h.step for h in own)
    server = min((h for h in own if h.step == top), key=lambda h: (h.rank, h.file))
    return Plan(MEMORY, top, server.world, server, _holders(server, own)), ""


def _sharded(held: list[Held]) -> tuple[Plan | None, str]:
    groups: dict[tuple[int, int, int], list[Held]] = defaultdict(list)
    for h in held:
        if h.shard:
            groups[(h.step, h.world, h.layout)].append(h)
    note = ""
    for step, world, layout in sorted(groups, reverse=True):
        files = groups[(step, world, layout)]
        shards: dict[int, Held] = {}
        # The owner's own file first, then a replica; the lowest rank among equals.
        for h in sorted(files, key=lambda h: (h.kind != OWN, h.rank, h.file)):
            if 0 <= h.owner < world:
                shards.setdefault(h.owner, h)
        missing = [r for r in range(world) if r not in shards]
        own = [h for h in files if h.kind == OWN and h.replicated]
        if not missing and own:
            server = min(own, key=lambda h: (h.rank, h.file))
            return Plan(MEMORY, step, world, server, _holders(server, own), shards), note
        if not note and missing:
            note = (
                f"step {step} (world {world}): the shards of ranks "
                f"{','.join(map(str, missing))} are held by nobody (a node and the next one "
                "in the ring lost)"
            )
        elif not note:
            note = f"step {step} (world {world}): no rank holds its replicated part"
    return None, note
