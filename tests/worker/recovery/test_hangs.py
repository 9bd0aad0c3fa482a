"""Hang detection (recovery/hangs.py, rankprobe.py): the bound that follows the job, the
culprit each kind of hang leaves, and the watch of two pods against a real etcd with the
ranks of a real gloo job, one of which hangs while its process lives.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from elastic_worker import rankprobe
from elastic_worker.keystore import interface as kvstore
from elastic_worker.recovery import hangs
from elastic_worker.recovery.lossdetect import ALIVE, LEFT, RoundAttempt

from worker.worker_helpers import PYTHON, keystore_fixtures, wait_until

JOB = "hang42"
RANK_SCRIPT = Path(__file__).with_name("hang_rank.py")
BOUND = hangs.Bound(multiple=20, floor=30, first_step=1200)

backend, etcd, client = keystore_fixtures(JOB)


def state(
    rank: int, *, steps: int = 7, stack: str = "a", collective: bool = True, moving: bool = False
) -> hangs.RankState:
    return hangs.RankState(rank, f"pod-{rank}", steps, stack, stack, collective, moving)


# -- the bound ------------------------------------------------------------------------------


def test_before_the_second_step_the_bound_is_the_first_step_allowance() -> None:
    clock = hangs.Clock(now=0.0)
    assert clock.stalled(1000.0, BOUND) is None
    assert clock.stalled(1201.0, BOUND) == 1201.0
    clock.observe({"rank 0": 1}, now=600.0)  # a 10-minute first step: still no step time
    assert clock.step_time() is None
    assert clock.stalled(1700.0, BOUND) is None


def test_the_bound_is_a_multiple_of_the_recent_step_time_above_the_floor() -> None:
    clock = hangs.Clock(now=0.0)
    for i in range(1, 12):
        clock.observe({"rank 0": i}, now=10.0 * i)  # 10 s steps
    assert clock.step_time() == 10.0
    assert clock.stalled(110.0 + 199.0, BOUND) is None
    assert clock.stalled(110.0 + 201.0, BOUND) == pytest.approx(201.0)
    fast = hangs.Clock(now=0.0)
    for i in range(1, 12):
        fast.observe({"rank 0": i}, now=0.5 * i)  # 0.5 s steps: the floor holds
    assert fast.stalled(5.5 + 29.0, BOUND) is None
    assert fast.stalled(5.5 + 31.0, BOUND) is not None


def test_one_slow_step_does_not_move_the_bound_much() -> None:
    clock = hangs.Clock(now=0.0)
    t = 0.0
    for i in range(1, 12):
        t += 100.0 if i == 6 else 10.0
        clock.observe({"rank 0": i}, now=t)
    assert clock.step_time() == 10.0


def test_steps_shorter_than_a_poll_are_counted_each() -> None:
    """Four steps seen in one 0.5 s poll are steps of 0.125 s, not one of 0.5 s."""
    clock = hangs.Clock(now=0.0)
    for i in range(1, 12):
        clock.observe({"rank 0": 4 * i}, now=0.5 * i)
    assert clock.step_time() == 0.125


def test_files_that_appear_with_nothing_stepped_are_no_step() -> None:
    clock = hangs.Clock(now=0.0)
    assert not clock.observe({"rank 0": 0, "rank 1": 0}, now=1.0)
    assert clock.observe({"rank 0": 1, "rank 1": 0}, now=2.0)
    assert not clock.observe({"rank 0": 1, "rank 1": 0, "rank 2": 0}, now=3.0)
    assert clock.observe({"step=": 1}, now=4.0)  # the script's first `step=0`


def test_a_judgement_waits_one_more_bound() -> None:
    clock = hangs.Clock(now=0.0)
    assert clock.stalled(1201.0, BOUND) is not None
    clock.judged(1201.0)
    assert clock.stalled(2000.0, BOUND) is None
    assert clock.stalled(2402.0, BOUND) == 2402.0


def idle_watch(
    client: kvstore.KeyStore, tmp_path: Path, attempt: list[RoundAttempt | None]
) -> tuple[hangs.HangWatch, Heard]:
    heard = Heard()
    watch = hangs.HangWatch(
        client,
        f"/elastic-job/{JOB}",
        "pod-0",
        bound=BOUND,
        probe_dir=tmp_path,
        current=lambda: attempt[0],
        listener=heard,
    )
    return watch, heard


def test_a_new_attempt_gets_the_first_step_allowance_again(
    client: kvstore.KeyStore, tmp_path: Path
) -> None:
    """A re-form (or a relaunch) starts new training processes: compilation and the first
    data again, so the bound starts over."""
    attempt: list[RoundAttempt | None] = [RoundAttempt("r@a:1", 1)]
    watch, heard = idle_watch(client, tmp_path, attempt)
    watch.check(0.0)
    watch.check(900.0)
    attempt[0] = RoundAttempt("r@a:2", 2)
    watch.check(950.0)
    watch.check(1900.0)  # 1900 s after the first attempt began, 950 after this one
    assert watch._checks == 0 and heard.verdicts == []


def test_no_attempt_no_judgement(client: kvstore.KeyStore, tmp_path: Path) -> None:
    """Below minNodes, or between two rounds, no training process runs: nothing to judge."""
    watch, heard = idle_watch(client, tmp_path, [None])
    watch.check(0.0)
    watch.check(10_000.0)
    assert watch._checks == 0 and heard.verdicts == []


def test_a_late_pod_names_the_culprit_whose_pod_already_left_the_round(
    client: kvstore.KeyStore, tmp_path: Path
) -> None:
    """The culprit's pod reached the verdict first, stopped its processes and left the round
    (its key says `left`): a pod that judges after that names the same culprit from the same
    reports, and does not take the two ranks left, waiting at one place, for a hung round."""
    round_ = "r@a:7"
    rounds, reports = f"/elastic-job/{JOB}/rounds/{round_}", f"/elastic-job/{JOB}/hangs/{round_}"
    client.set(f"{rounds}/pod-0", ALIVE)
    client.set(f"{rounds}/pod-1", LEFT)
    client.set(f"{rounds}/pod-2", ALIVE)
    client.set(f"{rounds}/pod-3", LEFT)  # left earlier, without a report: not judged
    for culprit in (state(1, stack="b", collective=False), state(2)):
        body = {"check": 1, "ranks": [dataclasses.asdict(culprit)]}
        client.set(f"{reports}/{culprit.pod}", json.dumps(body))
    watch, _ = idle_watch(client, tmp_path, [None])
    verdict = watch.agree(RoundAttempt(round_, 1), [state(0)])
    assert verdict is not None and [r.rank for r in verdict.culprits] == [1], verdict
    assert "outside any collective while 2 rank(s)" in verdict.why


# -- the culprit ----------------------------------------------------------------------------


def test_a_moving_rank_means_no_hang() -> None:
    assert hangs.blame([state(0), state(1, collective=False, moving=True)]) is None


def test_a_rank_behind_the_others_step_holds_the_round() -> None:
    verdict = hangs.blame([state(0, steps=8), state(1, steps=7), state(2, steps=8)])
    assert verdict is not None and [r.rank for r in verdict.culprits] == [1]
    assert "behind" in verdict.why


def test_a_rank_outside_any_collective_while_the_others_wait_in_one() -> None:
    verdict = hangs.blame([state(0), state(1, stack="b", collective=False), state(2)])
    assert verdict is not None and [r.rank for r in verdict.culprits] == [1]
    assert "outside any collective" in verdict.why


def test_a_rank_in_a_collective_the_others_are_not_in() -> None:
    verdict = hangs.blame([state(0), state(1, stack="side"), state(2)])
    assert verdict is not None and [r.rank for r in verdict.culprits] == [1]
    assert "inside a collective" in verdict.why


def test_ranks_all_waiting_at_one_place_restart_the_round() -> None:
    verdict = hangs.blame([state(0), state(1), state(2)])
    assert verdict is not None and verdict.culprits == ()
    tie = hangs.blame([state(0, stack="a"), state(1, stack="b")])
    assert tie is not None and tie.culprits == ()


def test_where_a_warm_childs_rank_waits_names_the_users_script() -> None:
    """Under a warm child the server's frames are outermost: the script's are named."""
    frames = [
        hangs.Frame("/usr/lib/python3.11/threading.py", 327, "wait"),
        hangs.Frame("/opt/user-script/train.py", 40, "before_step"),
        hangs.Frame("/opt/user-script/train.py", 90, "<module>"),
        hangs.Frame("<frozen runpy>", 88, "_run_code"),
        hangs.Frame("/x/elastic_worker/warm/child.py", 47, "_run"),
        hangs.Frame("/x/elastic_worker/warm/server.py", 294, "_become_child"),
        hangs.Frame("/x/elastic_worker/warm/server.py", 400, "<module>"),
    ]
    assert (
        hangs.describe(frames)
        == "in wait (threading.py:327), called from train.py:40 in before_step"
    )


# -- stacks from a real process -------------------------------------------------------------


@pytest.fixture
def probe_dir(tmp_path: Path) -> Path:
    d = tmp_path / "probe"
    d.mkdir()
    return d


def test_the_probe_counts_optimizer_steps_and_dumps_stacks_on_its_signal(probe_dir: Path) -> None:
    script = (
        "import os, threading, torch\n"
        "from elastic_worker import rankprobe\n"
        "assert rankprobe.install(os.environ)\n"
        "m = torch.nn.Linear(2, 1); opt = torch.optim.Adam(m.parameters())\n"
        "for _ in range(3):\n"
        "    opt.zero_grad(); m(torch.ones(1, 2)).sum().backward(); opt.step()\n"
        "print('stepped', flush=True)\n"
        "threading.Event().wait()\n"
    )
    env = {**os.environ, rankprobe.PROBE_DIR_ENV: str(probe_dir), "RANK": "5", "LOCAL_RANK": "1"}
    proc = subprocess.Popen([str(PYTHON), "-c", script], env=env, stdout=subprocess.PIPE)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == b"stepped\n"
        [probe] = rankprobe.read(probe_dir)
        assert (probe.local_rank, probe.rank, probe.pid, probe.steps) == (1, 5, proc.pid, 3)
        watch = hangs.HangWatch.__new__(hangs.HangWatch)
        watch.probe_dir = probe_dir
        # The script may not be in its wait yet, just after the print (a loaded machine)
        deadline = time.monotonic() + 20
        while not ((frames := watch._dump([probe])[1]) and frames[0].func == "wait"):
            if time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert frames and frames[-1].func == "<module>" and frames[0].func == "wait", frames
        assert not hangs.in_collective(frames)
        assert proc.poll() is None  # the dump did not stop it
        assert not (probe_dir / "ended-1").exists()  # its script still runs
    finally:
        proc.kill()
        proc.wait()


def test_a_script_that_returned_is_not_judged(client: kvstore.KeyStore, tmp_path: Path) -> None:
    """After its script returns, a process's teardown and torch's exit barrier take time
    with no step: the warm child says the script ended (rankprobe.ended), and the watch
    judges nothing of that attempt."""
    proc = subprocess.Popen(["sleep", "600"])
    try:
        line = f"pid={proc.pid} rank=0 thread=1 steps=5\n"
        (tmp_path / "rank-0").write_text(line)
        (tmp_path / "ended-0").touch()
        watch, heard = idle_watch(client, tmp_path, [RoundAttempt("r@a:1", proc.pid)])
        watch.check(0.0)
        watch.check(5000.0)
        assert watch._checks == 0 and heard.verdicts == []
        assert proc.poll() is None  # never sent a signal
    finally:
        proc.kill()
        proc.wait()


def test_what_a_ranks_children_read_counts_as_moving(tmp_path: Path) -> None:
    """A data loader's workers read while the rank waits on their queue: the rank moves."""
    script = (
        "import subprocess, sys, time\n"
        "child = subprocess.Popen([sys.executable, '-c', "
        "'import os, sys, time\\nfd = os.open(sys.executable, 0)\\n"
        "while True: os.pread(fd, 1 << 16, 0); time.sleep(0.001)'])\n"
        "time.sleep(600)\n"
    )
    proc = subprocess.Popen([str(PYTHON), "-c", script])
    try:
        time.sleep(1.0)
        before = hangs._io_bytes(proc.pid)
        time.sleep(1.0)
        assert hangs._io_bytes(proc.pid) - before > hangs.MOVING_BYTES
    finally:
        for child in Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(child), 9)
        proc.kill()
        proc.wait()


def test_without_a_probe_directory_nothing_is_installed() -> None:
    assert not rankprobe.install({"RANK": "0", "LOCAL_RANK": "0"})


# -- two pods of a real gloo job ------------------------------------------------------------


class Heard:
    def __init__(self) -> None:
        self.verdicts: list[hangs.Verdict] = []

    def held(self) -> bool:
        return False

    def hung(self, attempt: RoundAttempt, verdict: hangs.Verdict, idle: float) -> None:
        self.verdicts.append(verdict)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def pods(
    client: kvstore.KeyStore, tmp_path: Path, how: str, n: int = 2
) -> Iterator[tuple[list[hangs.HangWatch], list[Heard]]]:
    """`n` pods of one rank each in a gloo job whose rank 1 hangs at step 12 as `how` says,
    each watched by a HangWatch of its own; the round's members alive in etcd."""
    port, round_ = free_port(), "hang42@127.0.0.1:0"
    procs, watches, heard = [], [], []
    for rank in range(n):
        probe = tmp_path / f"probe-{rank}"
        probe.mkdir()
        env = {
            **os.environ,
            rankprobe.PROBE_DIR_ENV: str(probe),
            "RANK": str(rank),
            "LOCAL_RANK": "0",
            "WORLD_SIZE": str(n),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "GLOO_SOCKET_IFNAME": "lo",
            "HANG_AT": "12",
            "HANG_RANK": "1",
            "HANG_HOW": how,
            "HANG_FILE": str(tmp_path / "checkpoint"),
        }
        proc = subprocess.Popen([str(PYTHON), str(RANK_SCRIPT)], env=env)
        procs.append(proc)
        pod = f"pod-{rank}"
        client.set(f"/elastic-job/{JOB}/rounds/{round_}/{pod}", ALIVE)
        attempt = RoundAttempt(round_, proc.pid)
        listener = Heard()
        watches.append(
            hangs.HangWatch(
                client,
                f"/elastic-job/{JOB}",
                pod,
                bound=hangs.Bound(multiple=2, floor=2.0, first_step=60.0),
                probe_dir=probe,
                current=lambda attempt=attempt: attempt,
                listener=listener,
                agree_for=10.0,
            ).start()
        )
        heard.append(listener)
    try:
        yield watches, heard
    finally:
        for watch in watches:
            watch.stop()
        for proc in procs:
            proc.kill()
            proc.wait()


@pytest.mark.slow
@pytest.mark.parametrize(
    ("how", "n", "culprits", "why"),
    [
        ("outside", 2, [1], "outside any collective"),
        ("side", 3, [1], "inside a collective"),
        ("side", 2, [], "no single rank"),
    ],
    ids=["outside-a-collective", "in-a-collective-of-its-own", "two-ranks-in-two-collectives"],
)
def test_every_pod_names_the_hung_rank(
    client: kvstore.KeyStore, tmp_path: Path, *, how: str, n: int, culprits: list[int], why: str
) -> None:
    """Rank 1 blocks outside any collective (the others wait in their all_reduce), or in an
    all_reduce nobody else enters: every pod reaches the same verdict. Two ranks in two
    collectives cannot say which is odd: the round restarts."""
    with pods(client, tmp_path, how, n) as (_, heard):
        wait_until("every pod's verdict", lambda: all(h.verdicts for h in heard), 40, 0.2)
    for listener in heard:
        verdict = listener.verdicts[0]
        assert [r.rank for r in verdict.culprits] == culprits, verdict
        assert why in verdict.why
        assert all(r.where for r in verdict.culprits)  # named where it waits


@pytest.mark.slow
def test_a_rank_that_keeps_writing_is_not_hung(client: kvstore.KeyStore, tmp_path: Path) -> None:
    """Rank 1 writes a long checkpoint (rank 0 waits in its all_reduce): judged, no verdict."""
    with pods(client, tmp_path, "io") as (watches, heard):
        wait_until("a judgement", lambda: all(w._checks > 0 for w in watches), 40, 0.2)
        time.sleep(2 * 1.0 + 1)  # the judgement's dumps
        assert [h.verdicts for h in heard] == [[], []]
