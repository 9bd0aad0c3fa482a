"""The end of a warm training process: it ends as under `python -u` (the destroyed default
process group and the globals kept until the interpreter exits: issue 24), and a teardown
that blocks after the script returned is bounded."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from elastic_worker.settings.definitions import BY_NAME
from elastic_worker.torchcompat import torch_version
from elastic_worker.warm import server as warm
from testlib import free_port

from worker.warm.warmlib import client, run
from worker.worker_helpers import PYTHON, kill_tree

#: What a pod's server imports (settings.py's default): torch.distributed.checkpoint and
#: .fsdp import torch.distributed.nn.functional, whose import-time defaults decide when
#: a script's default process group is freed (warm._keep_for_exit).
POD_PRELOAD = (BY_NAME["ELASTIC_WARM_PRELOAD"].default or "").split(",")

#: DDP over gloo, two ranks; the last collective (a metric's all_reduce, which rank 0
#: starts with async_op=True and does not wait for) is still running when rank 0's main()
#: returns: rank 1 joins it 2 s later. Both destroy the process group and return.
IN_FLIGHT_AT_RETURN = """\
import time, torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

def main():
    dist.init_process_group("gloo")
    model = DDP(torch.nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(2):
        opt.zero_grad(); model(torch.rand(2, 4)).sum().backward(); opt.step()
    metric = torch.ones(1)
    if dist.get_rank() == 0:
        dist.all_reduce(metric, async_op=True)
    else:
        time.sleep(2)
        dist.all_reduce(metric)
    dist.destroy_process_group()
    print("returned", flush=True)

main()
"""


@pytest.fixture(scope="module")
def pod_server() -> Iterator[warm.Handle]:
    handle = warm.start(str(PYTHON), POD_PRELOAD, dict(os.environ))
    yield handle
    handle.stop()


def _ranks(argv: list[str], tmp_path: Path, world: int = 2) -> list[tuple[int | None, str]]:
    """`argv` as every rank of a `world`-process gloo job on 127.0.0.1: each rank's exit code
    (None: still running after 90 s, then killed) and output."""
    job = {"LOCAL_RANK": "0", "WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1"}
    job["MASTER_PORT"] = str(free_port())
    procs = [
        subprocess.Popen(
            argv,
            env={**os.environ, **job, "RANK": str(rank)},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            cwd=tmp_path,
        )
        for rank in range(world)
    ]
    results: list[tuple[int | None, str]] = []
    for proc in procs:
        try:
            out, _ = proc.communicate(timeout=90)
            results.append((proc.returncode, out))
        except subprocess.TimeoutExpired:
            kill_tree(proc.pid)  # a warm client: the server kills its child with it
            out, _ = proc.communicate(timeout=30)
            results.append((None, out))
    return results


#: What a process aborted at interpreter finalization by a gloo thread's noexcept
#: destructor prints (see the test below).
TORCH_FINALIZATION_ABORT = "terminate called without an active exception"


@pytest.mark.slow
def test_a_ddp_script_with_a_collective_running_at_its_end_ends_as_under_python_u(
    pod_server: warm.Handle, tmp_path: Path
) -> None:
    """The issue's hang, made certain: with the pod's preload, the default group's last
    owner was DDP's Reducer, freed (GIL held) when main() returned; ~ProcessGroupGloo
    joined a worker thread that waited for the GIL to free the collective's tensor. Under
    `python -u` the group lives until the interpreter finalizes. Both ranks, both ways,
    must end 0 (before warm._keep_for_exit, the warm ranks never ended)."""
    script = tmp_path / "train.py"
    script.write_text(IN_FLIGHT_AT_RETURN)
    cold = _ranks([str(PYTHON), "-u", str(script)], tmp_path)
    hot = _ranks(client(pod_server, str(script)), tmp_path)
    for rank, (code, out) in enumerate(cold):
        # plain python ends, but its gloo threads may abort it at finalization (torch's, not
        # ours: the test below shows why the warm ranks do not): exit -6 once on CI
        aborted = code == -signal.SIGABRT and TORCH_FINALIZATION_ABORT in out
        assert code == 0 or aborted, f"python -u: rank {rank} exit {code} (None: hung)\n{out}"
        assert "returned" in out, (rank, out[-3000:])
    for rank, (code, out) in enumerate(hot):
        assert code == 0, f"warm: rank {rank} exit {code} (None: hung)\n{out[-3000:]}"
        assert "returned" in out, (rank, out[-3000:])


#: Preloaded by the server, so its exit handler runs after every one its children register
#: (atexit runs the last registered first): the threads left when the interpreter begins to
#: finalize.
THREADS_AT_FINALIZATION = """\
import atexit, os
def _threads():
    names = []
    for task in os.listdir("/proc/self/task"):
        try:
            names.append(open(f"/proc/self/task/{task}/comm").read().strip())
        except OSError:
            pass  # it ended meanwhile
    print("threads at finalization:", len(names), sorted(names), flush=True)
atexit.register(_threads)
"""


@pytest.mark.slow
def test_the_kept_groups_threads_are_joined_before_the_interpreter_finalizes(
    tmp_path: Path,
) -> None:
    """The kept group is released by an exit handler, not at finalization: there a gloo
    thread that takes the GIL to free a collective's tensor is ended by pthread_exit through
    a noexcept destructor, and the process aborts (exit -6, "terminate called without an
    active exception": once in a CI run of the test above). Before the handler, every rank
    had its two pt_gloo_runloop threads (and the store's) alive at that point."""
    (tmp_path / "late_exit.py").write_text(THREADS_AT_FINALIZATION)
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}:{os.environ.get('PYTHONPATH', '')}"}
    handle = warm.start(str(PYTHON), [*POD_PRELOAD, "late_exit"], env)
    try:
        script = tmp_path / "train.py"
        script.write_text(IN_FLIGHT_AT_RETURN)
        ranks = _ranks(client(handle, str(script)), tmp_path)
    finally:
        handle.stop()
    for rank, (code, out) in enumerate(ranks):
        assert code == 0, f"rank {rank} exit {code} (None: hung)\n{out[-3000:]}"
        line = next((ln for ln in out.splitlines() if "at finalization" in ln), out)
        assert line.startswith("threads at finalization: 1 "), (rank, line)  # main alone


#: Whether the script's destroy_process_group is the fence's (torchcompat.py), which keeps
#: the destroyed default group for the interpreter's exit.
KEEPS = "import torch.distributed as d; print(hasattr(d.destroy_process_group, '__wrapped__'))"


def test_a_torch_the_group_fence_would_not_reach_is_said_once_and_the_child_keeps_nothing(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """A torch whose destroy_process_group the fence does not recognise (here a preloaded
    module replaced it): the server says so once, in one line naming torch and the
    shape, and its children leave torch's function as it is."""
    (tmp_path / "replaces_destroy.py").write_text(
        "import torch.distributed as d\nd.destroy_process_group = lambda group=None: None\n"
    )
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}:{os.environ.get('PYTHONPATH', '')}"}
    handle = warm.start(str(PYTHON), ["torch", "replaces_destroy"], env)
    try:
        for _ in range(2):
            result = run(handle, tmp_path, KEEPS)
            assert (result.returncode, result.stdout) == (0, "False\n"), result.stderr
    finally:
        handle.stop()
    lines = [ln for ln in capfd.readouterr().err.splitlines() if "default process group" in ln]
    assert lines == [
        f"elastic-worker: warm server: torch {torch_version()}: torch.distributed."
        "destroy_process_group is not distributed_c10d's: a training process's default process "
        "group is freed when its script drops it, not at its exit as under python -u (a DDP "
        "script can hang at its end, until its teardown bound: docs/notes/2026-11-27-end-of-job.md)"
    ]


@pytest.mark.slow
def test_a_child_of_the_pods_server_keeps_the_destroyed_group(
    pod_server: warm.Handle, tmp_path: Path
) -> None:
    """The pod's server (its default preload) hands its children the fence's function."""
    result = run(pod_server, tmp_path, KEEPS)
    assert (result.returncode, result.stdout) == (0, "True\n"), result.stderr


#: Whether the script's globals are still there when atexit runs (after a collection).
GLOBALS_AT_EXIT = """\
import atexit, weakref
class Thing:
    pass
thing = Thing()
# The handler's globals are its own dict: it holds no reference to this module's.
atexit.register(eval("lambda ref: (__import__('gc').collect(), "
                     "print('alive' if ref() is not None else 'freed', flush=True))", {}),
                weakref.ref(thing))
"""


@pytest.mark.parametrize("end", ["", "raise SystemExit(3)\n", "raise ValueError('x')\n"])
def test_a_scripts_globals_live_until_the_interpreter_exits_as_under_python_u(
    server: warm.Handle, tmp_path: Path, end: str
) -> None:
    """python -u's __main__ is freed only when the interpreter finalizes (after atexit);
    runpy's copy of the script's module in a warm child went at the next collection, so
    whatever the globals held (a model, a process group, a store) was freed earlier and
    elsewhere than under python -u."""
    script = tmp_path / "script.py"
    script.write_text(GLOBALS_AT_EXIT + end)
    cold = subprocess.run(  # noqa: PLW1510 - asserted
        [str(PYTHON), "-u", str(script)], capture_output=True, text=True, timeout=60
    )
    hot = run(server, tmp_path, GLOBALS_AT_EXIT + end)
    assert (hot.returncode, hot.stdout) == (cold.returncode, cold.stdout), hot.stderr
    assert cold.stdout == "alive\n"


# -- a teardown that blocks: stopped after the bound -------------------------------------


#: What torchrun gives a training process (its documented worker environment, in part).
WORKER = {**os.environ, "TORCHELASTIC_RUN_ID": "job", "RANK": "2", "LOCAL_RANK": "0"}


@contextlib.contextmanager
def bounded() -> Iterator[warm.Handle]:
    """A server whose children get 2 s after their script returned. Started in the test's
    body: its lines then go to the capture the test reads (capfd), not the setup's."""
    handle = warm.start(str(PYTHON), [], dict(os.environ), teardown=2)
    try:
        yield handle
    finally:
        handle.stop()


@pytest.mark.parametrize(
    ("end", "code"),
    [
        # A non-daemon thread: the interpreter waits for it before anything else.
        ("threading.Thread(target=time.sleep, args=(3600,)).start()\n", 0),
        # A native call that keeps the GIL, in an atexit handler (as a destructor would).
        ("atexit.register(ctypes.PyDLL(None).sleep, 3600)\nsys.exit(4)\n", 4),
    ],
    ids=["thread", "gil-held-at-exit"],
)
def test_a_process_whose_teardown_blocks_is_stopped_and_ends_as_its_script_did(
    tmp_path: Path, capfd: pytest.CaptureFixture[str], end: str, code: int
) -> None:
    """Under `python -u` both hang for an hour; warm, the process is stopped 2 s after its
    script returned, its client exits with the script's code, and the server says so."""
    with bounded() as handle:
        start = time.monotonic()
        result = run(
            handle, tmp_path, "import atexit, ctypes, sys, threading, time\n" + end, env=WORKER
        )
        took = time.monotonic() - start
    assert result.returncode == code, result.stderr
    assert 2 <= took < 30, took
    err = capfd.readouterr().err
    line = next((ln for ln in err.splitlines() if "still running" in ln), err)
    assert re.fullmatch(
        rf"elastic-worker: training process \d+ \(rank 2, local rank 0\) still running "
        rf"\d+ s after its script returned {code} \(its teardown blocks: .*\): stopped it; "
        rf"it counts as exited {code} \(job.exitBarrierTimeoutSeconds\)",
        line,
    ), line


def test_the_teardown_bound_counts_from_the_scripts_return_not_its_start(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """A script that works longer than the bound is not stopped: only its teardown is."""
    with bounded() as handle:
        result = run(handle, tmp_path, "import time; time.sleep(3); print('done')", env=WORKER)
    assert (result.returncode, result.stdout) == (0, "done\n"), result.stderr
    assert "still running" not in capfd.readouterr().err


def test_only_torchruns_workers_are_bounded(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """The lifelines' helper is forked from the server too (no TORCHELASTIC_RUN_ID): its
    teardown is not a training process's, and it is not stopped."""
    script = "import threading, time; threading.Thread(target=time.sleep, args=(4,)).start()"
    with bounded() as handle:
        start = time.monotonic()
        result = run(handle, tmp_path, script)
        took = time.monotonic() - start
    assert result.returncode == 0, result.stderr
    assert took >= 4, took  # its thread ended by itself: nothing stopped it at 2 s
    assert "still running" not in capfd.readouterr().err
