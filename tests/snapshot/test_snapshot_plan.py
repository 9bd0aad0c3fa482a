"""The agreement (elastic_snapshot.plan): which state the ranks of a new round load."""

from __future__ import annotations

import dataclasses

from elastic_snapshot.plan import CHECKPOINT, MEMORY, NONE, OWN, REPLICA, Held, decide
from hypothesis import given
from hypothesis import strategies as st


def own(
    rank: int,
    step: int,
    *,
    world: int = 3,
    owner: int | None = None,
    shard: bool = False,
    node: str | None = None,
    last: int | None = None,
) -> Held:
    return Held(
        rank=rank,
        node=node or f"node{rank}",
        file=f"own-w{world}-r{rank if owner is None else owner}-s{step}.snap",
        kind=OWN,
        step=step,
        last_step=step if last is None else last,
        world=world,
        owner=rank if owner is None else owner,
        replicated=True,
        shard=shard,
    )


def replica(rank: int, step: int, owner: int, *, world: int = 3) -> Held:
    return Held(
        rank=rank,
        node=f"node{rank}",
        file=f"replica-w{world}-r{owner}-s{step}.snap",
        kind=REPLICA,
        step=step,
        last_step=step,
        world=world,
        owner=owner,
        replicated=False,
        shard=True,
    )


def test_replicated_the_newest_step_wins_served_by_the_lowest_rank_holding_it() -> None:
    plan = decide([own(0, 7), own(1, 9), own(2, 9)], checkpoint=5, sharded=False)
    assert (plan.source, plan.step) == (MEMORY, 9)
    assert plan.replicated_from is not None and plan.replicated_from.rank == 1
    assert plan.lost == 0


held_steps = st.lists(st.integers(min_value=0, max_value=50), min_size=1, max_size=8)


@given(held_steps, st.one_of(st.none(), st.integers(min_value=0, max_value=60)))
def test_a_rank_holding_an_older_step_never_wins(steps: list[int], checkpoint: int | None) -> None:
    held = [own(rank, step) for rank, step in enumerate(steps)]
    plan = decide(held, checkpoint, sharded=False)
    newest = max(steps)
    if checkpoint is not None and checkpoint > newest:
        assert (plan.source, plan.step) == (CHECKPOINT, checkpoint)
        return
    assert (plan.source, plan.step) == (MEMORY, newest)  # equal steps: memory over checkpoint
    assert plan.replicated_from is not None
    assert plan.replicated_from.step == newest
    assert plan.replicated_from.rank == min(r for r, s in enumerate(steps) if s == newest)


def test_nothing_held_and_no_checkpoint_is_a_first_start() -> None:
    assert decide([], None, sharded=False).source == NONE
    assert decide([], 20, sharded=True).source == CHECKPOINT


def test_a_lost_nodes_shard_is_served_from_its_successors_replica() -> None:
    # Ranks 0 and 2 of a world of 3 survived (new ranks 0 and 1); rank 1 of the old world is
    # lost, its shard of step 12 is the replica held by the old rank 2 (new rank 1).
    held = [
        own(0, 12, shard=True),
        replica(0, 12, owner=2),
        own(1, 12, owner=2, shard=True),
        replica(1, 12, owner=1),
    ]
    plan = decide(held, checkpoint=10, sharded=True)
    assert (plan.source, plan.step, plan.world) == (MEMORY, 12, 3)
    assert {owner: (h.rank, h.kind) for owner, h in plan.shards.items()} == {
        0: (0, OWN),
        1: (1, REPLICA),
        2: (1, OWN),
    }


def test_a_replica_one_step_behind_brings_everyone_to_that_step() -> None:
    # The lost node's last exchange did not complete: its successor holds step 11, the
    # survivors hold their own shards of 12 (live) and 11 (their previous copy).
    held = [
        own(0, 12, shard=True),
        own(0, 11, shard=True),
        replica(0, 11, owner=2),
        own(1, 12, owner=2, shard=True, last=12),
        own(1, 11, owner=2, shard=True, last=12),
        replica(1, 11, owner=1),
    ]
    plan = decide(held, checkpoint=None, sharded=True)
    assert (plan.source, plan.step, plan.lost) == (MEMORY, 11, 1)
    assert "step 12 (world 3): the shards of ranks 1 are held by nobody" in plan.note


def test_two_adjacent_nodes_lost_fall_back_to_the_checkpoint_and_say_which_shards() -> None:
    # World 4; old ranks 1 and 2 lost: shard 1 was on 1 (own) and 2 (replica).
    held = [
        own(0, 30, world=4, shard=True),
        replica(0, 30, owner=3, world=4),
        own(1, 30, world=4, owner=3, shard=True),
        replica(1, 30, owner=2, world=4),
    ]
    plan = decide(held, checkpoint=28, sharded=True)
    assert (plan.source, plan.step, plan.lost) == (CHECKPOINT, 28, 2)
    assert plan.note == (
        "step 30 (world 4): the shards of ranks 1 are held by nobody "
        "(a node and the next one in the ring lost)"
    )


def test_files_that_failed_their_check_are_left_out() -> None:
    held = [own(0, 9), own(1, 9), own(2, 8)]
    first = decide(held, None, sharded=False)
    assert first.replicated_from is not None and first.replicated_from.rank == 0
    again = decide(held, None, sharded=False, excluded=frozenset({first.replicated_from.key()}))
    assert again.replicated_from is not None and again.replicated_from.rank == 1
    both = frozenset({held[0].key(), held[1].key()})
    assert decide(held, None, sharded=False, excluded=both).step == 8


def test_replicated_and_sharded_files_do_not_mix() -> None:
    """A DDP snapshot cannot restore an FSDP2 model of the same shapes, nor the reverse."""
    assert decide([own(0, 5)], None, sharded=True).source == NONE
    assert decide([own(0, 5, shard=True)], None, sharded=False).source == NONE


def test_ranks_holding_the_same_bytes_load_their_own_the_others_receive() -> None:
    """DDP survivors load their own copy; a new node (nothing held) or a rank whose copy of
    that step differs (another digest) gets the server's bytes from a holder."""
    held = [
        dataclasses.replace(own(0, 9), digest=7),
        dataclasses.replace(own(1, 9), digest=7),
        dataclasses.replace(own(2, 9), digest=8),
        own(3, 4),
    ]
    plan = decide(held, None, sharded=False)
    assert plan.replicated_from is not None and plan.replicated_from.rank == 0
    assert [h.rank for h in plan.replicated_holders] == [0, 1]
