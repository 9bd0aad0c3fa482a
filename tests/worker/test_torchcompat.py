"""torchcompat.py, the fence around torch's rendezvous internals, against every torch release
the NGC PyTorch images of the last two years are built from (24.01: 2.2.0a0 ... 25.12:
2.10.0a0) and after: each release's dynamic_rendezvous.py is kept in torch_sources/ as it
shipped (torch's BSD license beside it; torch_sources/README.md says where each came
from). Installing every torch is too heavy here, so each file is loaded as a module of
the installed torch's rendezvous package (its other modules, api.py and utils.py, are
2.13's) and the fence runs torch's own state machine from it on a rendezvous held in
memory: the same operations a lifeline and a SIGTERM run."""

from __future__ import annotations

import ast
import importlib.util
import logging
import pickle
import re
import sys
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch
from elastic_worker import torchcompat
from elastic_worker.recovery import round as rounds
from torch.distributed import HashStore
from torch.distributed.elastic.rendezvous import RendezvousParameters

from worker.worker_helpers import ROOT

SOURCES = Path(__file__).with_name("torch_sources")
RELEASES = sorted(
    (p.name for p in SOURCES.iterdir() if p.is_dir()),
    key=lambda v: tuple(int(x) for x in v.split(".")),
)
SRC = ROOT / "images" / "worker" / "src" / "elastic_worker"


def test_the_sources_cover_the_range_the_fence_names_and_the_pinned_torch() -> None:
    """READ_FROM is the first and last release kept here; the pinned torch is among them
    and its file is the installed one, byte for byte (bumping torch fails here: add its
    file, run this module, then move the pin)."""
    assert (RELEASES[0], RELEASES[-1]) == torchcompat.READ_FROM
    pinned = re.search(r"^torch==(\S+)$", (ROOT / "requirements" / "dev.txt").read_text(), re.M)
    assert pinned is not None and pinned[1] in RELEASES
    installed = torchcompat.source_path()
    assert installed is not None
    assert installed.read_bytes() == (SOURCES / pinned[1] / "dynamic_rendezvous.py").read_bytes()
    assert (SOURCES / "LICENSE").read_text().startswith("From PyTorch:")


@pytest.mark.parametrize("release", RELEASES)
def test_every_release_has_the_shapes_the_fence_needs(release: str) -> None:
    source = (SOURCES / release / "dynamic_rendezvous.py").read_text()
    assert torchcompat.problems(source) == []


def test_a_torch_without_them_is_named_in_one_line(tmp_path: Path) -> None:
    source = (SOURCES / RELEASES[-1] / "dynamic_rendezvous.py").read_text()
    older = source.replace("class _DistributedRendezvousOpExecutor", "class _SomethingElse")
    older = older.replace("    REMOVE_FROM_WAIT_LIST = ", "    TAKE_FROM_WAIT_LIST = ")
    assert torchcompat.problems(older) == [
        "_Action.REMOVE_FROM_WAIT_LIST",
        "_DistributedRendezvousOpExecutor",
    ]
    assert torchcompat.check() is None  # the installed torch has them all
    assert torchcompat.check_soon()() is None  # the same, from a thread started earlier


def test_only_the_fence_touches_torchs_private_rendezvous_names() -> None:
    """No other module of the worker names a private member of dynamic_rendezvous."""
    private = {"_NodeDesc", "_DistributedRendezvousOpExecutor", "_Action", "_RendezvousState"}
    private |= {"_state_holder", "_settings", "_RendezvousExitOp"}
    users = set()
    for path in SRC.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            name = node.attr if isinstance(node, ast.Attribute) else getattr(node, "id", None)
            if name in private:
                users.add(path.relative_to(SRC).as_posix())
    assert users == {"torchcompat.py"}


# -- torch's state machine of each release, run by the fence on a rendezvous in memory --


class MemoryBackend:
    """A RendezvousBackend holding the state in memory, with torch's fencing tokens."""

    name = "memory"

    def __init__(self) -> None:
        self.state: bytes | None = None
        self.token = 0

    def get_state(self) -> tuple[bytes, int] | None:
        return None if self.state is None else (self.state, self.token)

    def set_state(self, state: bytes, token: Any = None) -> tuple[bytes, int, bool] | None:
        if self.state is not None and token != self.token:
            return self.state, self.token, False
        self.state, self.token = state, self.token + 1
        return self.state, self.token, True


def _load(release: str) -> ModuleType:
    """The release's dynamic_rendezvous.py as a module of the installed rendezvous package."""
    name = f"torch.distributed.elastic.rendezvous._release_{release.replace('.', '_')}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, SOURCES / release / "dynamic_rendezvous.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # pickle finds _RendezvousState's class by its module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(params=RELEASES)
def release(request: pytest.FixtureRequest) -> Iterator[tuple[str, ModuleType]]:
    yield request.param, _load(request.param)


def _handler(dr: ModuleType, backend: MemoryBackend) -> Any:
    params = RendezvousParameters("memory", "", "fence", 1, 3, keep_alive_interval=5)
    return dr.create_handler(HashStore(), backend, params)


def _write(dr: ModuleType, backend: MemoryBackend, **fields: Any) -> None:
    """A round as torch's agents leave it in the backend: `fields` of _RendezvousState."""
    state = dr._RendezvousState()
    for key, value in fields.items():
        setattr(state, key, value)
    backend.set_state(pickle.dumps(state), backend.token)


def _now(dr: ModuleType) -> datetime:
    """A heartbeat's time as the release writes it (timezone-aware from 2.6 on)."""
    aware = "datetime.now(timezone.utc)" in Path(str(dr.__file__)).read_text()
    return datetime.now(timezone.utc) if aware else datetime.now()


def _round_of_two(
    dr: ModuleType, backend: MemoryBackend, round_: int, beat_a: datetime | None = None
) -> tuple[Any, Any]:
    """A complete round of torchruns 11 (10.0.0.1, beat at `beat_a`, else now) and 22."""
    now = _now(dr)
    a, b = dr._NodeDesc("10.0.0.1", 11, 0), dr._NodeDesc("10.0.0.2", 22, 0)
    last = {a: beat_a or now, b: now}
    _write(
        dr, backend, round=round_, complete=True, participants={a: 0, b: 1}, last_heartbeats=last
    )
    return a, b


def _read(dr: ModuleType, backend: MemoryBackend) -> Any:
    assert backend.state is not None
    return pickle.loads(backend.state)


def test_a_participant_is_read_and_taken_out_and_the_round_moves_on(
    release: tuple[str, ModuleType],
) -> None:
    """A complete round of two; the node of torchrun 11 leaves it: torch's own exit
    operation, so with the last participant gone a complete round moves on."""
    _, dr = release
    backend = MemoryBackend()
    a, b = _round_of_two(dr, backend, 3)
    handler = _handler(dr, backend)
    assert sorted(torchcompat.participants(handler)) == [("10.0.0.1", 11), ("10.0.0.2", 22)]
    done = torchcompat.take_out(handler, "10.0.0.1", 11, timeout=5, module=dr)
    assert (done.removed_from, done.round) == ("participants", 3)
    state = _read(dr, backend)
    assert a not in state.participants and b in state.participants
    again = torchcompat.take_out(_handler(dr, backend), "10.0.0.1", 11, timeout=5, module=dr)
    assert again.removed_from == ""  # not there any more
    torchcompat.take_out(_handler(dr, backend), "10.0.0.2", 22, timeout=5, module=dr)
    state = _read(dr, backend)
    assert state.participants == {} and state.round == 4 and not state.complete


def test_the_round_is_read_with_its_ranks_completeness_and_keep_alive(
    release: tuple[str, ModuleType],
) -> None:
    """What recovery/stuckround.py decides on: the round, complete or not, each node's
    group rank (given at completion) and torch's keep-alive window."""
    _, dr = release
    backend = MemoryBackend()
    now = _now(dr)
    a, _ = _round_of_two(dr, backend, 5)
    view = torchcompat.read_round(_handler(dr, backend))
    assert (view.round, view.complete) == (5, True)
    assert dict(view.ranks) == {("10.0.0.1", 11): 0, ("10.0.0.2", 22): 1}
    assert view.keep_alive == 5 * 3  # keep_alive_interval=5 x torch's default 3 attempts
    _write(dr, backend, round=6, participants={a: 0}, last_heartbeats={a: now})
    view = torchcompat.read_round(_handler(dr, backend))
    assert (view.round, view.complete, dict(view.ranks)) == (6, False, {("10.0.0.1", 11): 0})


def test_a_waiting_node_leaves_the_wait_list(release: tuple[str, ModuleType]) -> None:
    _, dr = release
    backend = MemoryBackend()
    now = _now(dr)
    a, w = dr._NodeDesc("10.0.0.1", 11, 0), dr._NodeDesc("10.0.0.3", 33, 0)
    _write(
        dr,
        backend,
        complete=True,
        participants={a: 0},
        wait_list={w},
        last_heartbeats={a: now, w: now},
    )
    done = torchcompat.take_out(_handler(dr, backend), "10.0.0.3", 33, timeout=5, module=dr)
    assert done.removed_from == "wait list"
    assert _read(dr, backend).wait_list == set()


def test_a_leaving_node_whose_keep_alive_lapsed_writes_itself_out(
    release: tuple[str, ModuleType], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A torchrun starved at its SIGTERM on a loaded host beats no more: torch's read drops
    its node in memory only (`_sanitize`). The leave writes that, so that it is said and no
    later read (the leave's second look after torchrun exits) finds it again."""
    _, dr = release
    monkeypatch.setattr(dr, "_delay", lambda seconds: None)  # torch's 1 s pause before a sync
    backend = MemoryBackend()
    now = _now(dr)
    stale = now - timedelta(seconds=60)  # past keep_alive_interval=5 x 3 attempts
    a, b = _round_of_two(dr, backend, 3, beat_a=stale)
    done = torchcompat.take_out(_handler(dr, backend), "10.0.0.1", 11, timeout=5, module=dr)
    assert (done.lapsed, done.removed_from, done.round) == (True, "its keep-alive", 3)
    state = _read(dr, backend)
    assert a not in state.participants and a not in state.last_heartbeats
    assert b in state.participants
    again = torchcompat.take_out(_handler(dr, backend), "10.0.0.1", 11, timeout=5, module=dr)
    assert (again.lapsed, again.removed_from) == (False, "")


class LostReply(MemoryBackend):
    """An etcd that applies the first write but whose reply is lost: the client retries it
    and is told its token is stale (a loaded etcd, a client that retries on a timeout)."""

    def __init__(self) -> None:
        super().__init__()
        self.lose_next = False

    def set_state(self, state: bytes, token: Any = None) -> tuple[bytes, int, bool] | None:
        answer = super().set_state(state, token)
        if self.lose_next and answer is not None and answer[2]:
            self.lose_next = False
            return answer[0], answer[1], False
        return answer


def test_a_leave_whose_write_was_applied_but_not_acknowledged_says_it_left(
    release: tuple[str, ModuleType],
) -> None:
    """The node was in the round at the first look and is gone at the next: it has left,
    whoever wrote it (before, the leave found it in no list and said nothing)."""
    _, dr = release
    backend = LostReply()
    now = _now(dr)
    a, b = _round_of_two(dr, backend, 3)
    handler = _handler(dr, backend)
    backend.lose_next = True
    done = torchcompat.take_out(handler, "10.0.0.1", 11, timeout=5, module=dr)
    assert not backend.lose_next, "the write was applied, its reply lost"
    assert (done.removed_from, done.round) == ("participants", 3)
    assert a not in _read(dr, backend).participants
    # another pod's node seen dead: a removal it cannot tell as its own is not reported
    c = dr._NodeDesc("10.0.0.3", 33, 0)
    _write(dr, backend, round=4, participants={b: 0, c: 1}, last_heartbeats={b: now, c: now})
    backend.lose_next = True
    since = (now + timedelta(seconds=1)).timestamp()
    gone = torchcompat.take_out(
        _handler(dr, backend), "10.0.0.3", 33, timeout=5, dead_since=since, module=dr
    )
    assert gone.removed_from == "" and c not in _read(dr, backend).participants


def test_a_node_that_beat_after_it_was_seen_dead_stays(release: tuple[str, ModuleType]) -> None:
    _, dr = release
    backend = MemoryBackend()
    beat = _now(dr)
    a = dr._NodeDesc("10.0.0.1", 11, 0)
    _write(dr, backend, complete=True, participants={a: 0}, last_heartbeats={a: beat})
    seen_dead = (beat - timedelta(seconds=2)).timestamp()
    done = torchcompat.take_out(
        _handler(dr, backend), "10.0.0.1", 11, timeout=5, dead_since=seen_dead, module=dr
    )
    assert done.beat_after_death and done.removed_from == ""
    assert a in _read(dr, backend).participants


def test_a_redundant_node_leaves_where_torch_keeps_a_redundancy_list(
    release: tuple[str, ModuleType],
) -> None:
    """From 2.3 a node that came when the round was full waits in the redundancy list;
    2.1 and 2.2 have none and the fence skips it."""
    version, dr = release
    if not hasattr(dr._RendezvousState(), "redundancy_list"):
        assert version in {"2.1.0", "2.2.0"}
        return
    backend = MemoryBackend()
    now = _now(dr)
    a, r = dr._NodeDesc("10.0.0.1", 11, 0), dr._NodeDesc("10.0.0.4", 44, 0)
    _write(
        dr,
        backend,
        complete=True,
        participants={a: 0},
        redundancy_list={r},
        last_heartbeats={a: now, r: now},
    )
    done = torchcompat.take_out(_handler(dr, backend), "10.0.0.4", 44, timeout=5, module=dr)
    assert done.removed_from == "redundancy list"
    assert _read(dr, backend).redundancy_list == set()


def test_a_release_without_an_internal_costs_only_the_speed_up(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """torchcompat raises Unsupported; leave says so in one line and returns False."""
    dr = _load(RELEASES[-1])
    backend = MemoryBackend()
    a = dr._NodeDesc("10.0.0.1", 11, 0)
    _write(dr, backend, complete=True, participants={a: 0}, last_heartbeats={a: _now(dr)})

    class Older:
        _NodeDesc = dr._NodeDesc
        _Action = dr._Action

    monkeypatch.setattr(torchcompat, "dynamic_rendezvous", lambda: Older)
    # The module's own logger, heard directly: an earlier test in this process may have
    # turned propagation off (main.setup_logging) or dropped the package's loggers from
    # logging's registry (a warm child's _forget_the_server), leaving it another parent.
    monkeypatch.setattr(rounds.logger, "level", logging.INFO)
    monkeypatch.setattr(rounds.logger, "disabled", False)  # a dictConfig may have set it
    rounds.logger.addHandler(caplog.handler)
    try:
        assert rounds.take_out(lambda: _handler(dr, backend), "fence", "10.0.0.1", 11) is False
    finally:
        rounds.logger.removeHandler(caplog.handler)
    assert "cannot take a node out of rendezvous fence with this torch" in caplog.text
    assert a in _read(dr, backend).participants


def test_the_check_reads_the_installed_torch_without_importing_it() -> None:
    """check() runs in elastic-worker, which must not import torch for it (0.2 GB)."""
    code = (
        "import sys; from elastic_worker import torchcompat; "
        "print(torchcompat.check(), 'torch' in sys.modules)"
    )
    import subprocess  # noqa: PLC0415

    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["None", "False"]
    assert torch.__version__.startswith(torchcompat.torch_version().split("+")[0])


def test_a_pod_on_a_torch_without_them_says_so_once_and_takes_torchs_own_path(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The start-time check: one line, then no lifelines and no leave at a signal."""
    from elastic_worker import pod  # noqa: PLC0415

    assert pod._torch_internals() is True
    monkeypatch.setattr(torchcompat, "check", lambda: "torch 9.9 lacks _Action")
    # Its own handler: an earlier test's main.setup_logging() turns propagation off.
    records: list[logging.LogRecord] = []
    listener = logging.Handler(logging.WARNING)
    listener.emit = records.append  # type: ignore[method-assign]
    logging.getLogger("elastic_worker.pod").addHandler(listener)
    try:
        assert pod._torch_internals() is False
    finally:
        logging.getLogger("elastic_worker.pod").removeHandler(listener)
    said = [r.getMessage() for r in records]
    assert said == [
        "no lifelines and no leave at a signal: torch 9.9 lacks _Action; a lost or stopped "
        "node leaves the round when its keep-alive lapses"
    ]
