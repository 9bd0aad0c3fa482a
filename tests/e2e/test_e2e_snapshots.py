"""A user's own training script that keeps snapshots, through the chart in the local run
(issue 21): tests/e2e/user_script/snap_train.py, FSDP2 across the three pods, adopts
packages/elastic-snapshot in a few lines and prints nothing of elastic-job's. Each lost pod
costs the survivors at most one step: they resume at the step before the fault (or the one
before it, when the fault cut the ring's last exchange), from memory (the lost pod's shard
from its successor's), with exactly the state of that step; a pod and the next
one lost together fall back to the checkpoint and say so.

The script prints no `[train]` line, so the faults fire at seconds after the start (the
first round of three trains by then, and 40 s leave each lost pod the time to rejoin
before the next fault); each scenario checks what it relies on.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import pytest
from localrun_e2e import (
    LocalRun,
    assert_cleaned_up,
    in_order,
    pod,
    reform,
    root_with_namespaces,
    run_user_script,
)

pytestmark = [
    pytest.mark.netns,
    pytest.mark.slow,
    pytest.mark.skipif(bool(root_with_namespaces()), reason=root_with_namespaces() or "ok"),
]

STEP = re.compile(r"^\[snap\] step=(\d+) rank=(\d+) world=(\d+) digest=(\S+)$", re.M)
START = re.compile(
    r"^\[snap\] start step=(\d+) source=(\S+) lost=(\S+) rank=(\d+) world=(\d+) digest=(\S+)$"
)


def epochs_command(epochs: int, every: int) -> list[str]:
    """user_script/epoch_snapshots.py: DDP whose step is an epoch (6-8 optimizer steps of
    0.3 s), its own checkpoint every `every` epochs."""
    return [
        "python", "/opt/user-script/epoch_snapshots.py", str(epochs), str(every),
        "--checkpoint-path", "/checkpoints/epochs.pt", "--batch-seconds", "0.3",
    ]  # fmt: skip


def snap_command(steps: int, every: int) -> list[str]:
    return [
        "python", "/opt/user-script/snap_train.py", "--fsdp", "--steps", str(steps),
        "--checkpoint-every", str(every), "--step-seconds", "0.3",
        "--checkpoint-dir", "/checkpoints/snap",
    ]  # fmt: skip


@dataclass(frozen=True)
class Start:
    step: int
    source: str
    world: int
    digest: float
    last: int | None  # the last step this pod printed before it (its previous round's)


def starts(run: LocalRun, n: int) -> list[Start]:
    """Each start line of pod n's script, with the last step its previous process printed
    (a pod's log holds its container restarts in order)."""
    out: list[Start] = []
    last: int | None = None
    for line in run.log(pod(n)).splitlines():
        if m := STEP.match(line):
            last = int(m[1])
        elif m := START.match(line):
            out.append(Start(int(m[1]), m[2], int(m[5]), float(m[6]), last))
    return out


def step_digests(run: LocalRun, step: int, world: int) -> dict[int, float]:
    """rank -> its digest of `step` in a round of `world` (each step is done once at a
    world size: a restore from memory never goes back)."""
    return {
        int(m[2]): float(m[4])
        for n in range(3)
        for m in STEP.finditer(run.log(pod(n)))
        if (int(m[1]), int(m[3])) == (step, world)
    }


def resumed_at(run: LocalRun, step: int, world: int) -> list[tuple[int, Start]]:
    """The pods whose script started a round of `world` at `step`."""
    return [(n, s) for n in range(3) for s in starts(run, n) if (s.step, s.world) == (step, world)]


def test_each_loss_resumes_at_the_step_before_it_from_a_peers_memory(tmp_path: Path) -> None:
    """pod 1 SIGKILLed, then pod 2's link cut (a silent loss), then pod 0 reclaimed
    (SIGTERM, deleted and made again): each time the two others train again at the step
    they had completed, with the lost pod's shard from its successor's memory, resharded
    from three to two; the pod rejoins at the next re-form."""
    run = run_user_script(
        tmp_path,
        f"--kill={pod(1)}@45:8",
        f"--partition={pod(2)}@85:10",
        f"--preempt={pod(0)}@125:8",
        command=snap_command(480, 50),
        timeout=420,
    )
    s = run.summary
    assert run.rc == 0, run.describe()
    assert s["completed"] is True, run.describe()
    assert in_order(s["world_sizes"], [3, 2, 3, 2, 3, 2, 3]), run.describe()
    for cause, lost in (("kill", 1), ("partition", 2), ("preempt", 0)):
        r = reform(run, f"{cause} {pod(lost)}")
        assert r["world_size"] == 2, (r, run.timeline("[snap] start", "restored"))
        assert r["state_from"] == "peer-memory", r
        # At most one: the ring replica of the lost pod's shard is of the last step, or of
        # the one before when the loss cut its exchange (a cut link did, under load).
        assert r["steps_lost"] <= 1, r
        step = r["resumed_step"]
        survivors = resumed_at(run, step, 2)
        assert sorted(n for n, _ in survivors) == sorted({0, 1, 2} - {lost}), (r, survivors)
        for _, start in survivors:
            # The step before the fault (the last one the pod completed), or the one before.
            assert start.last is not None and 0 <= start.last - step <= 1, (cause, start)
        # Exactly the state of that step: the new shards' digests add up to the old ones'.
        old = step_digests(run, step, 3)
        assert sorted(old) == [0, 1, 2], (cause, step, old)
        assert sum(st.digest for _, st in survivors) == pytest.approx(
            sum(old.values()), rel=1e-12
        ), (cause, step)
    said = run.timeline("state restored at step")
    assert "from peer-memory" in said, said
    assert_cleaned_up(run)


EPOCH = re.compile(r"^\[train\] step=(\d+) world_size=(\d+) digest=(\S+)$")
RESUMED = re.compile(r"^\[train\] resumed step=(\d+) source=(\S+) digest=(\S+)$")


@dataclass(frozen=True)
class Resumed:
    epoch: int
    digest: str
    last: tuple[int, int, str] | None  # the epoch, world size and digest printed before it


def epoch_resumes(run: LocalRun, n: int) -> list[Resumed]:
    """pod n's resumed lines, each with the last epoch line its pod printed before it."""
    out = []
    last: tuple[int, int, str] | None = None
    for line in run.log(pod(n)).splitlines():
        if m := EPOCH.match(line):
            last = (int(m[1]), int(m[2]), m[3])
        elif m := RESUMED.match(line):
            out.append(Resumed(int(m[1]), m[3], last))
    return out


def assert_resumed_at_the_newest_epoch(survivors: list[Resumed], world: int, said: str) -> None:
    """The survivors of a round of `world` resumed together, straight after it (no epoch
    line of another round in between: not from scratch), at the newest epoch any of them
    completed, with exactly its state."""
    lasts = [r.last for r in survivors]
    assert all(last is not None and last[1] == world for last in lasts), (survivors, said)
    newest = max(last[0] for last in lasts if last is not None)
    assert {r.epoch for r in survivors} == {newest}, (survivors, said)
    digests = {last[2] for last in lasts if last is not None and last[0] == newest}
    assert {r.digest for r in survivors} == digests, (survivors, said)


def test_a_script_whose_step_is_an_epoch_loses_only_the_epoch_in_progress(tmp_path: Path) -> None:
    """user_script/epoch_snapshots.py, pytorch/examples' DDP tutorial adopting the library in
    the README's lines with `step_done` once per epoch (6 optimizer steps at three pods),
    its own checkpoint every 20 epochs: pod 1 SIGKILLed during epoch 5, back 10 s later.
    The survivors resume from memory at the last epoch completed, with exactly its state
    (only the epoch in progress is redone; the checkpoint holds nothing before epoch 20);
    when pod 1 rejoins, torchrun stops the two mid-epoch and they save at once: that round
    resumes from memory too. The script was told at its first epoch's end."""
    run = run_user_script(
        tmp_path, f"--kill={pod(1)}@step=4:10", command=epochs_command(26, 20), timeout=240
    )
    s = run.summary
    assert run.rc == 0, run.describe()
    assert s["completed"] is True, run.describe()
    assert in_order(s["world_sizes"], [3, 2, 3]), run.describe()
    said = run.timeline("[train] resumed", "restored", "came after", "not saving")
    resumes = {n: epoch_resumes(run, n) for n in range(3)}
    assert len(resumes[0]) == len(resumes[2]) == 2 and len(resumes[1]) == 1, (resumes, said)
    assert_resumed_at_the_newest_epoch([resumes[0][0], resumes[2][0]], 3, said)
    assert_resumed_at_the_newest_epoch([resumes[0][1], resumes[2][1]], 2, said)
    assert resumes[1][0].epoch == resumes[0][1].epoch, (resumes, said)
    for cause in (f"kill {pod(1)}", "world size 2 -> 3"):
        r = reform(run, cause)
        assert r["state_from"] in ("local-memory", "peer-memory"), (r, said)
        assert r["steps_lost"] == 0, (r, said)
    assert s["checkpoint_steps"] == [20], run.describe()
    assert "not saving the live state" not in said, said
    assert re.search(r"step 1 came after 6 optimizer steps: from now on", run.log(pod(0))), said
    assert_cleaned_up(run)


# CI's budget: the torchrun-level test covers the fallback (tests/snapshot/test_snapshot_elastic.py,
# test_two_adjacent_nodes_lost_fall_back_to_the_checkpoint); this is its run through the chart.
@pytest.mark.extended
def test_two_adjacent_pods_lost_fall_back_to_the_checkpoint_and_say_so(tmp_path: Path) -> None:
    """pods 1 and 2 SIGKILLed together (with three pods in the ring, any two are
    neighbours): pod 1's shard and its only replica are gone, so pod 0 trains on alone
    (job.minNodes=1) from the checkpoint and says why in one line."""
    run = run_user_script(
        tmp_path,
        f"--kill={pod(1)}@45:15",
        f"--kill={pod(2)}@45:15",
        command=snap_command(180, 10),
        sets=["job.minNodes=1"],
        timeout=360,
    )
    s = run.summary
    assert run.rc == 0, run.describe()
    assert s["completed"] is True, run.describe()
    r = reform(run, f"kill {pod(1)}")
    assert r["world_size"] == 1, (r, run.describe())
    assert r["state_from"] == "checkpoint", r
    assert r["resumed_step"] % 10 == 0, r
    log0 = run.log(pod(0))
    assert re.search(
        r"not from memory: step \d+ \(world 3\): the shards of ranks \d are held by nobody",
        log0,
    ), log0[-3000:]
    assert_cleaned_up(run)
