"""Snapshot files (elastic_snapshot.store) and what a restore makes of them, in one process
(a gloo group of one): a torn, corrupted or foreign file is never loaded."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from elastic_snapshot import Snapshots, store
from elastic_snapshot.state import Spec
from testlib import free_port
from torch import nn


def header(step: int, *, job: str = "job", model: str = "m") -> store.Header:
    return store.Header(
        job=job,
        name="default",
        kind=store.OWN,
        step=step,
        last_step=step,
        world=1,
        owner=0,
        node="here",
        model=model,
        specs=(Spec("float32", (3,), False),),
        skeleton={"r": 0},
        data_position=step,
    )


def write(where: Path, step: int, value: float = 1.0, **kw: str) -> Path:
    data = torch.full((3,), value)
    path, _size = store.write(where, header(step, **kw), [memoryview(data.numpy())], None)
    return path


def test_a_written_snapshot_is_found_with_its_trailer_and_checks(tmp_path: Path) -> None:
    path = write(tmp_path, 4)
    found, notes = store.scan(tmp_path, "job", "default", "m")
    assert notes == [] and [o.path for o in found] == [path]
    assert found[0].header.step == 4 and found[0].header.data_position == 4
    assert found[0].verify("replicated")
    assert found[0].part("replicated")[:12].view(torch.float32).tolist() == [1.0, 1.0, 1.0]


def test_a_file_cut_short_is_skipped_with_the_reason(tmp_path: Path) -> None:
    path = write(tmp_path, 4)
    with open(path, "r+b") as f:
        f.truncate(path.stat().st_size - 1)
    found, notes = store.scan(tmp_path, "job", "default", "m")
    assert found == []
    assert notes == [
        f"skipped {path}: no snapshot trailer at its end (cut short, or not a snapshot)"
    ]


def test_a_flipped_byte_fails_the_check(tmp_path: Path) -> None:
    path = write(tmp_path, 4)
    with open(path, "r+b") as f:
        f.seek(2)
        byte = f.read(1)
        f.seek(2)
        f.write(bytes([byte[0] ^ 0x40]))
    (found,), _ = store.scan(tmp_path, "job", "default", "m")
    assert not found.verify("replicated")


def test_another_jobs_or_models_snapshot_is_skipped(tmp_path: Path) -> None:
    write(tmp_path, 4, job="other")
    write(tmp_path / "m2", 5, model="other-model")
    found, notes = store.scan(tmp_path, "job", "default", "m")
    assert found == [] and "job 'other' run 'default', not ours" in notes[0]
    found, notes = store.scan(tmp_path / "m2", "job", "default", "m")
    assert found == [] and "written for another model" in notes[0]


def test_a_writer_killed_mid_write_leaves_no_snapshot(tmp_path: Path) -> None:
    """SIGKILL while a snapshot is written (torchrun's kill after its shutdown timeout):
    only a temporary file is left, which no scan returns; the older snapshot stays."""
    write(tmp_path, 3)
    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent(
                f"""
                import pathlib, time
                from elastic_snapshot import store
                def slow():
                    for _ in range(1000):
                        yield memoryview(bytes(1 << 16))
                        print("wrote", flush=True)
                        time.sleep(0.01)
                big = store.Header(
                    job="job", name="default", kind="own", step=9, last_step=9, world=1,
                    owner=0, node="here", model="m", specs=(), skeleton={{"r": 0}},
                )
                store.write(pathlib.Path({str(tmp_path)!r}), big, slow(), None)
                """
            ),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdout is not None
    for _ in range(5):
        child.stdout.readline()
    os.kill(child.pid, signal.SIGKILL)
    child.wait(10)
    names = sorted(p.name for p in tmp_path.iterdir())
    assert len(names) == 2 and names[0].startswith(".tmp-") and names[1] == "own-w1-r0-s3.snap"
    found, notes = store.scan(tmp_path, "job", "default", "m")
    assert [o.header.step for o in found] == [3] and notes == []
    assert store.clear(tmp_path) == 2 and list(tmp_path.iterdir()) == []


def test_a_release_hides_the_files_at_once_and_frees_them_in_its_thread(tmp_path: Path) -> None:
    """After a restore the node's files go: renamed before `release` returns (no snapshot
    is seen, and a save of the same name right after is its own), freed in a thread."""
    write(tmp_path, 4)
    found, _notes = store.scan(tmp_path, "job", "default", "m")
    assert found[0].verify("replicated")  # mapped
    thread = store.release(tmp_path, found)
    assert found[0].path.name not in [p.name for p in tmp_path.iterdir()]  # renamed at once
    assert store.scan(tmp_path, "job", "default", "m") == ([], [])
    again = write(tmp_path, 4, value=2.0)  # the same name, written beside the released file
    thread.join(10)
    assert sorted(tmp_path.iterdir()) == [again] and found[0]._map is None
    (now,), _notes = store.scan(tmp_path, "job", "default", "m")
    assert now.part("replicated")[:12].view(torch.float32).tolist() == [2.0, 2.0, 2.0]


def test_a_write_that_needs_the_room_of_released_files_waits_for_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    released = tmp_path / f"{store.RELEASED_PREFIX}1-own-w1-r0-s3.snap"
    released.write_bytes(bytes(16))

    class Room:
        def __init__(self, full: bool) -> None:
            self.f_bavail, self.f_frsize = (10 if full else 1 << 20), 4096

    monkeypatch.setattr(store.os, "statvfs", lambda path: Room(released.exists()))
    threading.Timer(0.3, released.unlink).start()  # the release's thread, freeing it
    assert write(tmp_path, 4).exists()


# -- restore, in one process ---------------------------------------------------------------


@pytest.fixture(scope="module")
def group() -> Iterator[None]:
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{free_port()}",
        rank=0,
        world_size=1,
        timeout=timedelta(seconds=30),
    )
    yield
    dist.destroy_process_group()


def trained(directory: Path, steps: int) -> tuple[nn.Module, torch.optim.Optimizer, Snapshots]:
    torch.manual_seed(0)
    net = nn.Linear(4, 2)
    optim = torch.optim.Adam(net.parameters(), lr=0.1)
    snap = Snapshots(net, optim, directory=directory, job="unit")
    for step in range(1, steps + 1):
        net(torch.ones(1, 4)).sum().backward()
        optim.step()
        snap.step_done(step, {"sample": step * 8})
    return net, optim, snap


def fresh(directory: Path) -> tuple[nn.Module, Snapshots]:
    torch.manual_seed(1)
    net = nn.Linear(4, 2)
    optim = torch.optim.Adam(net.parameters(), lr=0.1)
    return net, Snapshots(net, optim, directory=directory, job="unit")


@pytest.mark.usefixtures("group")
def test_the_newest_saved_state_is_restored_exactly(tmp_path: Path) -> None:
    net, optim, snap = trained(tmp_path, 3)
    snap.save("test", timeout=1)
    net2, snap2 = fresh(tmp_path)
    restored = snap2.restore()
    assert (restored.step, restored.data_position, restored.source) == (
        3,
        {"sample": 24},
        "local-memory",
    )
    assert torch.equal(net2.weight, net.weight) and torch.equal(net2.bias, net.bias)
    state = snap2.optimizers[0].state[net2.weight]
    assert torch.equal(state["exp_avg_sq"], optim.state[net.weight]["exp_avg_sq"])
    assert int(state["step"]) == 3
    # Neither the model (set_model_state_dict copies into its tensors) nor the optimizer
    # (which keeps what it is given: its state is cloned) is left viewing the file.
    for tensor in (net2.weight, state["exp_avg"]):
        assert tensor.untyped_storage().nbytes() == tensor.nbytes
    # Loaded: the live state is newer from now. No snapshot at once; the files freed after.
    assert store.scan(snap2.directory, "unit", "default", snap2.model_fingerprint) == ([], [])
    assert snap2.released is not None
    snap2.released.join(10)
    assert list(snap2.directory.iterdir()) == []


@pytest.mark.usefixtures("group")
def test_a_newer_snapshot_cut_short_is_not_loaded_the_older_one_is(tmp_path: Path) -> None:
    net, _optim, snap = trained(tmp_path, 2)
    snap.save("test", timeout=1)
    weight_at_2 = net.weight.detach().clone()
    for step in (3, 4):
        net(torch.ones(1, 4)).sum().backward()
        snap.optimizers[0].step()
        snap.step_done(step)
    (newer,) = snap.save("test", timeout=1)
    with open(newer, "r+b") as f:
        f.truncate(newer.stat().st_size // 2)
    net2, snap2 = fresh(tmp_path)
    assert snap2.restore().step == 2
    assert torch.equal(net2.weight, weight_at_2)


@pytest.mark.usefixtures("group")
def test_a_corrupted_snapshot_is_not_loaded_the_checkpoint_is(tmp_path: Path) -> None:
    _net, _optim, snap = trained(tmp_path, 5)
    (path,) = snap.save("test", timeout=1)
    with open(path, "r+b") as f:
        f.seek(0)
        f.write(b"\xff\xff\xff\xff")
    net2, snap2 = fresh(tmp_path)
    before = net2.weight.detach().clone()
    loaded: list[int] = []
    restored = snap2.restore(4, lambda step: loaded.append(step) or 32)
    assert (restored.step, restored.source, restored.data_position, loaded) == (
        4,
        "checkpoint",
        32,
        [4],
    )
    assert torch.equal(net2.weight, before)  # nothing of the corrupted file reached the model


@pytest.mark.usefixtures("group")
def test_a_checkpoint_newer_than_memory_wins(tmp_path: Path) -> None:
    _net, _optim, snap = trained(tmp_path, 3)
    snap.save("test", timeout=1)
    _net2, snap2 = fresh(tmp_path)
    restored = snap2.restore(8, lambda step: None)
    assert (restored.step, restored.source, restored.lost) == (8, "checkpoint", 0)


@pytest.mark.usefixtures("group")
def test_a_state_the_snapshot_cannot_hold_is_refused_at_the_first_step(tmp_path: Path) -> None:
    class Odd:
        def state_dict(self) -> dict[str, object]:
            return {"when": time}  # a module: not data

        def load_state_dict(self, state: dict[str, object]) -> None:
            pass

    net = nn.Linear(2, 1)
    optim = torch.optim.SGD(net.parameters(), lr=0.1)
    snap = Snapshots(net, optim, directory=tmp_path, job="unit", extra={"odd": Odd()})
    with pytest.raises(Exception, match=r"state\.extra\.odd\.when: a module cannot be kept"):
        snap.step_done(1)
    with pytest.raises(TypeError, match="give a JSON value"):
        Snapshots(net, optim, directory=tmp_path, job="unit").step_done(1, object())


def test_a_snapshot_that_would_not_fit_is_not_begun(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A memory volume filled to its limit gets its pod evicted (and a full /dev/shm fails
    NCCL): a save that would not fit says so and writes nothing."""

    class Full:
        f_bavail, f_frsize = 10, 4096

    monkeypatch.setattr(store.os, "statvfs", lambda path: Full())
    with pytest.raises(OSError, match=r"has 0 MB free, the snapshot needs 1 MB .*shmSizeLimit"):
        write(tmp_path, 4)
    assert list(tmp_path.iterdir()) == []
