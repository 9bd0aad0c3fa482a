"""torch's private rendezvous internals, behind one fence: no other module of the worker
touches them (tests/worker/test_torchcompat.py checks it). At its end, the one reach into
torch's launcher: the exit barrier's timeout (launch/torchrun.py sets it); a warm child's
default process group kept for its interpreter's exit (warm/child.py); and a warm child's
env:// rendezvous, which waits for rank 0's store (warm/master.py).

Read from torch/distributed/elastic/rendezvous/dynamic_rendezvous.py of torch 2.1.0 to
2.14.1, the releases the NGC PyTorch images of 24.01 to 25.12 are built from and after
(their builds are commits between two of these tags); each release's file is kept in
tests/worker/torch_sources/ and the tests run the code below against every one of them.

What is used, and since when (unchanged through 2.14.1 unless said):
- `_NodeDesc(addr, pid, local_id)`: torchrun's node; its first handler has local_id 0.
- `_DistributedRendezvousOpExecutor(node, state_holder, settings).run(handler, deadline)`,
  which calls `handler(ctx, deadline)` with `ctx.node` and `ctx.state` until FINISH.
- `_Action.REMOVE_FROM_PARTICIPANTS`, `REMOVE_FROM_WAIT_LIST`, `ERROR_TIMEOUT`, `FINISH`;
  `REMOVE_FROM_REDUNDANCY_LIST` from 2.3 (2.1 and 2.2 have no redundancy list).
- `_RendezvousState.round`, `complete`, `participants` (node -> rank, the ranks given
  when the round completes), `wait_list`, `last_heartbeats`; `redundancy_list` from 2.3.
- the handler's `_state_holder` (`.state`, `.sync()`, `.mark_dirty()`) and `_settings`
  (`RendezvousSettings.keep_alive_interval`, `keep_alive_max_attempt`).

torch comes from the user's image, so the shapes are checked at start, from the source
file without importing torch (`problems()`): when one is missing, one line says so and
the worker takes torch's own path (the lifelines off; a lost or stopped node leaves the
round when its keep-alive lapses). A call that still fails raises Unsupported.
"""

from __future__ import annotations

import ast
import functools
import importlib.util
import socket
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # torch is imported only when a node is read or taken out
    from torch.distributed.elastic.rendezvous import RendezvousHandler

#: The releases whose dynamic_rendezvous.py this module was read against.
READ_FROM = ("2.1.0", "2.14.1")
MODULE = "torch.distributed.elastic.rendezvous.dynamic_rendezvous"

#: torch's node of a torchrun, as the worker names it: (address, pid); local_id is 0.
RdzvNode = tuple[str, int]

# The shapes, as the source declares them: class -> names it must hold (fields, enum
# members, parameters or attributes set in __init__).
REQUIRED: dict[str, tuple[str, ...]] = {
    "_NodeDesc": ("addr", "pid", "local_id"),
    "_RendezvousState": ("round", "complete", "participants", "wait_list", "last_heartbeats"),
    "_Action": ("REMOVE_FROM_PARTICIPANTS", "REMOVE_FROM_WAIT_LIST", "ERROR_TIMEOUT", "FINISH"),
    "_DistributedRendezvousOpExecutor": ("node", "state_holder", "settings", "run"),
    "DynamicRendezvousHandler": ("_state_holder", "_settings"),
    "RendezvousSettings": ("keep_alive_interval", "keep_alive_max_attempt"),
}
#: Used when there (2.3 and later), skipped when not.
OPTIONAL: dict[str, tuple[str, ...]] = {
    "_RendezvousState": ("redundancy_list",),
    "_Action": ("REMOVE_FROM_REDUNDANCY_LIST",),
}


class Unsupported(Exception):
    """This torch lacks a name or signature the fence needs."""


def _declared(cls: ast.ClassDef) -> set[str]:
    """The names a class declares: fields and members, methods, the parameters of its
    __init__ and the attributes __init__ sets on self."""
    names: set[str] = set()
    for item in cls.body:
        if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
            names.add(item.target.id)
        elif isinstance(item, ast.Assign):
            names |= {t.id for t in item.targets if isinstance(t, ast.Name)}
        elif isinstance(item, ast.FunctionDef):
            names.add(item.name)
            if item.name == "__init__":
                names |= {a.arg for a in item.args.args[1:] + item.args.kwonlyargs}
                for node in ast.walk(item):
                    if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                        names.add(node.attr)
    return names


def problems(source: str | None = None) -> list[str]:
    """What the fence needs and `source` (dynamic_rendezvous.py's text; by default the
    installed torch's, read without importing torch) lacks; empty when all is there."""
    if source is None:
        path = source_path()
        if path is None:
            return [f"{MODULE} is not installed"]
        source = path.read_text()
    classes = {
        node.name: _declared(node)
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.ClassDef)
    }
    missing = []
    for cls, names in REQUIRED.items():
        if cls not in classes:
            missing.append(cls)
            continue
        missing += [f"{cls}.{name}" for name in names if name not in classes[cls]]
    return missing


def source_path() -> Path | None:
    """dynamic_rendezvous.py of the installed torch (found without importing torch)."""
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        return None
    for root in spec.submodule_search_locations:
        path = Path(root, *MODULE.split(".")[1:]).with_suffix(".py")
        if path.is_file():
            return path
    return None


def torch_version() -> str:
    from importlib import metadata  # noqa: PLC0415 - only to name a torch that lacks a shape

    try:
        return metadata.version("torch")
    except metadata.PackageNotFoundError:
        return "not installed"


def check() -> str | None:
    """One line when the installed torch lacks what the fence needs, else None."""
    try:
        missing = problems()
    except (OSError, SyntaxError, ValueError) as exc:
        missing = [f"a readable {MODULE} ({exc})"]
    if not missing:
        return None
    return (
        f"torch {torch_version()} lacks {', '.join(missing)} of its dynamic rendezvous "
        f"(the worker was read against torch {READ_FROM[0]} to {READ_FROM[1]})"
    )


def check_soon() -> Callable[[], str | None]:
    """check() in a thread, started now (about 0.1 s of parsing, off the pod's way while
    it waits in the gate); the function returned waits for its answer."""
    answer: list[str | None] = []
    thread = threading.Thread(target=lambda: answer.append(check()), name="torch-check")
    thread.daemon = True
    thread.start()

    def result() -> str | None:
        thread.join()
        return answer[0] if answer else f"torch {torch_version()}: the check of it failed"

    return result


def dynamic_rendezvous() -> ModuleType:
    """torch's module (imported here: a second or two of CPU the first time)."""
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous  # noqa: PLC0415

    return dynamic_rendezvous


@dataclass(frozen=True)
class RoundView:
    """The round a rendezvous holds now: its number, whether it is complete, and the
    torchruns in it with their group ranks (all 0 until the round completes; then 0 to
    n - 1, so a gap or fewer nodes than before means one left the completed round);
    `keep_alive`: the seconds of silence after which torch's agents drop a node
    (keep_alive_interval x keep_alive_max_attempt)."""

    round: int
    complete: bool
    ranks: Mapping[RdzvNode, int]
    keep_alive: float


def read_round(handler: RendezvousHandler) -> RoundView:
    """The round `handler`'s rendezvous holds now, read (and sanitized) as torch's agents
    read it."""
    try:
        h: Any = handler
        holder, settings = h._state_holder, h._settings
        holder.sync()
        state = holder.state
        ranks = {(n.addr, n.pid): int(r) for n, r in state.participants.items() if n.local_id == 0}
        keep_alive = settings.keep_alive_interval.total_seconds() * settings.keep_alive_max_attempt
        return RoundView(int(state.round), bool(state.complete), ranks, float(keep_alive))
    except AttributeError as exc:
        raise Unsupported(str(exc)) from None


def participants(handler: RendezvousHandler) -> list[RdzvNode]:
    """The torchruns (address, pid) in the round `handler`'s rendezvous holds now."""
    return list(read_round(handler).ranks)


@dataclass
class Removal:
    """What taking a node out did: the node's address, the list it left ("" when it was
    in none) and the round; `beat_after_death` when it stayed because it beat after it
    was seen dead; `lapsed` when this node's own keep-alive had lapsed, so that torch's
    read had dropped it already (removed_from "its keep-alive"), and the take-out wrote
    that."""

    addr: str = ""
    removed_from: str = ""
    round: int = -1
    beat_after_death: bool = False
    lapsed: bool = False


def take_out(
    handler: RendezvousHandler,
    addr: str | None,
    pid: int,
    *,
    timeout: float,
    dead_since: float | None = None,
    module: ModuleType | None = None,
) -> Removal:
    """Run torch's own state machine for the node of torchrun `pid` at `addr` (None: this
    host's FQDN, as torch uses), as the node itself would have: out of the participants,
    else the wait list, else the redundancy list; if it was the last participant of a
    complete round, the round moves on, as torch's `_RendezvousExitOp` does.
    `dead_since` (time.time()): another pod's node, seen dead then; it stays when its
    heartbeat is newer (a new torchrun with the same address and pid). Raises Unsupported
    when this torch lacks the internals; otherwise what etcd and torch raise."""
    dr = module if module is not None else dynamic_rendezvous()
    h: Any = handler
    try:
        desc = dr._NodeDesc(addr or socket.getfqdn(), pid, 0)
        holder = _Recording(h._state_holder)
        executor = dr._DistributedRendezvousOpExecutor(desc, holder, h._settings)
        op = _TakeOut(dr._Action, holder, dead_since)
        op.result.addr = desc.addr
        executor.run(op, time.monotonic() + timeout)
    except (AttributeError, TypeError) as exc:  # names or signatures this torch lacks
        raise Unsupported(str(exc)) from None
    return op.result


class _Recording:
    """torch's state holder, remembering whether its last sync wrote our change: a removal
    another pod wrote first (two survivors of one death) is not ours to report."""

    def __init__(self, holder: Any) -> None:
        self._holder = holder
        self.has_set: bool | None = None

    @property
    def state(self) -> Any:
        return self._holder.state

    def sync(self) -> bool | None:
        self.has_set = self._holder.sync()
        return self.has_set

    def mark_dirty(self) -> None:
        self._holder.mark_dirty()

    @property
    def lapsed(self) -> list[Any]:
        """The nodes the last sync dropped for a lapsed keep-alive (torch's `_sanitize`
        keeps them in memory only, until some node writes)."""
        return list(getattr(self._holder, "_dead_nodes", None) or [])


class _TakeOut:
    """A torch rendezvous operation (a state handler for the op executor)."""

    def __init__(self, action: Any, holder: _Recording, dead_since: float | None) -> None:
        self._action = action
        self._holder = holder
        self._dead_since = dead_since
        self.result = Removal()
        #: the list and round this node was found in before a write that was not
        #: acknowledged as ours
        self._seen: tuple[str, int, bool] | None = None

    def _lists(self, state: Any) -> list[tuple[Any, Any, str]]:
        lists = [
            (state.participants, self._action.REMOVE_FROM_PARTICIPANTS, "participants"),
            (state.wait_list, self._action.REMOVE_FROM_WAIT_LIST, "wait list"),
        ]
        redundant = getattr(state, "redundancy_list", None)  # torch 2.3 and later
        if redundant is not None:
            remove = self._action.REMOVE_FROM_REDUNDANCY_LIST
            lists.append((redundant, remove, "redundancy list"))
        return lists

    def __call__(self, ctx: Any, deadline: float) -> Any:
        result = self.result
        if result.removed_from and self._holder.has_set is False:
            # Our write lost to another's, or was applied under a reply that was lost (a
            # loaded etcd; the client retried): decide again on the state read since.
            self._seen = (result.removed_from, result.round, result.lapsed)
            result.removed_from = ""
            result.lapsed = False
        state = ctx.state
        beat = state.last_heartbeats.get(ctx.node)
        dead_since = self._dead_since
        if dead_since is None and ctx.node in self._holder.lapsed:
            # This node's own keep-alive lapsed (its torchrun starved at the signal on a
            # loaded host): torch's read dropped it in memory; write that, as a join would,
            # so that no later read finds it.
            if time.monotonic() > deadline:
                return self._action.ERROR_TIMEOUT
            result.removed_from, result.round, result.lapsed = "its keep-alive", state.round, True
            self._holder.mark_dirty()
            return self._action.SYNC
        if dead_since is not None and beat is not None and beat.timestamp() > dead_since:
            result.beat_after_death = True
            return self._action.FINISH
        for members, action, name in self._lists(state):
            if ctx.node in members:
                if time.monotonic() > deadline:
                    return self._action.ERROR_TIMEOUT
                result.removed_from, result.round = name, state.round
                return action
        if self._seen is not None and dead_since is None:
            # This node was there at our first look and is gone: it has left, by our own
            # write or another's (a peer that saw it dead reports its own take-out).
            result.removed_from, result.round, result.lapsed = self._seen
        return self._action.FINISH


# -- torchrun's exit barrier ------------------------------------------------------------
#
# Once its workers succeeded, torchrun waits in torch's exit barrier for the other nodes'
# (LocalElasticAgent's documented `exit_barrier_timeout`, 300 s by default). The launcher
# has no option for it: `launch_agent` (torch/distributed/launcher/api.py, read in 2.13)
# builds `LocalElasticAgent(...)` by the name in its module and passes no timeout. The
# fence gives that name a subclass whose default is the job's, inside torchrun.


def exit_barrier_problem(api: Any = None) -> str | None:
    """Why this torch's launcher would not take the job's exit barrier timeout through
    set_exit_barrier_timeout (`api`: torch.distributed.launcher.api); None when it would."""
    import inspect  # noqa: PLC0415 - in torchrun only

    if api is None:
        from torch.distributed.launcher import api  # noqa: PLC0415

    try:
        source = inspect.getsource(api.launch_agent)
        parameters = inspect.signature(api.LocalElasticAgent.__init__).parameters
    except (AttributeError, OSError, TypeError, ValueError) as exc:
        return f"its launcher cannot be read ({exc})"
    if "exit_barrier_timeout" not in parameters:
        return "LocalElasticAgent takes no exit_barrier_timeout"
    if "LocalElasticAgent(" not in source:
        return "launch_agent builds no LocalElasticAgent by that name"
    if "exit_barrier_timeout" in source:
        return "launch_agent passes an exit_barrier_timeout of its own"
    return None


def set_exit_barrier_timeout(timeout: float, api: Any = None) -> None:
    """launch_agent's agents wait at most `timeout` s in the exit barrier (after
    exit_barrier_problem() said None)."""
    if api is None:
        from torch.distributed.launcher import api  # noqa: PLC0415

    base = api.LocalElasticAgent

    class LocalElasticAgent(base):  # type: ignore[misc, valid-type]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            kwargs.setdefault("exit_barrier_timeout", timeout)
            super().__init__(*args, **kwargs)

    api.LocalElasticAgent = LocalElasticAgent


# -- a warm child's end: its default process group kept for the interpreter's exit ------
#
# (issue 24; docs/notes/2026-11-27-end-of-job.md) Under `python -u`, DDP's constructor
# first imports torch.distributed.nn.functional after init_process_group, and that
# module's default arguments (`group=group.WORLD`, evaluated at import) hold the default
# group until the interpreter finalizes, where its Python object frees it with the GIL
# released. A warm server imports that module before any group exists (DCP and FSDP
# import it), so in its child the last owner could be DDP's Reducer, freed with the GIL
# held as the script's main() returns: ~ProcessGroupGloo then joins a gloo thread that
# waits for the GIL. warm/child.py keeps the first default group the script destroys, as
# python -u's defaults would. What this relies on, read in torch 2.13's
# distributed_c10d.py: `destroy_process_group` is distributed_c10d's, re-exported by
# torch.distributed (the two names a script calls it by; no other module of torch imports
# it by name), and `group.WORLD` is the default group, None once destroyed. That its
# Python object frees it with the GIL released is pinned by running the script
# (tests/worker/warm/test_warm_end.py); the shapes by tests/worker/test_torchcompat_launch.py.


def keep_group_problem(dist: Any) -> str | None:
    """Why keep_destroyed_group would not reach this `torch.distributed`; None when it
    would. Read without running anything: the warm server says it once, after preload."""
    destroy = getattr(dist, "destroy_process_group", None)
    c10d = getattr(dist, "distributed_c10d", None)
    if destroy is None or getattr(c10d, "destroy_process_group", None) is not destroy:
        return "torch.distributed.destroy_process_group is not distributed_c10d's"
    if not hasattr(getattr(dist, "group", None), "WORLD"):
        return "torch.distributed has no group.WORLD"
    return None


def keep_destroyed_group(dist: Any, kept: list[object]) -> None:
    """From now on the default group the script destroys first is appended to `kept`
    (whose owner keeps it until the interpreter finalizes) before torch destroys it
    (after keep_group_problem(dist) said None). torch's function runs as it would, with
    the arguments it was given; its name, signature and docstring are kept."""
    destroy = dist.destroy_process_group

    @functools.wraps(destroy)
    def destroy_process_group(*args: Any, **kwargs: Any) -> Any:
        world = dist.group.WORLD
        if world is not None and not kept:
            kept.append(world)
        return destroy(*args, **kwargs)

    dist.destroy_process_group = destroy_process_group
    dist.distributed_c10d.destroy_process_group = destroy_process_group


# -- a warm child's env:// rendezvous: waits for rank 0's store before torch connects ----
#
# (warm/master.py says why.) init_process_group takes its rendezvous handler for env://
# from `torch.distributed.rendezvous._rendezvous_handlers["env"]` (read in 2.13; the
# public register_rendezvous_handler refuses a scheme already there). The fence puts a
# handler there that waits, then yields from torch's, which runs as it would.


def env_rendezvous_problem(rdzv: Any) -> str | None:
    """Why wait_before_env_rendezvous would not reach this torch.distributed.rendezvous;
    None when it would. The warm server says it once, after preload."""
    handlers = getattr(rdzv, "_rendezvous_handlers", None)
    if not isinstance(handlers, dict) or not callable(handlers.get("env")):
        return "torch.distributed.rendezvous has no env:// handler in _rendezvous_handlers"
    return None


def wait_before_env_rendezvous(rdzv: Any, wait: Callable[[str, Any], None]) -> None:
    """From now on env:// runs `wait(url, timeout)` before torch's handler (after
    env_rendezvous_problem(rdzv) said None)."""
    handlers = rdzv._rendezvous_handlers
    env = handlers["env"]

    @functools.wraps(env)
    def _env_rendezvous_handler(url: str, *args: Any, **kwargs: Any) -> Any:
        wait(url, kwargs.get("timeout"))
        return (yield from env(url, *args, **kwargs))

    handlers["env"] = _env_rendezvous_handler
