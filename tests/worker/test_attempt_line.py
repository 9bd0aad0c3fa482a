"""The attempt line (docs/contracts.md): torchrun runs the user's program through a
`sh -c` shim that, on local rank 0 only, writes one line per attempt and then execs the
program, which sees the same argv, environment, PID, exit code and signals as before.
Real torchrun (gloo, CPU) and real etcd; the user's program prints nothing of ours."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from elastic_worker.attempt_line import parse_attempt, process_alive
from elastic_worker.launch import argv as launch
from elastic_worker.settings import config
from testlib import EtcdServer, start_etcd
from torch.distributed.elastic.utils.api import macros

from worker.worker_helpers import PYTHON, Agent, wait_until, worker_env

ATTEMPT = re.compile(
    r"^\[elastic-worker\] attempt run_id=(\S+) restart=(\d+) group_rank=(\d+) "
    r"nodes=(\d+) world_size=(\d+)$"
)

# torchrun's documented worker environment that the shim reads
# (https://pytorch.org/docs/stable/elastic/run.html#environment-variables).
TORCHRUN_VARIABLES = (
    "TORCHELASTIC_RUN_ID",
    "TORCHELASTIC_RESTART_COUNT",
    "GROUP_RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
)

# The user's program: prints nothing, records what it was given, then does what
# ATTEMPT_MODE says.
PROGRAM = """
import json, os, signal, sys, time
out, mode = os.environ["ATTEMPT_OUT"], os.environ["ATTEMPT_MODE"]
restart, rank = os.environ["TORCHELASTIC_RESTART_COUNT"], os.environ["LOCAL_RANK"]
with open(f"/proc/{os.getppid()}/cmdline", "rb") as f:
    parent = f.read().split(b"\\0")[:-1]
record = {
    "pid": os.getpid(),
    "parent": [p.decode() for p in parent],
    "argv": sys.orig_argv,
    "env": dict(os.environ),
}
with open(f"{out}/r{restart}-l{rank}.json", "w") as f:
    json.dump(record, f)
if mode == "restart":  # the first attempt fails, the second succeeds
    if restart == "0":  # once both have written (torchrun stops the other within 0.1 s)
        while len([n for n in os.listdir(out) if n.startswith("r0-")]) < 2:
            time.sleep(0.05)
    sys.exit(1 if restart == "0" else 0)
if mode == "exit7":
    sys.exit(7)
if mode == "sigterm":
    def on_term(signum, frame):
        open(f"{out}/sigterm-l{rank}", "w").close()
        sys.exit(0)
    signal.signal(signal.SIGTERM, on_term)
    open(f"{out}/ready-l{rank}", "w").close()
    time.sleep(120)
"""


@pytest.fixture(scope="module")
def etcd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdServer]:
    server = start_etcd(tmp_path_factory.mktemp("etcd") / "data")
    yield server
    server.stop()


def attempt_lines(text: str) -> list[tuple[str, int, int, int, int]]:
    found = []
    for line in text.splitlines():
        if line.startswith("[elastic-worker] attempt"):
            match = ATTEMPT.match(line)
            assert match, f"attempt line out of contract: {line!r}"
            found.append((match[1], int(match[2]), int(match[3]), int(match[4]), int(match[5])))
    return found


def records(out: Path) -> dict[str, dict[str, Any]]:
    return {p.stem: json.loads(p.read_text()) for p in sorted(out.glob("r*-l*.json"))}


# -- the shim alone ------------------------------------------------------------------------


def shim_of(argv: list[str]) -> list[str]:
    """The part of torchrun's command line it runs for each worker (after --no-python)."""
    return argv[argv.index("--no-python") + 1 :]


def cfg(command: list[str], **extra: str) -> config.Config:
    env = {
        "ELASTIC_JOB_ID": "job-7",
        "ELASTIC_RDZV_ENDPOINT": "127.0.0.1:2379",
        "ELASTIC_MIN_NODES": "1",
        "ELASTIC_MAX_NODES": "4",
        "ELASTIC_INJECT_ENV": "/nonexistent",
        **extra,
    }
    return config.load(command, env)


TORCHRUN_ENV = {
    "TORCHELASTIC_RUN_ID": "job-7",
    "TORCHELASTIC_RESTART_COUNT": "2",
    "GROUP_RANK": "1",
    "WORLD_SIZE": "6",
    "LOCAL_WORLD_SIZE": "2",
    "PATH": os.environ["PATH"],
    "LANG": "C.UTF-8",  # else Python itself adds LC_CTYPE (PEP 538)
}


def test_build_argv_runs_the_shim_with_the_program_as_its_arguments(tmp_path: Path) -> None:
    code = "import sys; print(sys.argv[1:]); sys.exit(7)"
    argv = launch.build_argv(cfg(["python", "-c", code, "a b"]), None, python=sys.executable)
    assert shim_of(argv)[:2] == ["sh", "-c"]
    assert shim_of(argv)[3:] == ["elastic-worker-attempt", "python", "-c", code, "a b"]

    rank0 = subprocess.run(
        shim_of(argv),
        env={**TORCHRUN_ENV, "LOCAL_RANK": "0"},
        capture_output=True,
        text=True,
        check=False,
    )
    assert rank0.returncode == 7  # the program's own code
    assert rank0.stdout == "['a b']\n"  # its argv, untouched
    assert rank0.stderr == (
        "[elastic-worker] attempt run_id=job-7 restart=2 group_rank=1 nodes=3 world_size=6\n"
    )
    rank1 = subprocess.run(
        shim_of(argv),
        env={**TORCHRUN_ENV, "LOCAL_RANK": "1"},
        capture_output=True,
        text=True,
        check=False,
    )
    assert (rank1.returncode, rank1.stdout, rank1.stderr) == (7, "['a b']\n", "")


def test_the_shim_execs_so_the_environment_is_the_programs_as_given(tmp_path: Path) -> None:
    """No variable added by the shell (dash sets PWD when it is unset), PID kept."""
    code = "import os, json; print(json.dumps([os.getpid(), dict(os.environ)]))"
    argv = launch.build_argv(cfg([sys.executable, "-c", code]), None, python=sys.executable)
    env = {**TORCHRUN_ENV, "LOCAL_RANK": "1"}
    proc = subprocess.Popen(shim_of(argv), env=env, stdout=subprocess.PIPE, text=True)
    out, _ = proc.communicate(timeout=30)
    pid, seen = json.loads(out)
    assert pid == proc.pid  # exec: the program is the process torchrun started
    assert seen == env


# -- under real torchrun -------------------------------------------------------------------


def torchrun(
    etcd: EtcdServer,
    tmp_path: Path,
    name: str,
    mode: str,
    *,
    shim: bool,
    restarts: int = 1,
    warm_socket: str | None = None,
) -> tuple[subprocess.CompletedProcess[str], Path]:
    """torchrun as elastic-worker builds it (1 node, 2 processes) with or without the shim,
    the program started warm through `warm_socket` when given (warm/test_warm.py)."""
    out = tmp_path / name
    out.mkdir()
    program = tmp_path / "program.py"
    program.write_text(PROGRAM)
    config_ = cfg(
        ["python", str(program), "--flag", "two words"],
        ELASTIC_RDZV_ENDPOINT=etcd.endpoint,
        ELASTIC_MAX_NODES="1",
        ELASTIC_NPROC_PER_NODE="2",
        ELASTIC_MAX_RESTARTS=str(restarts),
    )
    base = worker_env(etcd.endpoint, name, ATTEMPT_OUT=str(out), ATTEMPT_MODE=mode)
    env, _ = launch.build_env(config_, None, base)
    argv = launch.build_argv(
        config_, "127.0.0.1", python=str(PYTHON), rdzv_id=name, pwd=None, warm_socket=warm_socket
    )
    if not shim:  # what elastic-worker ran before: torchrun starts `python -u script ...`
        argv = [*argv[: argv.index("--no-python")], str(program), "--flag", "two words"]
    result = subprocess.run(  # noqa: PLW1510 - the code is asserted
        argv, env=env, capture_output=True, text=True, timeout=180
    )
    return result, out


@pytest.mark.slow
def test_one_attempt_line_per_attempt_from_local_rank_0_and_the_program_sees_what_it_did(
    etcd: EtcdServer, tmp_path: Path
) -> None:
    before, out_before = torchrun(etcd, tmp_path, "plain", "restart", shim=False)
    after, out_after = torchrun(etcd, tmp_path, "shim", "restart", shim=True)
    assert before.returncode == after.returncode == 0, after.stderr[-3000:]

    # Two attempts (the first failed), each announced once, by local rank 0.
    assert attempt_lines(after.stderr) == [("shim", 0, 0, 1, 2), ("shim", 1, 0, 1, 2)]
    assert attempt_lines(after.stdout) == []
    assert attempt_lines(before.stderr) == []

    seen_before, seen_after = records(out_before), records(out_after)
    assert sorted(seen_after) == sorted(seen_before) == ["r0-l0", "r0-l1", "r1-l0", "r1-l1"]
    # What differs between any two runs: their names, output dirs and torch's port/files.
    run_specific = {"ELASTIC_JOB_ID", "TORCHELASTIC_RUN_ID", "ATTEMPT_OUT"}
    run_specific |= {"TORCHELASTIC_ERROR_FILE", "MASTER_PORT"}
    for key, rec in seen_after.items():
        old = seen_before[key]
        assert rec["argv"] == old["argv"] == [str(PYTHON), "-u", str(tmp_path / "program.py"),
                                              "--flag", "two words"]  # fmt: skip
        # The program's parent is torchrun itself: the shell exec'd it.
        assert rec["parent"][1:3] == ["-m", "elastic_worker.launch.torchrun"], rec["parent"]
        differs = {
            k
            for k in rec["env"].keys() | old["env"].keys()
            if rec["env"].get(k) != old["env"].get(k)
        }
        assert differs <= run_specific, {k: (old["env"].get(k), rec["env"].get(k)) for k in differs}


def test_torchrun_sets_the_variables_the_attempt_line_reads(
    etcd: EtcdServer, tmp_path: Path
) -> None:
    """Pins torchrun's documented worker environment; fails loudly if torch drops a name."""
    result, out = torchrun(etcd, tmp_path, "pin", "restart", shim=True)
    assert result.returncode == 0, result.stderr[-3000:]
    for key, rec in records(out).items():
        restart, local_rank = key[1], key[-1]
        env = rec["env"]
        missing = [name for name in TORCHRUN_VARIABLES if name not in env]
        assert not missing, f"torchrun no longer sets {missing}: the attempt line needs them"
        assert env["TORCHELASTIC_RUN_ID"] == "pin"
        assert env["TORCHELASTIC_RESTART_COUNT"] == restart
        assert (env["GROUP_RANK"], env["LOCAL_RANK"]) == ("0", local_rank)
        assert (env["WORLD_SIZE"], env["LOCAL_WORLD_SIZE"]) == ("2", "2")


def test_the_programs_exit_code_reaches_torchrun(etcd: EtcdServer, tmp_path: Path) -> None:
    result, _ = torchrun(etcd, tmp_path, "seven", "exit7", shim=True, restarts=0)
    assert result.returncode != 0
    # torchrun's failure report names each process's own exit code.
    assert re.search(r"exitcode\s*:\s*7\b", result.stderr), result.stderr[-3000:]
    assert len(attempt_lines(result.stderr)) == 1


@pytest.mark.slow
def test_sigterm_to_the_worker_reaches_the_program(etcd: EtcdServer, tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    program = tmp_path / "program.py"
    program.write_text(PROGRAM)
    env = worker_env(
        etcd.endpoint,
        "sigterm",
        ELASTIC_MIN_NODES="1",
        ELASTIC_MAX_NODES="1",
        ELASTIC_NPROC_PER_NODE="2",
        ATTEMPT_OUT=str(out),
        ATTEMPT_MODE="sigterm",
    )
    agent = Agent.start("w0", ["python", str(program)], env, tmp_path / "w0.log")
    try:
        wait_until("both programs ready", lambda: len(list(out.glob("ready-l*"))) == 2, 120)
        time.sleep(0.5)
        os.kill(agent.proc.pid, signal.SIGTERM)
        agent.wait(60)
    finally:
        agent.kill()
    assert sorted(p.name for p in out.glob("sigterm-l*")) == ["sigterm-l0", "sigterm-l1"]
    assert attempt_lines(agent.text()) == [("sigterm", 0, 0, 1, 2)]


# -- the line appended to the attempt log, and the process it names --


@pytest.mark.parametrize(
    "line",
    [
        "[elastic-worker] attempt run_id=j restart=0 group_rank=0 nodes=2 world_size=2",  # no pid
        "[elastic-worker] attempt run_id=j restart=x group_rank=0 nodes=2 world_size=2 pid=5",
        "[elastic-worker] attempt run_id=j restart=0 group_rank=0 no",  # torn
        "[train] step=3",
    ],
)
def test_a_line_that_is_not_a_whole_attempt_is_ignored(line: str) -> None:
    assert parse_attempt(line) is None


def shim(
    tmp_path: Path, log: str | None, **env: str
) -> tuple[subprocess.CompletedProcess[str], str]:
    """Run the attempt shim as torchrun does, with a program that prints its PID."""
    program = ["python3", "-c", "import os, sys; print(os.getpid()); sys.exit(7)"]
    base = {
        "PATH": os.environ["PATH"],
        "LOCAL_RANK": "0",
        "TORCHELASTIC_RUN_ID": "default-run42",
        "TORCHELASTIC_RESTART_COUNT": "2",
        "GROUP_RANK": "1",
        "WORLD_SIZE": "6",
        "LOCAL_WORLD_SIZE": "2",
        **env,
    }
    if log is not None:
        base["ELASTIC_ATTEMPT_LOG"] = log
    # What torchrun runs after --no-python, through the `${local_rank}` macro substitution
    # its local agent applies to every argument (it turns `$$` into `$`).
    args = macros.substitute(launch.command_args(program, "python3")[1:], "0")
    result = subprocess.run(args, env=base, capture_output=True, text=True, timeout=10, check=False)
    return result, result.stdout.strip()


def test_the_shim_appends_the_attempt_line_with_the_programs_pid(tmp_path: Path) -> None:
    log = tmp_path / "attempts"
    result, pid = shim(tmp_path, str(log))
    assert result.returncode == 7
    # stderr keeps the contract's line exactly; the log adds the PID the program runs as.
    assert result.stderr == (
        "[elastic-worker] attempt run_id=default-run42 restart=2 group_rank=1 nodes=3 "
        "world_size=6\n"
    )
    parsed = parse_attempt(log.read_text().rstrip("\n"))
    assert parsed is not None
    assert (parsed.restart, parsed.group_rank, parsed.nodes, parsed.pid) == (2, 1, 3, int(pid))


def test_a_log_that_cannot_be_written_changes_nothing_for_the_program(tmp_path: Path) -> None:
    result, _ = shim(tmp_path, str(tmp_path / "missing-dir" / "attempts"))
    assert result.returncode == 7
    assert result.stderr.startswith("[elastic-worker] attempt ") and result.stderr.count("\n") == 1
    result, _ = shim(tmp_path, None, LOCAL_RANK="1")
    assert (result.returncode, result.stderr) == (7, "")


def test_a_zombie_has_ended() -> None:
    proc = subprocess.Popen(["true"])
    wait_until("true to exit", lambda: not process_alive(proc.pid), timeout=10)
    assert Path(f"/proc/{proc.pid}").exists()  # not yet reaped: a zombie
    proc.wait()
    assert process_alive(os.getpid())
