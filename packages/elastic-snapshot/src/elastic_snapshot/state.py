"""A training state as data: a JSON skeleton that refers to tensors, and the tensors.

The state kept is `{"model": ..., "optim": [...], "extra": {...}}`: the model's state dict
(torch.distributed.checkpoint's get_model_state_dict), each optimizer's state_dict() and
each extra object's state_dict(). `flatten` turns it into a `Flat`: the skeleton (JSON, its
containers tagged so that integer keys and tuples come back as they were), one `Spec` per
tensor and the tensors this rank holds.

A tensor is *sharded* when it is a DTensor placed Shard(0) on a 1-D mesh over the whole
world (what FSDP2's fully_shard makes): this rank holds the rows `rows(...)` of dim 0.
Every other tensor is *replicated*: the same on every rank (DDP's parameters, an optimizer's
step counters, a Replicate() DTensor). Anything else (HSDP's 2-D mesh, Partial) is refused
with one error naming the tensor, when the state is first flattened.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.distributed.tensor import DTensor

Json = Any
ALIGN = 64  # bytes: every tensor starts at a multiple of this in a payload


class SnapshotError(RuntimeError):
    """A state that cannot be kept or restored: the message says which part and why."""


@dataclass(frozen=True)
class Spec:
    """One tensor of the state: its dtype (torch's name without `torch.`), its global shape
    and whether it is sharded on dim 0 across the world."""

    dtype: str
    shape: tuple[int, ...]
    sharded: bool

    def torch_dtype(self) -> torch.dtype:
        dtype = getattr(torch, self.dtype, None)
        if not isinstance(dtype, torch.dtype):
            raise SnapshotError(f"unknown dtype {self.dtype!r} in a snapshot")
        return dtype

    def row_bytes(self) -> int:
        """Bytes of one row of dim 0 (of the whole tensor when it has no dims)."""
        inner = math.prod(self.shape[1:]) if self.shape else 1
        return inner * self.torch_dtype().itemsize

    def local_shape(self, world: int, rank: int) -> tuple[int, ...]:
        if not self.sharded:
            return self.shape
        start, stop = rows(self.shape[0], world, rank)
        return (stop - start, *self.shape[1:])

    def to_json(self) -> Json:
        return [self.dtype, list(self.shape), self.sharded]

    @staticmethod
    def from_json(value: Json) -> Spec:
        dtype, shape, sharded = value
        return Spec(str(dtype), tuple(int(n) for n in shape), bool(sharded))


def rows(length: int, parts: int, index: int) -> tuple[int, int]:
    """The rows [start, stop) of dim 0 that shard `index` of `parts` holds: torch.chunk's
    split (ceil(length / parts) rows each, the last ones short or empty), the one DTensor's
    Shard(0) and FSDP2 use. `flatten` checks it against every local shard it sees."""
    size = -(-length // parts)
    start = min(index * size, length)
    return start, min(start + size, length)


@dataclass(frozen=True)
class Slot:
    """Where one tensor's bytes sit in a payload."""

    index: int  # the tensor's position in the Flat's specs
    offset: int
    nbytes: int
    shape: tuple[int, ...]  # local shape


def layout(specs: Sequence[Spec], sharded: bool, world: int, rank: int) -> tuple[list[Slot], int]:
    """The slots of the replicated part (sharded=False) or of rank `rank`'s shard of a
    `world`-rank layout (sharded=True), and the part's size in bytes."""
    slots, offset = [], 0
    for index, spec in enumerate(specs):
        if spec.sharded != sharded:
            continue
        shape = spec.local_shape(world, rank)
        nbytes = math.prod(shape) * spec.torch_dtype().itemsize
        slots.append(Slot(index, offset, nbytes, shape))
        offset += -(-nbytes // ALIGN) * ALIGN
    return slots, offset


@dataclass
class Flat:
    """A flattened state: `tensors[i]` is this rank's part of `specs[i]` (the whole tensor
    when replicated, the local rows when sharded)."""

    skeleton: Json
    specs: list[Spec]
    tensors: list[torch.Tensor]

    def has_shards(self) -> bool:
        return any(spec.sharded for spec in self.specs)


def flatten(state: Any, world: int, rank: int) -> Flat:
    tensors: list[torch.Tensor] = []
    specs: list[Spec] = []

    def add(value: torch.Tensor, path: str) -> Json:
        local, spec = _local(value, path, world, rank)
        tensors.append(local)
        specs.append(spec)
        return {"r": len(tensors) - 1}

    return Flat(_encode(state, add, "state"), specs, tensors)


def _local(value: torch.Tensor, path: str, world: int, rank: int) -> tuple[torch.Tensor, Spec]:
    dtype = str(value.dtype).removeprefix("torch.")
    if not isinstance(value, DTensor):
        return value.detach(), Spec(dtype, tuple(value.shape), False)
    mesh = value.device_mesh
    if mesh.ndim != 1 or mesh.mesh.flatten().tolist() != list(range(world)):
        raise SnapshotError(
            f"{path}: a DTensor on the device mesh {mesh.mesh.tolist()}; snapshots keep "
            f"DTensors on a 1-D mesh over all {world} ranks (FSDP2's fully_shard over the "
            "world), not HSDP's 2-D mesh"
        )
    (placement,) = value.placements
    local = value.to_local().detach()
    if placement.is_replicate():
        return local, Spec(dtype, tuple(value.shape), False)
    if not placement.is_shard(0):
        raise SnapshotError(
            f"{path}: a DTensor placed {placement}; snapshots keep Shard(0) (FSDP2) and "
            "Replicate() placements"
        )
    spec = Spec(dtype, tuple(value.shape), True)
    if tuple(local.shape) != spec.local_shape(world, rank):
        raise SnapshotError(
            f"{path}: rank {rank} holds a shard of shape {tuple(local.shape)} of "
            f"{tuple(value.shape)}, not torch.chunk's {spec.local_shape(world, rank)}: an "
            "uneven sharding snapshots cannot reshard"
        )
    return local, spec


def _encode(obj: Any, add: Callable[[torch.Tensor, str], Json], path: str) -> Json:
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    if isinstance(obj, torch.Tensor):
        return add(obj, path)
    if isinstance(obj, dict):
        if all(isinstance(key, str) for key in obj):
            return {"d": {key: _encode(v, add, f"{path}.{key}") for key, v in obj.items()}}
        return {
            "m": [
                [_encode(key, add, f"{path}[key]"), _encode(v, add, f"{path}[{key!r}]")]
                for key, v in obj.items()
            ]
        }
    if isinstance(obj, list):
        return {"l": [_encode(v, add, f"{path}[{i}]") for i, v in enumerate(obj)]}
    if isinstance(obj, tuple):
        return {"t": [_encode(v, add, f"{path}[{i}]") for i, v in enumerate(obj)]}
    raise SnapshotError(
        f"{path}: a {type(obj).__name__} cannot be kept in a snapshot (tensors, numbers, "
        "strings, booleans, None, lists, tuples and dicts can): leave it out of `extra`, or "
        "give its object a state_dict() of those"
    )


def unflatten(skeleton: Json, make: Callable[[int, tuple[Any, ...]], Any]) -> Any:
    """The state back from its skeleton; `make(index, path)` gives tensor `index`, found at
    `path` (the keys from the top: ("optim", 0, "state", 3, "exp_avg"))."""
    return _decode(skeleton, make, ())


def _decode(value: Json, make: Callable[[int, tuple[Any, ...]], Any], path: tuple[Any, ...]) -> Any:
    if not isinstance(value, dict):
        return value
    ((tag, body),) = value.items()
    if tag == "r":
        return make(int(body), path)
    if tag == "d":
        return {key: _decode(v, make, (*path, key)) for key, v in body.items()}
    if tag == "m":
        out = {}
        for key_json, v in body:
            key = _decode(key_json, make, path)
            out[key] = _decode(v, make, (*path, key))
        return out
    if tag == "l":
        return [_decode(v, make, (*path, i)) for i, v in enumerate(body)]
    if tag == "t":
        return tuple(_decode(v, make, (*path, i)) for i, v in enumerate(body))
    raise SnapshotError(f"unknown tag {tag!r} in a snapshot's skeleton")


def model_fingerprint(model_state: dict[str, Any]) -> str:
    """What a snapshot must match to load into a model: every entry's name, dtype and
    global shape (not the world size, nor how it is sharded)."""
    items = sorted(
        (key, str(value.dtype), list(value.shape))
        for key, value in model_state.items()
        if isinstance(value, torch.Tensor)
    )
    return hashlib.sha256(json.dumps(items).encode()).hexdigest()[:32]


def byte_view(tensor: torch.Tensor) -> memoryview:
    """The bytes of a tensor (copied to host memory when it is not there)."""
    flat = tensor.detach().reshape(-1)
    if flat.device.type != "cpu":
        flat = flat.cpu()
    return as_buffer(flat.contiguous().view(torch.uint8))


def as_buffer(data: torch.Tensor) -> memoryview:
    """A contiguous uint8 host tensor's memory, without a copy."""
    array: Any = data.numpy()
    return memoryview(array)
