"""A state as data (elastic_snapshot.state): the skeleton keeps what optimizers and
schedulers hold, and the shard rows are torch.chunk's."""

from __future__ import annotations

import json
import sys

import pytest
import torch
from elastic_snapshot.snapshots import NUMPY, Snapshots
from elastic_snapshot.state import SnapshotError, _encode, rows, unflatten
from hypothesis import given
from hypothesis import strategies as st


@given(st.integers(min_value=0, max_value=300), st.integers(min_value=1, max_value=40))
def test_shard_rows_are_torch_chunks(length: int, parts: int) -> None:
    chunks = torch.arange(length).chunk(parts) if length else ()
    for index in range(parts):
        start, stop = rows(length, parts, index)
        expected = chunks[index].tolist() if index < len(chunks) else []
        assert list(range(start, stop)) == expected


def test_an_optimizers_state_comes_back_with_its_int_keys_and_tuples() -> None:
    net = torch.nn.Linear(3, 2)
    optim = torch.optim.AdamW(net.parameters(), lr=0.1, betas=(0.8, 0.9))
    net(torch.ones(1, 3)).sum().backward()
    optim.step()
    state = optim.state_dict()
    tensors: list[torch.Tensor] = []

    def add(t: torch.Tensor, path: str) -> object:
        tensors.append(t)
        return {"r": len(tensors) - 1}

    skeleton = json.loads(json.dumps(_encode(state, add, "state")))  # as the trailer holds it
    back = unflatten(skeleton, lambda index, path: tensors[index])
    assert back["param_groups"][0]["betas"] == (0.8, 0.9)
    assert sorted(back["state"]) == [0, 1]
    assert back["state"][1]["exp_avg"] is state["state"][1]["exp_avg"]
    torch.optim.AdamW(net.parameters()).load_state_dict(back)


def test_a_value_a_snapshot_cannot_hold_is_named_by_its_path() -> None:
    try:
        _encode({"extra": {"sched": {"fn": print}}}, lambda t, p: None, "state")
    except SnapshotError as exc:
        assert str(exc).startswith("state.extra.sched.fn: a builtin_function_or_method cannot")
    else:
        raise AssertionError("no error")


def test_without_numpy_the_script_is_told_at_construction_in_one_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """torch's object collectives, which the restore agrees through, need numpy: a script on
    an image without it learns so from Snapshots(), not from torch at its first restore
    ("Numpy is not available", after a loss)."""
    monkeypatch.setitem(sys.modules, "numpy", None)  # `import numpy` raises ImportError
    model = torch.nn.Linear(2, 1)
    with pytest.raises(RuntimeError) as refused:
        Snapshots(model, torch.optim.SGD(model.parameters(), lr=0.1))
    assert str(refused.value) == NUMPY
    assert "\n" not in NUMPY and "pip install numpy" in NUMPY
