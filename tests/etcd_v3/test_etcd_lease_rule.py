"""etcd-lease's decision rule and its decisions' encoding: pure, no etcd."""

from __future__ import annotations

import json

import pytest
from torch_etcd_v3.client import KeyValue
from torch_etcd_v3.rounds import rule
from torch_etcd_v3.rounds.state import NodeInfo, RosterMissing, Round


def counts(live: int, joined: int, *, first: bool = False, broken: bool = False) -> rule.Counts:
    return rule.Counts(live=live, joined=joined, first=first, broken=broken)


@pytest.mark.parametrize(
    ("seen", "now", "last_call"),
    [
        # The first round: at max_nodes at once; at min_nodes only after the last call.
        (counts(4, 4, first=True), True, True),
        (counts(3, 3, first=True), False, True),
        (counts(1, 1, first=True), False, False),
        # A later round while the last one trains (no member left it): spares never form
        # one of their own, however many.
        (counts(6, 2), False, False),
        (counts(9, 5), False, False),
        # ... unless every live node has joined (the last round's members are all gone).
        (counts(2, 2), True, False),
        # A member left (rejoined or gone): at once when every live node joined...
        (counts(3, 3, broken=True), True, True),
        # ... or at max_nodes, or at min_nodes after the last call.
        (counts(5, 4, broken=True), True, True),
        (counts(5, 3, broken=True), False, True),
        (counts(5, 1, broken=True), False, False),
    ],
)
def test_when_a_round_is_decided(seen: rule.Counts, now: bool, last_call: bool) -> None:
    # min_nodes 2, max_nodes 4
    assert rule.now(seen, 2, 4) is now
    assert rule.at_last_call(seen, 2) is last_call


def test_the_members_of_the_round_before_keep_their_order_and_rank_0() -> None:
    previous = ["a", "b", "c"]
    joined = ["x", "c", "a", "y"]  # the order they joined in
    assert rule.rank_order(previous, joined, 4) == ["a", "c", "x", "y"]
    assert rule.rank_order(previous, joined, 3) == ["a", "c", "x"]  # y: a spare
    assert rule.rank_order([], joined, 10) == joined


def _kv(value: bytes, version: int = 2, revision: int = 50) -> KeyValue:
    return KeyValue(b"d", value, revision, lease=7, version=version)


def test_a_decision_that_changes_little_is_written_as_the_change_and_read_back() -> None:
    before = Round(0, 40, tuple(f"n{i}" for i in range(100)), "10.0.0.1", 29500, 7, 90, 100)
    after = Round(
        1, 0, tuple(m for m in before.members if m != "n5"), "10.0.0.1", 29500, 8, 90, 100
    )
    value = after.encode(before)
    assert len(value) < 200  # not the 100 members: each member reads this at a re-form
    assert json.loads(value)["drop"] == ["n5"]
    read = Round.of(_kv(value), known=before)
    assert read.members == after.members
    assert (read.number, read.id, read.min_nodes, read.max_nodes) == (1, 50, 90, 100)
    # A node that does not know the round it changes reads the roster in full.
    roster = {1: after.roster()}
    assert Round.of(_kv(value), known=None, roster=roster.get).members == after.members
    with pytest.raises(RosterMissing):
        Round.of(_kv(value), known=None, roster=lambda number: None)


def test_a_decision_that_changes_much_is_written_in_full() -> None:
    before = Round(0, 40, ("a", "b"), "h", 1, 7)
    after = Round(1, 0, ("c", "d", "e"), "h", 2, 8)
    assert json.loads(after.encode(before))["members"] == ["c", "d", "e"]


def test_node_info_round_trips_and_reads_an_entry_without_a_port() -> None:
    info = NodeInfo("host-0.svc", 4242, 0, 29500)
    assert NodeInfo.decode(info.encode()) == info
    assert NodeInfo.decode(b'["h", 1, 0]') == NodeInfo("h", 1, 0, 0)
