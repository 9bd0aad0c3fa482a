"""Silent-loss detection (lossdetect.py, telling the node-loss policy) against a real etcd,
on both backends' APIs (v2 TTLs, v3 leases): a member that stops renewing its key
(frozen with SIGSTOP, as a cut link or a frozen VM would) makes the others stop their
training process at once; healthy members, a clean leave and a completed job stop none.

Each pod's liveness runs in its own process (tests/worker/recovery/lossdetect_pod.py); each pod's
"training process" is a real process with torch's MASTER_ADDR/MASTER_PORT in its
environment, announced by an attempt line with its PID as the attempt shim writes it.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import signal
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from elastic_worker import completion, timings
from elastic_worker.attempt_line import ATTEMPT_PREFIX
from elastic_worker.completion import Completion
from elastic_worker.keystore import interface as kvstore
from elastic_worker.recovery import lossdetect as liveness
from elastic_worker.recovery.policy import NodeLoss
from elastic_worker.settings import config
from testlib import EtcdServer

from worker.worker_helpers import (
    PYTHON,
    keystore_fixtures,
    wait_until,
)

POD_SCRIPT = Path(__file__).with_name("lossdetect_pod.py")
JOB = "live42"
MASTER = ("10.0.0.1", "29400")
ROUND = f"{JOB}@{MASTER[0]}:{MASTER[1]}"

backend, etcd, client = keystore_fixtures(JOB)


def pod_env(etcd: EtcdServer, name: str) -> dict[str, str]:
    return {
        "PATH": os.environ["PATH"],
        "ELASTIC_JOB_ID": JOB,
        "ELASTIC_RDZV_ENDPOINT": etcd.endpoint,
        "ELASTIC_RDZV_BACKEND": "etcd-v2" if etcd.v2 else "etcd-v3",
        "ELASTIC_MIN_NODES": "2",
        "ELASTIC_MAX_NODES": "3",
        "ELASTIC_INJECT_ENV": "/nonexistent",
        "POD_NAME": name,
        "ELASTIC_GRACE_PERIOD": "5",
    }


def sleeper(env: dict[str, str]) -> subprocess.Popen[bytes]:
    """`sleep` with `env`, once exec'd (before, /proc shows the forked test's environment)."""
    proc = subprocess.Popen(["sleep", "600"], env={"PATH": os.environ["PATH"], **env})
    cmdline = Path(f"/proc/{proc.pid}/cmdline")
    wait_until("sleep to be exec'd", lambda: cmdline.read_bytes().startswith(b"sleep"), 5, 0.01)
    return proc


def members(client: kvstore.KeyStore) -> list[str | None]:
    """The values of the members' keys in the round (its marker left out)."""
    nodes = client.list_dir(f"/elastic-job/{JOB}/rounds/{ROUND}")
    return [n.value for n in nodes if not n.key.endswith(f"/{liveness.MARKER}")]


@dataclass
class Pod:
    name: str
    watch: subprocess.Popen[bytes]
    program: subprocess.Popen[bytes]

    def stopped_by_liveness(self) -> bool:
        return self.program.poll() == -signal.SIGKILL


@pytest.fixture
def pods(etcd: EtcdServer, client: kvstore.KeyStore, tmp_path: Path) -> Iterator[dict[str, Pod]]:
    made: dict[str, Pod] = {}
    try:  # a setup that times out must not leave the pods running
        for rank, name in enumerate(("pod-a", "pod-b", "pod-c")):
            log = tmp_path / f"{name}.attempts"
            err = (tmp_path / f"{name}.log").open("wb")
            watch = subprocess.Popen(
                [str(PYTHON), str(POD_SCRIPT), str(log)], env=pod_env(etcd, name), stderr=err
            )
            program = sleeper({"MASTER_ADDR": MASTER[0], "MASTER_PORT": MASTER[1]})
            log.write_text(
                f"{ATTEMPT_PREFIX}run_id={JOB} restart=0 group_rank={rank} nodes=3 world_size=3 "
                f"pid={program.pid}\n"
            )
            made[name] = Pod(name, watch, program)
        wait_until("the three members' keys", lambda: members(client) == [liveness.ALIVE] * 3, 20)
        yield made
    finally:
        for pod in made.values():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pod.watch.pid, signal.SIGCONT)
            for proc in (pod.watch, pod.program):
                proc.kill()
                proc.wait()


@pytest.mark.slow
def test_a_frozen_member_stops_the_others_training_within_the_ttl_and_itself_on_return(
    pods: dict[str, Pod],
) -> None:
    frozen = time.monotonic()
    os.kill(pods["pod-b"].watch.pid, signal.SIGSTOP)
    survivors = [pods["pod-a"], pods["pod-c"]]
    wait_until(
        "the survivors' training processes to be SIGKILLed",
        lambda: all(p.stopped_by_liveness() for p in survivors),
        timings.ROUND_KEY_TTL + 4,
        every=0.05,
    )
    seen = time.monotonic() - frozen
    # Not before the key could lapse: it is the lapse, not something else, that acted.
    assert seen >= timings.ROUND_KEY_TTL - timings.ROUND_KEY_REFRESH - 0.5, seen
    assert pods["pod-b"].program.poll() is None  # frozen: nothing on pod-b acts
    os.kill(pods["pod-b"].watch.pid, signal.SIGCONT)
    # Back, pod-b finds its own key lapsed and leaves its dead collective too.
    wait_until("pod-b's own training process to stop", pods["pod-b"].stopped_by_liveness, 5)


@pytest.mark.slow
def test_a_round_name_kept_by_a_re_form_stops_nobody_for_a_member_of_the_round_before(
    pods: dict[str, Pod],
) -> None:
    """etcd-lease re-forms without a dead node under the same master address and port while
    rank 0 stays: the dead node's key lapses in the round of two, whose members all renew
    theirs (nothing is stopped); a member of the round of two that goes silent is a loss."""
    again = {}
    for rank, name in enumerate(("pod-a", "pod-c")):
        again[name] = sleeper({"MASTER_ADDR": MASTER[0], "MASTER_PORT": MASTER[1]})
        attempts = Path(pods[name].watch.args[2])  # type: ignore[index]
        with attempts.open("a") as log:
            log.write(
                f"{ATTEMPT_PREFIX}run_id={JOB} restart=0 group_rank={rank} nodes=2 world_size=2 "
                f"pid={again[name].pid}\n"
            )
    try:
        time.sleep(timings.ROUND_POLL * 3)  # both read their new attempt
        os.kill(pods["pod-b"].watch.pid, signal.SIGSTOP)  # its key lapses: the round before's
        time.sleep(timings.ROUND_KEY_TTL + 3)
        assert again["pod-a"].poll() is None and again["pod-c"].poll() is None
        os.kill(pods["pod-c"].watch.pid, signal.SIGSTOP)  # one of the two
        wait_until(
            "pod-a's training process to be SIGKILLed",
            lambda: again["pod-a"].poll() == -signal.SIGKILL,
            timings.ROUND_KEY_TTL + 4,
            every=0.05,
        )
    finally:
        for proc in again.values():
            proc.kill()
            proc.wait()


@pytest.mark.slow
def test_healthy_members_and_a_clean_leave_stop_nothing(
    pods: dict[str, Pod], client: kvstore.KeyStore
) -> None:
    time.sleep(timings.ROUND_KEY_TTL * 2)
    assert all(p.program.poll() is None for p in pods.values())
    # pod-b's attempt ends by itself, then its worker exits: both are clean leaves.
    pods["pod-b"].program.terminate()
    pods["pod-b"].program.wait()
    key = f"/elastic-job/{JOB}/rounds/{ROUND}/pod-b"
    wait_until("pod-b's key to say left", lambda: client.get_value(key) == liveness.LEFT, 5)
    pods["pod-c"].watch.terminate()
    pods["pod-c"].watch.wait(10)
    wait_until(
        "pod-c's key to say left",
        lambda: client.get_value(key.replace("pod-b", "pod-c")) == liveness.LEFT,
        5,
    )
    time.sleep(timings.ROUND_KEY_TTL + 2)
    assert pods["pod-a"].program.poll() is None
    assert pods["pod-c"].program.poll() is None


@pytest.mark.slow
def test_a_lapse_after_the_job_completed_stops_nothing(
    pods: dict[str, Pod], etcd: EtcdServer, client: kvstore.KeyStore
) -> None:
    cfg = config.load(["train.py"], pod_env(etcd, "pod-a"))
    completion.mark_complete(client, cfg)
    os.kill(pods["pod-b"].watch.pid, signal.SIGSTOP)
    time.sleep(timings.ROUND_KEY_TTL + 3)
    assert pods["pod-a"].program.poll() is None
    assert pods["pod-c"].program.poll() is None


def test_unfinished_is_the_members_of_the_last_round_whose_attempt_still_runs(
    pods: dict[str, Pod], etcd: EtcdServer, client: kvstore.KeyStore, tmp_path: Path
) -> None:
    """Whom a node that finished waits for in torch's exit barrier (launch/supervisor.py,
    ExitBarrier): the other members of its round whose key still says alive; still known
    once its own attempt has ended (that is when it is asked)."""
    cfg = config.load(["train.py"], pod_env(etcd, "pod-a"))
    loss = NodeLoss(cfg, Completion(client, cfg), torchrun_pid=lambda: None)
    detector = liveness.LossDetector(client, cfg, tmp_path / "pod-a.attempts", listener=loss)
    assert detector.unfinished() is None  # in no round yet
    detector.refresh_once()
    assert detector.unfinished() == ["pod-b", "pod-c"]
    pods["pod-b"].program.terminate()
    pods["pod-b"].program.wait()
    wait_until("pod-b finished", lambda: detector.unfinished() == ["pod-c"], 5)
    pods["pod-a"].program.terminate()
    pods["pod-a"].program.wait()
    detector.refresh_once()  # this pod's attempt ended: its key says left
    assert detector.unfinished() == ["pod-c"]


def _wipe(etcd: EtcdServer, prefix: str) -> None:
    """Delete every key under `prefix` directly, with the API the backend uses."""
    if etcd.v2:
        req = urllib.request.Request(
            f"{etcd.url}/v2/keys{prefix.rstrip('/')}?recursive=true", method="DELETE"
        )
    else:
        raw = prefix.encode()
        end = raw[:-1] + bytes([raw[-1] + 1])
        body = {"key": base64.b64encode(raw).decode(), "range_end": base64.b64encode(end).decode()}
        req = urllib.request.Request(f"{etcd.url}/v3/kv/deleterange", json.dumps(body).encode())
    urllib.request.urlopen(req, timeout=5).close()


@pytest.mark.slow
def test_etcd_losing_its_data_stops_nothing_and_the_keys_come_back(
    pods: dict[str, Pod], etcd: EtcdServer, client: kvstore.KeyStore
) -> None:
    # What a new etcd pod with an empty data directory looks like to the members: every
    # key of the round gone at once (no member is the one cut off).
    _wipe(etcd, f"/elastic-job/{JOB}/")
    wait_until("the three keys again", lambda: members(client) == [liveness.ALIVE] * 3, 5)
    time.sleep(timings.ROUND_KEY_TTL + 2)
    assert all(p.program.poll() is None for p in pods.values())


def test_the_round_is_the_run_id_and_torchs_master_address_of_the_program() -> None:
    with sleeper({"MASTER_ADDR": "10.1.2.3", "MASTER_PORT": "4242"}) as program:
        try:
            assert liveness.round_of("job-r1", program.pid) == "job-r1@10.1.2.3:4242"
        finally:
            program.kill()
    with sleeper({}) as program:
        try:
            assert liveness.round_of("job", program.pid) is None
        finally:
            program.kill()


# A training process that keeps snapshots (packages/elastic-snapshot): on SIGTERM it says
# `saved=` in the progress file and, like a main thread blocked in a dead collective, does
# not exit (BLOCKED), or exits at once as the library does by default (EXITS).
BLOCKED = (
    "import signal, sys, time\n"
    "def saved(*_):\n"
    "    open(sys.argv[1], 'a').write('saved=5 files=1 seconds=0.01\\n')\n"
    "signal.signal(signal.SIGTERM, saved)\n"
    "print('ready', flush=True)\n"
    "time.sleep(600)\n"
)
EXITS = (
    "import os, signal, sys, time\n"
    "def saved(*_):\n"
    "    open(sys.argv[1], 'a').write('saved=5 files=1 seconds=0.01\\n')\n"
    "    os._exit(143)\n"
    "signal.signal(signal.SIGTERM, saved)\n"
    "print('ready', flush=True)\n"
    "time.sleep(600)\n"
)


@pytest.mark.parametrize("backend", ["etcd-v2"])
@pytest.mark.slow
def test_a_script_that_keeps_snapshots_is_stopped_with_sigterm_and_killed_once_saved(
    etcd: EtcdServer, client: kvstore.KeyStore, tmp_path: Path
) -> None:
    """On a silent loss the survivors' training processes get SIGTERM when their script
    said it keeps snapshots (a `restored=` line), so that they save their last step; one
    that said `saved=` but is still blocked is SIGKILLed then, one that exits by itself is
    not killed. A script that keeps none is SIGKILLed at once (the test above)."""
    made: list[subprocess.Popen[bytes]] = []
    programs: dict[str, subprocess.Popen[bytes]] = {}
    try:
        for rank, name in enumerate(("pod-a", "pod-b", "pod-c")):
            log, progress = tmp_path / f"{name}.attempts", tmp_path / f"{name}.progress"
            progress.write_text("restored=0 source=none lost=-\n")
            err = (tmp_path / f"{name}.log").open("wb")
            made.append(
                subprocess.Popen(
                    [str(PYTHON), str(POD_SCRIPT), str(log), str(progress)],
                    env=pod_env(etcd, name),
                    stderr=err,
                )
            )
            code = EXITS if name == "pod-c" else BLOCKED
            program = subprocess.Popen(
                [str(PYTHON), "-c", code, str(progress)],
                env={
                    "PATH": os.environ["PATH"],
                    "MASTER_ADDR": MASTER[0],
                    "MASTER_PORT": MASTER[1],
                },
                stdout=subprocess.PIPE,
            )
            assert program.stdout is not None and program.stdout.readline() == b"ready\n"
            programs[name] = program
            made.append(program)
            log.write_text(
                f"{ATTEMPT_PREFIX}run_id={JOB} restart=0 group_rank={rank} nodes=3 world_size=3 "
                f"pid={program.pid}\n"
            )
        wait_until("the three members' keys", lambda: members(client) == [liveness.ALIVE] * 3, 20)
        os.kill(made[2].pid, signal.SIGSTOP)  # pod-b's liveness frozen: its key lapses
        wait_until(
            "pod-a's and pod-c's programs to end",
            lambda: programs["pod-a"].poll() is not None and programs["pod-c"].poll() is not None,
            timings.ROUND_KEY_TTL + 8,
            every=0.05,
        )
        assert programs["pod-a"].returncode == -signal.SIGKILL  # saved, then killed
        assert programs["pod-c"].returncode == 143  # saved and exited: not killed
        for name in ("pod-a", "pod-c"):
            assert "saved=5" in (tmp_path / f"{name}.progress").read_text()
        assert "saved its state" in (tmp_path / "pod-a.log").read_text()
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(made[2].pid, signal.SIGCONT)
        for proc in made:
            proc.kill()
            proc.wait()
