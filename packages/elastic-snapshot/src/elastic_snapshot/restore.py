"""The restore: every rank of the new round says what it holds, one collective agrees, the
holders serve, every rank loads the same step, checked.

1. Each rank reads the trailers of the snapshot files on its node (store.scan) and
   announces them; rank 0 adds the newest checkpoint's step (one all_gather_object).
2. plan.decide, the same on every rank: memory (which step, who serves what), the
   checkpoint, or nothing.
3. Memory: a rank that holds the chosen replicated part (the same step and bytes) loads
   its own copy; the others receive it point to point from those holders (round robin).
   For a sharded state every rank also receives, point to point, the rows of each tensor
   its new shard needs from the rank holding the old shard that has them, into the tensors
   it will load (a new world size is resharded on the way: each rank receives about
   1/world of the state, and needs no memory beyond its new shard). Every copy loaded or
   sent is checked against its CRC-32s while the bytes move; one all_gather_object then
   says whether any part failed its check, before anything is loaded: then the plan is
   made again without those files (at most three times), else the checkpoint.
4. Load (set_model_state_dict, each optimizer's load_state_dict, extra), then one
   all_gather_object checks that every rank loaded the same step of the same state.
   The node's files are removed (the live state is newer from now on: renamed at once,
   freed in a thread), and with a ring replica the new layout is replicated before the
   first step.
"""

from __future__ import annotations

import time
import zlib
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from itertools import chain
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import get_model_state_dict, set_model_state_dict
from torch.distributed.tensor import DTensor

from . import report, store
from .plan import CHECKPOINT, MEMORY, NONE, Held, Plan, decide
from .ring import specs_hash
from .state import Json, Slot, SnapshotError, Spec, as_buffer, layout, rows, unflatten

if TYPE_CHECKING:
    from .snapshots import Snapshots

ATTEMPTS = 3
_REPLICATED_TAG = 1 << 20  # above the shards' tags (old ranks)


@dataclass(frozen=True)
class Restored:
    """What `Snapshots.restore` loaded: the step to go on from (the steps completed), the
    data position saved with it, where this node's state came from (report.SOURCES), the
    steps lost (None: unknown) and the seconds the restore took."""

    step: int
    data_position: Json
    source: str
    lost: int | None
    seconds: float


def restore(
    snap: Snapshots, checkpoint_step: int | None, load_checkpoint: Callable[[int], Any] | None
) -> Restored:
    started = time.monotonic()
    opened, notes = store.scan(snap.directory, snap.job, snap.name, snap.model_fingerprint)
    for note in notes:
        report.say(note)
    files = {o.path.name: o for o in opened}
    mine = [_held(snap, o) for o in opened]
    gathered = _gather(snap, (mine, checkpoint_step if snap.rank == 0 else None), snap.group)
    held = [h for announced, _ in gathered for h in announced]
    checkpoint = gathered[0][1]
    if checkpoint is not None and load_checkpoint is None:
        raise ValueError("restore: give load_checkpoint with checkpoint_step")

    plan, loaded = _from_memory(snap, held, checkpoint, files)
    if plan.note and snap.rank == 0:
        what = f"restoring step {plan.step}" if plan.source == MEMORY else "not from memory"
        report.warn(f"{what}: {plan.note}")
    copying = False  # the state was kept by a script whose step spans several updates
    if plan.source == MEMORY and loaded is not None:
        data_position, source, digest, copying = loaded
    elif plan.source == CHECKPOINT:
        assert load_checkpoint is not None
        with snap.gate.ignoring():
            data_position = load_checkpoint(plan.step)
        source, digest = "checkpoint", 0
    else:
        plan, data_position, source, digest = Plan(NONE, 0), None, "none", 0
    # Every rank loaded the same step of the same state, or none goes on.
    checks = _gather(snap, (plan.step, digest, source), snap.group)
    if len({(step, d) for step, d, _ in checks}) != 1:
        raise SnapshotError(f"ranks loaded different states: {sorted(set(checks))}")
    # The node's files go (the live state is newer from now on), freed in a thread.
    node_files = snap.directory if snap.local_rank == 0 and plan.source == MEMORY else None
    snap.released = store.release(node_files, opened)
    del files, opened
    snap.gate.done(plan.step, data_position)
    ring_copied = snap.ring is not None and plan.source != NONE
    if ring_copied:
        assert snap.ring is not None
        snap.ring.offer(plan.step, data_position, snap.live())
    if copying:  # a loss before its next step_done must find this step's state
        snap._copy_each_step(plan.step, data_position, ring_copied=ring_copied)
    seconds = time.monotonic() - started
    report.progress(report.restored_line(plan.step, source, plan.lost))
    if snap.rank == 0 and plan.source != NONE:
        sources = {s for _, _, s in checks}
        job_source = next(s for s in report.SOURCES if s in sources)
        lost = "-" if plan.lost is None else plan.lost
        was = f", was {plan.world}" if plan.source == MEMORY else ""
        report.warn(
            f"restored step={plan.step} from {job_source} (world {snap.world}{was}), "
            f"lost={lost} step(s), {seconds:.2f} s"
        )
    return Restored(plan.step, data_position, source, plan.lost, seconds)


def _from_memory(
    snap: Snapshots, held: list[Held], checkpoint: int | None, files: dict[str, store.Opened]
) -> tuple[Plan, tuple[Json, str, int, bool] | None]:
    """The plan, and what was loaded from memory (data position, this rank's source, the
    digest the ranks compare, whether its writer copied each step) when it says memory. A
    file that fails its check is left out and the plan made again (ATTEMPTS times); a state
    the model cannot take, the checkpoint."""
    excluded: set[tuple[str, str]] = set()
    plan = decide(held, checkpoint, snap.sharded)
    for _attempt in range(ATTEMPTS):
        if plan.source != MEMORY:
            return plan, None
        bad: list[tuple[str, str]] = []
        received = _receive(snap, plan, files, bad)
        failed = {(str(n), str(f)) for b in _gather(snap, bad, snap.group) for n, f in b}
        if failed:
            for node, name in sorted(failed):
                report.warn(f"snapshot {name} on {node} failed its CRC-32 check: not used")
            excluded |= failed
            plan = decide(held, checkpoint, snap.sharded, frozenset(excluded))
            continue
        errors = [e for e in _gather(snap, _load(snap, received), snap.group) if e]
        if errors:  # a state this model cannot take: no other copy would do better
            instead = "the checkpoint" if checkpoint is not None else "none: starting afresh"
            report.say(f"memory state not loaded ({errors[0]}); using {instead}")
            return decide([], checkpoint, snap.sharded), None
        source = "local-memory" if received.nodes <= {snap.node} else "peer-memory"
        header = received.header
        return plan, (header.data_position, source, _digest(received.image), header.copying)
    return decide([], checkpoint, snap.sharded), None


def _gather(snap: Snapshots, value: Any, group: Any) -> list[Any]:
    out: list[Any] = [None] * snap.world
    dist.all_gather_object(out, value, group=group)
    return out


def _digest(image: torch.Tensor, windows: int = 16, width: int = 1 << 16) -> int:
    """A CRC-32 of the size and of `windows` evenly spaced `width`-byte windows of the
    replicated bytes this rank loads: the ranks compare it (cheap, whatever the size)."""
    value = zlib.crc32(str(image.numel()).encode())
    step = max(width, image.numel() // windows)
    for start in range(0, image.numel(), step):
        value = zlib.crc32(as_buffer(image[start : start + width]), value)
    return value


def _held(snap: Snapshots, opened: store.Opened) -> Held:
    h = opened.header
    return Held(
        rank=snap.rank,
        node=snap.node,
        file=opened.path.name,
        kind=h.kind,
        step=h.step,
        last_step=h.last_step,
        world=h.world,
        owner=h.owner,
        replicated=h.replicated is not None,
        shard=h.shard is not None,
        layout=specs_hash(h.specs),
        digest=h.replicated.digest() if h.replicated is not None else 0,
    )


@dataclass
class _Received:
    header: store.Header
    image: torch.Tensor  # the replicated part's bytes
    shards: dict[int, torch.Tensor]  # spec index -> this rank's new local rows
    borrowed: set[int]  # the spec indexes of `shards` that are views of this node's files
    nodes: set[str]  # the nodes the bytes came from


def _receive(
    snap: Snapshots, plan: Plan, files: dict[str, store.Opened], bad: list[tuple[str, str]]
) -> _Received:
    server = plan.replicated_from
    assert server is not None
    me, group = snap.rank, snap.group
    serving = files[server.file] if server.rank == me else None
    box: list[Any] = [serving.header.to_json() if serving is not None else None]
    dist.broadcast_object_list(box, src=server.rank, group=group)
    header = store.Header.from_json(box[0])
    assert header.replicated is not None
    holders = {h.rank: h for h in plan.replicated_holders}
    checks = [(holders[me], "replicated")] if me in holders else []
    checks += [(h, "shard") for h in plan.shards.values() if h.rank == me]
    for h, which in checks:
        files[h.file].part(which)  # mapped here: the check's thread and this one share it
    # What this rank serves or loads from its own files is checked while the bytes move:
    # nothing received is loaded before every rank has said its checks passed (the caller's
    # gather), so a check need not come first, and its time is hidden behind the transfers.
    with ThreadPoolExecutor(1, thread_name_prefix="elastic-snapshot-crc") as pool:
        failed = pool.submit(
            lambda: [h.key() for h, which in checks if not files[h.file].verify(which)]
        )
        image, nodes = _replicated_part(snap, plan, header.replicated.size, files)
        shards: dict[int, torch.Tensor] = {}
        borrowed: set[int] = set()
        if plan.shards:
            shards, borrowed, shard_nodes = _reshard(snap, plan, header.specs, files, group)
            nodes |= shard_nodes
        bad.extend(failed.result())
    return _Received(header, image, shards, borrowed, nodes)


def _replicated_part(
    snap: Snapshots, plan: Plan, size: int, files: dict[str, store.Opened]
) -> tuple[torch.Tensor, set[str]]:
    """This rank's replicated bytes, and the nodes they came from: its own copy when it
    holds the same bytes, else point to point from a rank that does (the ranks that hold
    nothing are spread over those that hold it, round robin). The caller checks the copies."""
    me, group = snap.rank, snap.group
    holders = {h.rank: h for h in plan.replicated_holders}
    sources = sorted(holders)
    needers = [r for r in range(snap.world) if r not in holders]
    source_of = {needer: sources[i % len(sources)] for i, needer in enumerate(needers)}
    if me in holders:
        image = files[holders[me].file].part("replicated")
        nodes = {snap.node}
    else:
        image = torch.empty(size, dtype=torch.uint8)
        nodes = {holders[source_of[me]].node}
    works = []
    for needer, source in source_of.items():
        if source == me and size:
            works.append(dist.isend(image, needer, group=group, tag=_REPLICATED_TAG))
        elif needer == me and size:
            works.append(dist.irecv(image, source, group=group, tag=_REPLICATED_TAG))
    for work in works:
        if work is not None:
            work.wait()
    return image, nodes


def _overlapping(length: int, parts: int, lo: int, hi: int) -> range:
    """The shards (of `parts`, torch.chunk's split) holding any of the rows [lo, hi)."""
    size = -(-length // parts)
    if hi <= lo or size == 0:
        return range(0)
    return range(lo // size, min(parts, (hi - 1) // size + 1))


def _reshard(
    snap: Snapshots,
    plan: Plan,
    specs: tuple[Spec, ...],
    files: dict[str, store.Opened],
    group: Any,
) -> tuple[dict[int, torch.Tensor], set[int], set[str]]:
    """This rank's rows of every sharded tensor in the new world, each received from the
    rank holding the old shard that has them (point to point; a local copy for its own, or
    the file's own bytes when one local old shard holds them all: `borrowed`)."""
    me, world, old_world = snap.rank, snap.world, plan.world
    old_slots = {
        owner: {s.index: s for s in layout(specs, True, old_world, owner)[0]}
        for owner, h in plan.shards.items()
        if h.rank == me
    }
    old_bytes = {owner: files[plan.shards[owner].file].part("shard") for owner in old_slots}
    out: dict[int, torch.Tensor] = {}
    borrowed: set[int] = set()
    nodes: set[str] = set()
    works: list[Any] = []
    copies: list[tuple[torch.Tensor, torch.Tensor]] = []
    for index, spec in enumerate(specs):
        if not spec.sharded:
            continue
        length, row_bytes = spec.shape[0], spec.row_bytes()
        start, stop = rows(length, world, me)
        holding = _overlapping(length, old_world, start, stop)
        own = [o for o in holding if plan.shards[o].rank == me]
        if len(holding) == 1 and own and rows(length, old_world, own[0]) == (start, stop):
            target = _old_rows(
                old_bytes[own[0]], old_slots[own[0]][index], row_bytes, start, range(start, stop)
            )
            borrowed.add(index)
            nodes.add(plan.shards[own[0]].node)
            holding = range(0)  # nothing to copy: the same rows in the same world
        else:
            target = torch.empty((stop - start) * row_bytes, dtype=torch.uint8)
        # What this rank receives: the rows [start, stop) from the old shards holding them.
        for owner in holding:
            old_start, old_stop = rows(length, old_world, owner)
            lo, hi = max(start, old_start), min(stop, old_stop)
            h = plan.shards[owner]
            nodes.add(h.node)
            into = target[(lo - start) * row_bytes : (hi - start) * row_bytes]
            if h.rank == me:
                slot = old_slots[owner][index]
                copies.append(
                    (into, _old_rows(old_bytes[owner], slot, row_bytes, old_start, range(lo, hi)))
                )
            else:
                works.append(dist.irecv(into, h.rank, group=group, tag=owner))
        for owner, old in old_bytes.items():
            slot = old_slots[owner][index]
            works += _send_rows(snap, spec, owner, old=old, slot=slot, old_world=old_world)
        out[index] = target.view(spec.torch_dtype()).view(spec.local_shape(world, me))
    # Every transfer is posted before any is waited for: gloo moves them in its own threads
    # while this one copies the rows it holds itself (messages between two ranks with one
    # tag are matched in the order they were posted, the same order on both sides).
    for into, source in copies:
        into.copy_(source)
    for work in works:
        if work is not None:
            work.wait()
    return out, borrowed, nodes


def _send_rows(
    snap: Snapshots, spec: Spec, owner: int, *, old: torch.Tensor, slot: Slot, old_world: int
) -> list[Any]:
    """Send the rows of old shard `owner` (its bytes `old`, this tensor at `slot`) to the
    other ranks whose new shards hold them."""
    length, row_bytes = spec.shape[0], spec.row_bytes()
    old_start, old_stop = rows(length, old_world, owner)
    works = []
    for peer in _overlapping(length, snap.world, old_start, old_stop):
        if peer == snap.rank:
            continue
        peer_start, peer_stop = rows(length, snap.world, peer)
        span = range(max(peer_start, old_start), min(peer_stop, old_stop))
        source = _old_rows(old, slot, row_bytes, old_start, span)
        works.append(dist.isend(source, peer, group=snap.group, tag=owner))
    return works


def _old_rows(
    part: torch.Tensor, slot: Slot, row_bytes: int, first: int, span: range
) -> torch.Tensor:
    """Rows `span` of a tensor whose old shard starts at row `first` and sits at `slot`."""
    base = slot.offset + (span.start - first) * row_bytes
    return part[base : base + len(span) * row_bytes]


def _load(snap: Snapshots, received: _Received) -> str:
    """Load what was received; an error that this model cannot take it, or ""."""
    try:
        _set(snap, received)
    except (SnapshotError, RuntimeError, ValueError, KeyError, TypeError, IndexError) as exc:
        return f"rank {snap.rank}: {type(exc).__name__}: {exc}"
    return ""


def _local(
    received: _Received, slots: dict[int, Slot], index: int, spec: Spec, copied: bool
) -> torch.Tensor:
    """This rank's tensor `index` as received. A tensor that is `copied` on its way (the
    model's entries, into its own tensors: set_model_state_dict does not assign; or to a
    GPU) may view a file or the received bytes; the rest (optimizer state, extra) may be
    kept as given, so such a view becomes a tensor of its own first."""
    if spec.sharded:
        local = received.shards[index]
        viewed = index in received.borrowed
    else:
        slot = slots[index]
        image = received.image[slot.offset : slot.offset + slot.nbytes]
        local, viewed = image.view(spec.torch_dtype()).view(spec.shape), True
    return local if copied or not viewed else local.clone()


def _set(snap: Snapshots, received: _Received) -> None:
    header = received.header
    specs = header.specs
    slots = {s.index: s for s in layout(specs, False, header.world, header.owner)[0]}
    template = get_model_state_dict(snap.model)
    params = [
        list(chain.from_iterable(group["params"] for group in optimizer.param_groups))
        for optimizer in snap.optimizers
    ]

    def like(path: tuple[Any, ...], spec: Spec) -> torch.Tensor | None:
        """The model's tensor a state tensor takes its placement from: the parameter or
        buffer itself, or for a sharded optimizer state (Adam's moments) its parameter."""
        found: Any = None
        if path[0] == "model" and len(path) == 2:
            found = template.get(path[1])
        elif spec.sharded and path[0] == "optim" and len(path) >= 4 and path[2] == "state":
            found = params[path[1]][path[3]]
        return found if isinstance(found, torch.Tensor) else None

    def make(index: int, path: tuple[Any, ...]) -> torch.Tensor:
        spec = specs[index]
        model = like(path, spec)
        # Copied on the way anyway: into the model's own tensors, or to its device.
        copied = path[0] == "model" or (model is not None and model.device.type != "cpu")
        local = _local(received, slots, index, spec, copied)
        if isinstance(model, DTensor):
            if tuple(model.shape) != spec.shape:
                raise SnapshotError(f"{path}: shape {spec.shape}, the model's {tuple(model.shape)}")
            if spec.sharded and tuple(model.to_local().shape) != tuple(local.shape):
                raise SnapshotError(
                    f"{path}: rows {tuple(local.shape)} for rank {snap.rank}, the model's "
                    f"shard {tuple(model.to_local().shape)}"
                )
            return DTensor.from_local(
                local.to(model.device),
                model.device_mesh,
                model.placements,
                run_check=False,
                shape=model.shape,
                stride=model.stride(),
            )
        if spec.sharded:
            raise SnapshotError(f"{path}: a sharded tensor for a model that does not shard it")
        return local

    state = unflatten(header.skeleton, make)
    set_model_state_dict(snap.model, state["model"])
    with snap.gate.ignoring():
        for optimizer, optim_state in zip(snap.optimizers, state["optim"], strict=True):
            optimizer.load_state_dict(optim_state)
    for key, obj in snap.extra.items():
        obj.load_state_dict(state["extra"][key])
