"""Snapshot files in node-local memory (/dev/shm: the pod's memory-backed volume).

A file is written under a temporary name in its directory and renamed, so a reader sees a
whole file or none, and it ends with a trailer that says what it holds:

    payload    the replicated part, then the shard part; each tensor at a multiple of 64 bytes
    trailer    JSON: job, name, kind (own: this rank's state; replica: the ring predecessor's
               shard), step, last_step, world, owner (the rank of that world whose shard it
               is), node, the model's fingerprint, the skeleton and data position (own),
               one spec per tensor, each part's offset, size and CRC-32 of each 64 MiB,
               and whether its writer copied the state at each step_done (stepcopy.py)
    8 bytes    the trailer's length, little-endian
    16 bytes   MAGIC

`scan` reads only trailers: a file whose magic, trailer, size, job, name or model does not
match is skipped with one line saying why; a part's CRC-32 is checked (`verify`) by the rank
that serves it, before anyone loads it. A torn write never has the name of a snapshot; a
file cut short has no trailer at its end; a flipped byte fails the CRC.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import json
import mmap
import os
import re
import struct
import threading
import time
import zlib
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import torch

from .state import ALIGN, Json, Spec, layout

MAGIC = b"elastic-snapshot"  # 16 bytes, the file's last
FORMAT = 1
_LENGTH = struct.Struct("<Q")
_TAIL = _LENGTH.size + len(MAGIC)
SUFFIX = ".snap"
TEMP_PREFIX = ".tmp-"
RELEASED_PREFIX = f"{TEMP_PREFIX}released-"  # renamed by `release`, removed in its thread
RELEASE_WAIT = 5.0  # s a write that needs their room waits for released files to go
OWN, REPLICA = "own", "replica"
_PAD = bytes(ALIGN)


CRC_CHUNK = 64 << 20  # bytes per CRC-32


@dataclass(frozen=True)
class Part:
    offset: int
    size: int
    crcs: tuple[int, ...]  # the CRC-32 of each CRC_CHUNK bytes of the part

    def digest(self) -> int:
        """One number for the part's content (its CRC-32s'), for ranks to compare."""
        return zlib.crc32(repr(self.crcs).encode())


@dataclass(frozen=True)
class Header:
    job: str
    name: str
    kind: str  # OWN or REPLICA
    step: int  # the step whose state the file holds
    last_step: int  # the newest step its writer had completed when it wrote it
    world: int  # the world size of the layout the shard belongs to
    owner: int  # the rank (in that world) whose shard it is
    node: str
    model: str  # state.model_fingerprint of the model it fits
    specs: tuple[Spec, ...]
    skeleton: Json = None  # own files only
    data_position: Json = None
    replicated: Part | None = None
    shard: Part | None = None
    written: float = 0.0
    pid: int = 0
    #: Its writer copied the state at each step_done (the script's step spans several
    #: optimizer steps): a process restored from it does so from its first step.
    copying: bool = False

    def file_name(self) -> str:
        return f"{self.kind}-w{self.world}-r{self.owner}-s{self.step}{SUFFIX}"

    def to_json(self) -> Json:
        return {
            "format": FORMAT,
            "job": self.job,
            "name": self.name,
            "kind": self.kind,
            "step": self.step,
            "last_step": self.last_step,
            "world": self.world,
            "owner": self.owner,
            "node": self.node,
            "model": self.model,
            "specs": [spec.to_json() for spec in self.specs],
            "skeleton": self.skeleton,
            "data_position": self.data_position,
            "replicated": _part_json(self.replicated),
            "shard": _part_json(self.shard),
            "written": self.written,
            "pid": self.pid,
            "copying": self.copying,
        }

    @staticmethod
    def from_json(value: Json) -> Header:
        if not isinstance(value, dict) or value.get("format") != FORMAT:
            raise ValueError("not a snapshot of format 1")
        return Header(
            job=str(value["job"]),
            name=str(value["name"]),
            kind=str(value["kind"]),
            step=int(value["step"]),
            last_step=int(value["last_step"]),
            world=int(value["world"]),
            owner=int(value["owner"]),
            node=str(value["node"]),
            model=str(value["model"]),
            specs=tuple(Spec.from_json(spec) for spec in value["specs"]),
            skeleton=value["skeleton"],
            data_position=value["data_position"],
            replicated=_part(value["replicated"]),
            shard=_part(value["shard"]),
            written=float(value["written"]),
            pid=int(value["pid"]),
            copying=bool(value.get("copying", False)),  # absent from files of before it
        )


def _part_json(part: Part | None) -> Json:
    return None if part is None else [part.offset, part.size, list(part.crcs)]


def _part(value: Json) -> Part | None:
    if value is None:
        return None
    return Part(int(value[0]), int(value[1]), tuple(int(c) for c in value[2]))


def crcs(data: mmap.mmap, offset: int, size: int) -> tuple[int, ...]:
    """The CRC-32 of each CRC_CHUNK bytes of data[offset:offset + size], in threads."""
    starts = range(offset, offset + size, CRC_CHUNK)
    if not starts:
        return ()

    def crc(at: int) -> int:
        with memoryview(data) as view, view[at : min(at + CRC_CHUNK, offset + size)] as chunk:
            return zlib.crc32(chunk)

    with ThreadPoolExecutor(max(1, min(8, os.cpu_count() or 1, len(starts)))) as pool:
        return tuple(pool.map(crc, starts))


def directory(root: Path, job: str, name: str) -> Path:
    """The directory of one job's and one run name's snapshots under `root`."""
    return root / _safe(job) / _safe(name)


def _safe(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "_", text)[:200] or "_"


def write(
    where: Path,
    header: Header,
    replicated: Iterable[memoryview] | None,
    shard: Iterable[memoryview] | None,
) -> tuple[Path, int]:
    """Write a snapshot file atomically (temporary name, then rename); the parts' offsets,
    sizes and CRCs in `header` are filled in here. Returns its path and size. A file that
    would not fit in what the file system has free is not begun (OSError ENOSPC): a memory
    volume filled to its limit gets its pod evicted, and a full /dev/shm fails NCCL."""
    where.mkdir(parents=True, exist_ok=True)
    need = sum(
        layout(header.specs, sharded, header.world, header.owner)[1]
        for sharded, pieces in ((False, replicated), (True, shard))
        if pieces is not None
    ) + (1 << 20)  # the trailer and some room
    free = _room(where)
    deadline = time.monotonic() + RELEASE_WAIT
    while free < need and _releasing(where) and time.monotonic() < deadline:
        time.sleep(0.01)  # a restore's files, being freed by its thread: room within a second
        free = _room(where)
    if free < need:
        raise OSError(
            errno.ENOSPC,
            f"{where} has {free / 1e6:.0f} MB free, the snapshot needs {need / 1e6:.0f} MB "
            "(the chart's worker.shmSizeLimit sizes /dev/shm)",
        )
    final = where / header.file_name()
    temp = where / f"{TEMP_PREFIX}{os.getpid()}-{threading.get_ident()}-{final.name}"
    spans: dict[str, tuple[int, int]] = {}
    try:
        with open(temp, "xb+") as out:
            for key, pieces in (("replicated", replicated), ("shard", shard)):
                if pieces is None:
                    continue
                start = out.tell()
                for piece in pieces:
                    out.write(piece)
                    out.write(_PAD[: -piece.nbytes % ALIGN])
                spans[key] = (start, out.tell() - start)
            out.flush()
            parts: dict[str, Part | None] = {"replicated": None, "shard": None}
            for key, (start, length) in spans.items():
                parts[key] = Part(start, length, ())
            if out.tell():  # an empty file cannot be mapped (and has nothing to check)
                with mmap.mmap(out.fileno(), 0, access=mmap.ACCESS_READ) as written:
                    for key, (start, length) in spans.items():
                        parts[key] = Part(start, length, crcs(written, start, length))
            done = dataclasses.replace(
                header,
                replicated=parts["replicated"],
                shard=parts["shard"],
                written=time.time(),
                pid=os.getpid(),
            )
            trailer = json.dumps(done.to_json(), separators=(",", ":")).encode()
            out.seek(0, os.SEEK_END)
            out.write(trailer)
            out.write(_LENGTH.pack(len(trailer)))
            out.write(MAGIC)
            size = out.tell()
        os.replace(temp, final)
    except BaseException:
        with contextlib.suppress(OSError):
            temp.unlink()
        raise
    return final, size


def _room(where: Path) -> int:
    stat = os.statvfs(where)
    return stat.f_bavail * stat.f_frsize


def _releasing(where: Path) -> bool:
    with contextlib.suppress(FileNotFoundError):
        return any(p.name.startswith(RELEASED_PREFIX) for p in where.iterdir())
    return False


@dataclass
class Opened:
    """A snapshot file whose trailer was read and checked; its payload is mapped on demand
    (private copy-on-write: nothing is read before it is used, nothing written back)."""

    path: Path
    header: Header
    _map: mmap.mmap | None = field(default=None, repr=False)

    def part(self, which: str) -> torch.Tensor:
        """The bytes of the `replicated` or `shard` part, as a uint8 tensor over the map."""
        part = getattr(self.header, which)
        if part is None:
            raise ValueError(f"{self.path.name} has no {which} part")
        if part.size == 0:
            return torch.empty(0, dtype=torch.uint8)
        if self._map is None:
            with open(self.path, "rb") as f:
                self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
        return torch.frombuffer(self._map, dtype=torch.uint8, count=part.size, offset=part.offset)

    def verify(self, which: str) -> bool:
        """True when the part's bytes have the CRC-32s its trailer gives."""
        part = getattr(self.header, which)
        if part is None:
            return False
        if part.size == 0:
            return bool(part.crcs == ())
        self.part(which)  # maps the file
        assert self._map is not None
        return bool(crcs(self._map, part.offset, part.size) == part.crcs)

    def close(self) -> None:
        """Drop the file's map: unmapped here unless a tensor still views it, then when the
        last one goes (mmap.close would pull the memory from under such a tensor)."""
        self._map = None


def read_header(path: Path) -> Header:
    """The trailer of a snapshot file; ValueError (saying what is wrong) when it has none
    or it does not describe this file."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        if size < _TAIL:
            raise ValueError(f"{size} bytes: cut short")
        f.seek(size - _TAIL)
        tail = f.read(_TAIL)
        if tail[_LENGTH.size :] != MAGIC:
            raise ValueError("no snapshot trailer at its end (cut short, or not a snapshot)")
        (length,) = _LENGTH.unpack(tail[: _LENGTH.size])
        if length > size - _TAIL:
            raise ValueError("its trailer's length is larger than the file")
        f.seek(size - _TAIL - length)
        try:
            header = Header.from_json(json.loads(f.read(length)))
        except (ValueError, KeyError, TypeError, IndexError) as exc:
            raise ValueError(f"its trailer does not parse ({exc})") from None
    payload_end = size - _TAIL - length
    for which, sharded in (("replicated", False), ("shard", True)):
        part = getattr(header, which)
        if part is None:
            continue
        _slots, expected = layout(header.specs, sharded, header.world, header.owner)
        if part.size != expected or part.offset < 0 or part.offset + part.size > payload_end:
            raise ValueError(f"its {which} part does not fit its specs (cut or rewritten)")
    if header.kind == OWN and (header.replicated is None or header.skeleton is None):
        raise ValueError("an own snapshot without its replicated part")
    if header.kind == REPLICA and header.shard is None:
        raise ValueError("a replica without a shard")
    if header.kind not in (OWN, REPLICA):
        raise ValueError(f"unknown kind {header.kind!r}")
    return header


def scan(where: Path, job: str, name: str, model: str) -> tuple[list[Opened], list[str]]:
    """The snapshots of this job, run name and model in `where`, and one line for each file
    that was skipped and why."""
    found: list[Opened] = []
    notes: list[str] = []
    try:
        entries = sorted(where.iterdir())
    except FileNotFoundError:
        return found, notes
    for path in entries:
        if not path.name.endswith(SUFFIX) or path.name.startswith(TEMP_PREFIX):
            continue
        try:
            header = read_header(path)
        except (OSError, ValueError) as exc:
            notes.append(f"skipped {path}: {exc}")
            continue
        if (header.job, header.name) != (job, name):
            notes.append(f"skipped {path}: job {header.job!r} run {header.name!r}, not ours")
        elif header.model != model:
            notes.append(f"skipped {path}: written for another model (names, dtypes or shapes)")
        else:
            found.append(Opened(path, header))
    return found, notes


def clear(where: Path) -> int:
    """Remove every snapshot and temporary file in `where`; how many were removed."""
    removed = 0
    for path in _files(where):
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
            removed += 1
    return removed


def release(where: Path | None, opened: Iterable[Opened]) -> threading.Thread:
    """`clear(where)` (None: no files) and unmap `opened`, in a thread: the kernel takes a
    fraction of a second to free a node's snapshots (gigabytes of memory), which the next
    step need not wait for. The files are renamed here first, so that once this returns
    nothing in `where` is taken for a snapshot and a save writes beside them (a `write`
    that needs their room waits for them to go)."""
    doomed = []
    for path in _files(where) if where is not None else ():
        if path.name.startswith(RELEASED_PREFIX):
            doomed.append(path)  # another release's, not yet removed
            continue
        gone = path.with_name(f"{RELEASED_PREFIX}{os.getpid()}-{path.name}")
        with contextlib.suppress(FileNotFoundError):
            path.rename(gone)
            doomed.append(gone)
    maps = list(opened)

    def free() -> None:
        for file in maps:
            file.close()
        for path in doomed:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()

    thread = threading.Thread(target=free, name="elastic-snapshot-release", daemon=True)
    thread.start()
    return thread


def _files(where: Path) -> list[Path]:
    """The snapshot and temporary files in `where`."""
    try:
        entries = list(where.iterdir())
    except FileNotFoundError:
        return []
    return [p for p in entries if p.name.endswith(SUFFIX) or p.name.startswith(TEMP_PREFIX)]
