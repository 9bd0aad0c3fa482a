"""Warm starts (elastic_worker.warm, warmstart): a training process forked from a server
that has imported torch behaves, for torchrun and for the program, as `python -u` did."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from elastic_worker.settings import config
from elastic_worker.warm import server as warm
from elastic_worker.warm.protocol import warm_command
from testlib import EtcdServer, start_etcd

from worker.test_attempt_line import attempt_lines, cfg, records, torchrun
from worker.warm.warmlib import client, run
from worker.worker_helpers import PYTHON, descendants, wait_until


@pytest.fixture(scope="module")
def etcd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdServer]:
    server = start_etcd(tmp_path_factory.mktemp("etcd"))
    yield server
    server.stop()


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


#: What a program sees of the interpreter it runs in: the server's own modules and logging
#: must not be there, so that it sees what `python -u` shows.
SEES = """\
import importlib.util, json, logging, sys
ours = sorted(m for m in sys.modules if m.split(".")[0] == "elastic_worker")
spec = importlib.util.find_spec("elastic_worker")
import elastic_worker
root = logging.getLogger()
print(json.dumps({
    "modules": ours,
    "found": spec.origin if spec else None,
    "imported": elastic_worker.__file__,
    "root": [logging.getLevelName(root.level), [type(h).__name__ for h in root.handlers]],
    "loggers": sorted(n for n in logging.Logger.manager.loggerDict if "elastic" in n),
}))
logging.basicConfig(format="script: %(levelname)s %(message)s", level=logging.INFO)
logging.info("its own format")
"""


def test_the_program_sees_none_of_the_servers_own_modules_or_logging(
    server: warm.Handle, tmp_path: Path
) -> None:
    """The server runs the worker's modules and logs through the root logger; the program
    sees what `python -u` shows: no elastic_worker module loaded, `import elastic_worker`
    the user's own module beside the script, and a root logger its basicConfig sets."""
    app = tmp_path / "app"  # not the working directory: the client's `-m` would find it
    app.mkdir()
    (app / "train.py").write_text(SEES)
    (app / "elastic_worker.py").write_text("MINE = True\n")
    forked, fresh = (
        subprocess.run(  # noqa: PLW1510 - asserted
            [*argv, str(app / "train.py")], capture_output=True, text=True, timeout=60, cwd=tmp_path
        )
        for argv in (client(server), [str(PYTHON), "-u"])
    )
    assert (forked.returncode, fresh.returncode) == (0, 0), forked.stderr + fresh.stderr
    mine = str(app / "elastic_worker.py")
    seen = {"modules": [], "found": mine, "imported": mine, "root": ["WARNING", []], "loggers": []}
    assert json.loads(forked.stdout) == json.loads(fresh.stdout) == seen
    assert forked.stderr == fresh.stderr == "script: INFO its own format\n"


def test_it_is_a_fork_of_the_server_with_torch_already_imported(
    server: warm.Handle, tmp_path: Path
) -> None:
    code = (
        "import os, sys; print(os.getppid(), 'torch' in sys.modules, os.getpgid(0) == os.getpid())"
    )
    result = run(server, tmp_path, code)
    assert result.stdout.split() == [str(server.proc.pid), "True", "True"], result.stderr


def test_what_the_server_imported_is_out_of_the_childs_cycle_collections(
    server: warm.Handle, tmp_path: Path
) -> None:
    """gc.freeze in the server: torch's objects are in the permanent generation, which the
    child's collections and its exit's do not walk (the exit took ~1 s more without); what
    the script creates is collected as under python -u."""
    code = (
        "import gc, torch\n"
        "frozen = gc.get_freeze_count()\n"
        "class Cycle: pass\n"
        "a, b = Cycle(), Cycle(); a.b, b.a = b, a; del a, b\n"
        "print(frozen > 10000, gc.collect() >= 2)"
    )
    result = run(server, tmp_path, code)
    assert result.stdout.split() == ["True", "True"], result.stderr


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


@pytest.mark.slow
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
