"""Warm starts (elastic_worker.warm, warmstart): a training process forked from a server
that has imported torch behaves, for torchrun and for the program, as `python -u` did."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from elastic_worker.settings import config
from elastic_worker.settings.definitions import BY_NAME
from elastic_worker.torchcompat import torch_version
from elastic_worker.warm import server as warm
from elastic_worker.warm.protocol import warm_command
from testlib import EtcdServer, free_port, start_etcd

from worker.launch.test_attempt_line import attempt_lines, cfg, records, torchrun
from worker.worker_helpers import PYTHON, descendants, kill_tree, wait_until


@pytest.fixture(scope="module")
def etcd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdServer]:
    server = start_etcd(tmp_path_factory.mktemp("etcd"))
    yield server
    server.stop()


@pytest.fixture(scope="module")
def server() -> Iterator[warm.Handle]:
    handle = warm.start(str(PYTHON), ["torch", "numpy"], dict(os.environ))
    yield handle
    handle.stop()


def client(handle: warm.Handle, *args: str) -> list[str]:
    return [str(PYTHON), "-m", "elastic_worker.warm.client", handle.socket_path, "-u", *args]


def run(
    handle: warm.Handle, tmp_path: Path, code: str, *args: str, **kw: Any
) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "script.py"
    script.write_text(code)
    return subprocess.run(  # noqa: PLW1510 - asserted by the callers
        client(handle, str(script), *args),
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
        **kw,
    )


def test_the_program_gets_its_argv_cwd_env_and_stdio_and_its_exit_code_is_the_clients(
    server: warm.Handle, tmp_path: Path
) -> None:
    code = (
        "import json, os, sys\n"
        "line = sys.stdin.readline().strip()\n"
        "print(json.dumps([sys.argv, os.getcwd(), os.environ.get('WARM_X'), line,"
        " sys.path[0], __name__, sys.orig_argv]))\n"
        "print('to stderr', file=sys.stderr)\n"
        "sys.exit(5)\n"
    )
    env = {**os.environ, "WARM_X": "x y"}
    result = run(server, tmp_path, code, "a", "b c", input="from stdin\n", env=env)
    assert result.returncode == 5, result.stderr
    argv, cwd, x, line, path0, name, orig = json.loads(result.stdout)
    script = str(tmp_path / "script.py")
    assert argv == [script, "a", "b c"]
    assert (cwd, x, line, path0, name) == (
        str(tmp_path),
        "x y",
        "from stdin",
        str(tmp_path),
        "__main__",
    )
    assert orig == [str(PYTHON), "-u", script, "a", "b c"]  # what `python -u` shows
    assert result.stderr == "to stderr\n"


def test_it_is_a_fork_of_the_server_with_torch_already_imported(
    server: warm.Handle, tmp_path: Path
) -> None:
    code = (
        "import os, sys; print(os.getppid(), 'torch' in sys.modules, os.getpgid(0) == os.getpid())"
    )
    result = run(server, tmp_path, code)
    assert result.stdout.split() == [str(server.proc.pid), "True", "True"], result.stderr


def test_a_preload_module_that_cannot_be_imported_is_said_and_the_rest_still_serve(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """The default list names torch's distributed modules, which an older torch may lack:
    such a module is skipped with a warning, and the server still forks, warm."""
    (tmp_path / "breaks_at_import.py").write_text("raise RuntimeError('no GPU here')\n")
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}:{os.environ.get('PYTHONPATH', '')}"}
    handle = warm.start(str(PYTHON), ["torch", "no_such_module", "breaks_at_import"], env)
    try:
        result = run(handle, tmp_path, "import sys; print('torch' in sys.modules)")
        assert (result.returncode, result.stdout) == (0, "True\n"), result.stderr
        assert "starting cold" not in result.stderr
    finally:
        handle.stop()
    err = capfd.readouterr().err
    assert "cannot import no_such_module (No module named 'no_such_module')" in err
    assert "cannot import breaks_at_import (no GPU here)" in err
    assert "warm server ready: torch imported" in err


def test_an_uncaught_exception_prints_the_scripts_traceback_and_exits_1(
    server: warm.Handle, tmp_path: Path
) -> None:
    result = run(server, tmp_path, "def f():\n    raise ValueError('boom')\nf()\n")
    assert result.returncode == 1
    frames = re.findall(r'File "([^"]+)"', result.stderr)
    assert frames == [str(tmp_path / "script.py")] * 2, result.stderr  # <module>, then f
    assert result.stderr.rstrip().endswith("ValueError: boom")


def test_a_program_killed_by_a_signal_kills_the_client_with_it(
    server: warm.Handle, tmp_path: Path
) -> None:
    result = run(server, tmp_path, "import os, signal; os.kill(os.getpid(), signal.SIGSEGV)")
    assert result.returncode == -signal.SIGSEGV


def test_sigterm_to_the_clients_group_reaches_the_programs_group(
    server: warm.Handle, tmp_path: Path
) -> None:
    """As torchrun stops a worker: killpg of the process it started."""
    (tmp_path / "script.py").write_text(
        "import os, signal, sys, time\n"
        "kid = os.fork()\n"
        "if kid == 0:\n"
        "    signal.signal(signal.SIGTERM, lambda *a: os._exit(0))\n"
        "    open('kid-ready', 'w').close(); time.sleep(60); os._exit(1)\n"
        "while not os.path.exists('kid-ready'): time.sleep(0.01)\n"
        "def on_term(*a):\n"
        "    _, status = os.waitpid(kid, 0)\n"
        "    print('term', os.waitstatus_to_exitcode(status), flush=True); sys.exit(3)\n"
        "signal.signal(signal.SIGTERM, on_term)\n"
        "print('ready', flush=True); time.sleep(60)\n"
    )
    proc = subprocess.Popen(
        client(server, str(tmp_path / "script.py")),
        stdout=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
        start_new_session=True,
    )
    assert proc.stdout is not None
    assert proc.stdout.readline() == "ready\n"
    os.killpg(proc.pid, signal.SIGTERM)
    assert proc.wait(30) == 3
    assert proc.stdout.read() == "term 0\n"  # the program's child got it too


def test_a_sigkilled_client_takes_the_program_along(server: warm.Handle, tmp_path: Path) -> None:
    (tmp_path / "script.py").write_text("import time; print('ready', flush=True); time.sleep(60)")
    proc = subprocess.Popen(
        client(server, str(tmp_path / "script.py")), stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    assert proc.stdout.readline() == "ready\n"
    program = descendants(server.proc.pid)
    assert len(program) == 1
    proc.kill()
    proc.wait(10)
    wait_until("the program gone", lambda: not Path(f"/proc/{program[0]}").exists(), 10)


def test_what_a_fresh_interpreter_reads_at_import_is_redone(
    server: warm.Handle, tmp_path: Path
) -> None:
    """torchrun sets OMP_NUM_THREADS=1 for several processes per node; numpy's global
    generator must not repeat across processes."""
    code = "import numpy, torch; print(torch.get_num_threads(), numpy.random.randint(1 << 30))"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    first = run(server, tmp_path, code, env=env).stdout.split()
    second = run(server, tmp_path, code, env=env).stdout.split()
    assert first[0] == second[0] == "1"
    assert first[1] != second[1]


def test_without_a_server_the_command_runs_cold_and_says_so(tmp_path: Path) -> None:
    (tmp_path / "script.py").write_text("import sys; print(sys.argv[1:]); sys.exit(4)")
    result = subprocess.run(  # noqa: PLW1510 - asserted
        [
            str(PYTHON),
            "-m",
            "elastic_worker.warm.client",
            str(tmp_path / "nothing"),
            "-u",
            str(tmp_path / "script.py"),
            "x",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (result.returncode, result.stdout) == (4, "['x']\n")
    assert result.stderr.startswith("elastic-worker warm start: server at ")
    assert result.stderr.endswith("; starting cold\n")


def test_only_python_scripts_and_modules_are_started_warm() -> None:
    py = "/usr/bin/python3"
    assert warm_command([py, "-u", "t.py", "a"], py, "S") == [
        py, "-m", "elastic_worker.warm.client", "S", "-u", "t.py", "a"]  # fmt: skip
    assert warm_command([py, "-u", "-m", "pkg", "a"], py, "S") is not None
    assert warm_command(["/bin/train", "a"], py, "S") is None  # a binary
    assert warm_command([py, "-c", "code"], py, "S") is None  # as the user wrote it
    assert warm_command(["/other/python", "-u", "t.py"], py, "S") is None


def test_a_bad_preload_list_is_refused_by_name() -> None:
    with pytest.raises(config.ConfigError, match=r"ELASTIC_WARM_PRELOAD has 'torch vision'"):
        cfg(["python", "t.py"], ELASTIC_WARM_PRELOAD="torch,torch vision")


# -- under real torchrun -------------------------------------------------------------------


def test_under_torchrun_a_warm_attempt_sees_what_a_cold_one_does(
    etcd: EtcdServer, tmp_path: Path, server: warm.Handle
) -> None:
    """Same argv, environment, attempts and exit handling; only the parent differs."""
    results = {}
    for name, socket_path in (("cold", None), ("warm", server.socket_path)):
        result, out = torchrun(etcd, tmp_path, name, "restart", shim=True, warm_socket=socket_path)
        assert result.returncode == 0, result.stderr[-3000:]
        assert attempt_lines(result.stderr) == [(name, 0, 0, 1, 2), (name, 1, 0, 1, 2)]
        results[name] = records(out)
    cold, hot = results["cold"], results["warm"]
    assert sorted(hot) == sorted(cold) == ["r0-l0", "r0-l1", "r1-l0", "r1-l1"]
    run_specific = {"ELASTIC_JOB_ID", "TORCHELASTIC_RUN_ID", "ATTEMPT_OUT"}
    run_specific |= {"TORCHELASTIC_ERROR_FILE", "MASTER_PORT"}
    for key, rec in hot.items():
        assert rec["argv"] == cold[key]["argv"]
        assert rec["parent"][1:4] == ["-m", "elastic_worker.warm.server", server.socket_path]
        assert cold[key]["parent"][1:3] == ["-m", "elastic_worker.launch.torchrun"]
        differs = {
            k
            for k in rec["env"].keys() | cold[key]["env"].keys()
            if rec["env"].get(k) != cold[key]["env"].get(k)
        }
        assert differs <= run_specific, differs


# -- the end of a script: as under `python -u` ------------------------------------------

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
    for how, results in (("python -u", cold), ("warm", hot)):
        for rank, (code, out) in enumerate(results):
            assert code == 0, f"{how}: rank {rank} exit {code} (None: hung)\n{out[-3000:]}"
            assert "returned" in out, (how, rank, out[-3000:])


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
        "script can hang at its end, until its teardown bound: docs/recovery.md)"
    ]


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
