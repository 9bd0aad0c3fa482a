"""recovery/policy.py: the node-loss table, row by row. Each test names its row's signal;
the mechanisms it acts through are stand-ins that record what was asked of them (their own
tests run them for real: test_round.py, test_lossdetect.py, test_fence.py, test_reclaim.py,
lifelines/), and the supervisor and etcd are real where the row needs them."""

from __future__ import annotations

import inspect
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from elastic_worker import completion as completions
from elastic_worker.completion import Completion
from elastic_worker.gate.members import Member
from elastic_worker.keystore import etcdv2
from elastic_worker.keystore import interface as kvstore
from elastic_worker.launch.supervisor import Hooks, Supervisor
from elastic_worker.observe import events
from elastic_worker.recovery import generations, hangs, lossdetect, policy
from elastic_worker.recovery import round as rounds
from elastic_worker.recovery.lifelines.messages import HelperError
from elastic_worker.recovery.lossdetect import RoundAttempt
from elastic_worker.recovery.policy import MAX_REOPENS, MAX_STUCK, RULES, After, NodeLoss
from elastic_worker.settings import config
from testlib import ROOT, EtcdServer, free_port

from localrun.cluster.apiserver import FakeApiServer

BASE = {
    "ELASTIC_JOB_ID": "run42",
    "ELASTIC_RDZV_ENDPOINT": "127.0.0.1:2379",
    "ELASTIC_MIN_NODES": "1",
    "ELASTIC_MAX_NODES": "3",
    "ELASTIC_INJECT_ENV": "/nonexistent",
    "POD_NAME": "run42-worker-1",
    "POD_NAMESPACE": "default",
    "ELASTIC_GRACE_PERIOD": "5",
}
ATTEMPT = RoundAttempt("run42@10.0.0.1:29500", 4242)


@dataclass
class Recorder:
    """events.Recorder's surface: what was recorded."""

    enabled: bool = True
    said: list[tuple[str, str]] = field(default_factory=list)

    def record(self, reason: events.Reason, message: str, *, job: bool = False) -> None:
        self.said.append((reason.name, message))


@dataclass
class Fence:
    """fence.Fence's surface: `holding`, and what `suspect` answers."""

    holding: bool = False
    this_pod: bool = True
    fenced: threading.Event = field(default_factory=threading.Event)
    suspected: list[str] = field(default_factory=list)
    replaced_with: list[str] = field(default_factory=list)

    def suspect(self, why: str) -> bool:
        self.suspected.append(why)
        return self.this_pod

    def replaced(self, uid: str) -> None:
        self.replaced_with.append(uid)
        self.fenced.set()

    def torchrun(self) -> int | None:
        return 77


@dataclass
class Calls:
    """Whatever a stand-in was asked, in order."""

    made: list[tuple[str, tuple[Any, ...]]] = field(default_factory=list)

    def __getattr__(self, name: str) -> Callable[..., Any]:
        if name.startswith("_"):
            raise AttributeError(name)

        def call(*args: Any, **kwargs: Any) -> Any:
            self.made.append((name, (*args, *kwargs.values())))
            return self.answers.get(name)

        return call

    answers: dict[str, Any] = field(default_factory=dict)


def made(calls: Calls) -> list[str]:
    return [name for name, _ in calls.made]


def make(tmp_path: Path | None = None, **env: str) -> NodeLoss:
    cfg = config.load(["train.py"], {**BASE, **env})
    loss = NodeLoss(cfg, Completion(kvstore.connect(cfg), cfg), torchrun_pid=lambda: 77)
    loss.fence = Fence()  # type: ignore[assignment]
    loss.recorder = Recorder()  # type: ignore[assignment]
    loss.detector = Calls()  # type: ignore[assignment]
    loss.detector.ttl = 4  # type: ignore[union-attr]
    loss.reclaimer = Calls()  # type: ignore[assignment]
    return loss


def said(loss: NodeLoss) -> list[str]:
    return [name for name, _ in loss.recorder.said]  # type: ignore[attr-defined]


def complete(monkeypatch: pytest.MonkeyPatch, answer: bool) -> None:
    monkeypatch.setattr(completions, "complete_now", lambda _client, _cfg, within=0.0: answer)


# -- the table itself ----------------------------------------------------------------------


def test_every_row_names_a_method_that_carries_it_out() -> None:
    owners = {"NodeLoss": policy.NodeLoss, "TorchrunWatch": policy.TorchrunWatch}
    for rule in RULES:
        owner, _, name = rule.method.partition(".")
        assert callable(getattr(owners[owner], name, None)), rule


def test_every_signal_a_detector_or_the_supervisor_reports_has_its_row() -> None:
    """What lossdetect's and hangs' Listeners and the supervisor's Hooks report are rows;
    held() and replaced() are the guards the rows name."""
    guards = {"held", "replaced"}
    rows = {rule.method.partition(".")[2] for rule in RULES}
    listened = {
        n
        for listener in (lossdetect.Listener, hangs.Listener)
        for n, _ in inspect.getmembers(listener)
        if not n.startswith("_")
    }
    hooked = {n for n, _ in inspect.getmembers(Hooks) if not n.startswith("_")}
    # exited() is the second half of the SIGTERM row (signalled)
    assert (listened | hooked) - guards - {"exited"} <= rows
    reported = {"peer_gone", "stuck_round", "replaced_by", "may_reclaim", "after_torchrun"}
    assert rows == (listened | hooked | reported) - guards - {"exited"}


def markdown_table() -> str:
    lines = ["| signal | seen by | unless | action |", "| --- | --- | --- | --- |"]
    for rule in RULES:
        lines.append(f"| {rule.signal} | {rule.seen_by} | {rule.unless or '-'} | {rule.action} |")
    return "\n".join(lines) + "\n"


def test_docs_recovery_table_is_the_policys() -> None:
    """docs/recovery.md's table of what the job does at each loss is RULES, word for word."""
    text = (ROOT / "docs" / "recovery.md").read_text()
    assert markdown_table() in text, (
        "docs/recovery.md: paste tests/.../test_policy.markdown_table()"
    )


# -- a peer's lifeline closed -----------------------------------------------------------------


class Ops:
    """round.RoundOps's surface: the take-outs asked, answered by `removed`."""

    def __init__(self, removed: bool = True, leave: Callable[[int], bool] | None = None) -> None:
        self.removed, self._leave = removed, leave
        self.asked: list[tuple[str, tuple[str, int]]] = []

    def remove(self, node: tuple[str, int], since: float) -> bool:
        self.asked.append(("remove", node))
        return self.removed

    def leave(self, node: tuple[str, int]) -> bool:
        self.asked.append(("leave", node))
        return self._leave(node[1]) if self._leave is not None else True


class Registration:
    def member_at(self, addr: str) -> Member | None:
        return Member("run42-worker-2", addr, uid="uid-2") if addr == "10.0.0.2" else None


def test_peer_gone_takes_its_node_out_says_so_and_watches_its_pod() -> None:
    loss = make()
    loss.registration = Registration()  # type: ignore[assignment]
    watch = loss.watch("run42", "10.0.0.1", None)
    watch.ops = Ops()  # type: ignore[assignment]
    assert watch.peer_gone(("10.0.0.2", 5), time.time())
    assert watch.ops.asked == [("remove", ("10.0.0.2", 5))]  # type: ignore[union-attr]
    assert said(loss) == ["PeerGone"]
    assert loss.reclaimer.made == [("lost", ("run42-worker-2", None, "uid-2"))]  # type: ignore[union-attr]


def test_peer_gone_is_left_alone_while_this_pod_is_held_or_already_taken_out() -> None:
    loss = make()
    watch = loss.watch("run42", "10.0.0.1", None)
    watch.ops = Ops(removed=False)  # type: ignore[assignment]
    assert not watch.peer_gone(("10.0.0.2", 5), time.time())  # another survivor was first
    assert said(loss) == [] and loss.reclaimer.made == []  # type: ignore[union-attr]
    loss.fence.holding = True  # type: ignore[misc]
    watch.ops = Ops()  # type: ignore[assignment]
    assert not watch.peer_gone(("10.0.0.2", 5), time.time())
    assert watch.ops.asked == []  # type: ignore[union-attr]


# -- a peer's round key lapsed ---------------------------------------------------------------


def test_a_lapsed_peer_stops_this_pods_attempt_and_is_watched_for_reclaim(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    complete(monkeypatch, False)
    loss = make()
    loss.peers_lapsed(ATTEMPT, ["run42-worker-2"], {"run42-worker-0", "run42-worker-1"})
    assert made(loss.detector) == ["stop_attempt"]  # type: ignore[arg-type]
    assert "run42-worker-2 of round" in loss.detector.made[0][1][1]  # type: ignore[union-attr]
    assert loss.reclaimer.made == [  # type: ignore[union-attr]
        ("lapsed", (["run42-worker-2"], {"run42-worker-0", "run42-worker-1"}))
    ]


@pytest.mark.parametrize("why", ["held", "complete"])
def test_a_lapsed_peer_stops_nothing_while_held_or_once_the_job_is_complete(
    monkeypatch: pytest.MonkeyPatch, why: str
) -> None:
    complete(monkeypatch, why == "complete")
    loss = make()
    loss.fence.holding = why == "held"  # type: ignore[misc]
    loss.peers_lapsed(ATTEMPT, ["run42-worker-2"], {"run42-worker-1"})
    assert loss.detector.made == [] and loss.reclaimer.made == []  # type: ignore[union-attr]


# -- this pod's own round key -------------------------------------------------------------------


def test_a_stale_own_key_asks_who_this_pod_is() -> None:
    loss = make()
    assert loss.own_key_stale("not refreshed for 5 s")
    loss.fence.this_pod = False  # type: ignore[attr-defined]
    assert not loss.own_key_stale("not refreshed for 6 s")
    assert loss.fence.suspected == ["not refreshed for 5 s", "not refreshed for 6 s"]  # type: ignore[attr-defined]


def test_a_lapsed_own_key_stops_the_attempt_unless_this_pod_was_replaced() -> None:
    loss = make()
    loss.own_key_lapsed(ATTEMPT, "lapsed")
    assert loss.detector.made == [("stop_attempt", (ATTEMPT, "lapsed"))]  # type: ignore[union-attr]
    loss = make()
    loss.fence.this_pod = False  # type: ignore[attr-defined]
    loss.own_key_lapsed(ATTEMPT, "lapsed")
    assert loss.detector.made == []  # type: ignore[union-attr]


# -- this pod's member key holds another UID ----------------------------------------------------


def test_a_member_key_with_another_uid_fences_this_pod() -> None:
    loss = make()
    loss.replaced_by("uid-new")
    assert loss.fence.replaced_with == ["uid-new"]  # type: ignore[attr-defined]
    assert loss.replaced() and loss.watch("run42", None, None).replaced()


# -- SIGTERM ----------------------------------------------------------------------------------


def rendezvous_env(api: FakeApiServer, replicas: int, endpoint: str) -> dict[str, str]:
    api.add_statefulset("default", "run42-etcd", replicas=replicas)
    return {
        "ELASTIC_RDZV_ENDPOINT": endpoint,
        "ELASTIC_SCALE_DOWN": "true",
        "ELASTIC_RENDEZVOUS_STATEFULSET": "run42-etcd",
        "ELASTIC_SERVICEACCOUNT_DIR": str(api.serviceaccount_dir),
        **api.env(),
    }


def test_no_leave_at_the_signal_when_etcd_is_gone_because_the_job_is_done(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The end of a job: the first pod to finish scales etcd to 0 and the workers to 0, so
    the others get SIGTERM while their etcd goes away. Their leave at the signal must not
    try (it printed 'could not leave rendezvous' and python-etcd's name-resolution retries
    at the end of every successful run): etcd's silence, with the rendezvous at 0 replicas,
    is the job's end. With the rendezvous still up, etcd's silence is no end: it leaves."""
    left: list[int] = []
    monkeypatch.setattr(rounds, "leave", lambda _cfg, _id, _addr, pid: left.append(pid))
    with FakeApiServer(workdir=tmp_path / "api") as api:
        env = rendezvous_env(api, 0, f"127.0.0.1:{free_port()}")  # etcd already gone
        cfg = config.load(["train.py"], {**BASE, **env})
        done = Completion(kvstore.connect(cfg), cfg)
        watch = NodeLoss(cfg, done, torchrun_pid=lambda: None).watch("run42", "127.0.0.1", None)
        watch.signalled(4242)
        assert watch._leaving is not None
        watch._leaving.join(10)
        assert left == []
        assert done.known()
        api.add_statefulset("default", "run42-etcd", replicas=1)
        mid_job = Completion(kvstore.connect(cfg), cfg)
        watch = NodeLoss(cfg, mid_job, torchrun_pid=lambda: None).watch("run42", "127.0.0.1", None)
        watch.signalled(4243)
        assert watch._leaving is not None
        watch._leaving.join(10)
        assert left == [4243]


def sleeper(seconds: float) -> list[str]:
    return [sys.executable, "-c", f"import time; time.sleep({seconds})"]


@pytest.mark.slow
def test_a_sigterm_takes_the_node_out_at_once_through_the_helper_else_here(
    etcd: EtcdServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """At the signal (before torchrun has exited) the node leaves through the round's
    operations (the lifelines' helper, torch imported there), and once more after torchrun
    exited; when the helper fails, with round.leave here. Not at all when the job is
    complete: every pod is told to stop then, nobody re-forms. A real supervisor."""
    cfg = config.load(
        ["train.py"],
        {**BASE, "ELASTIC_JOB_ID": "leave-at-signal", "ELASTIC_RDZV_ENDPOINT": etcd.endpoint},
    )
    client = etcdv2.Client(etcd.url)
    here: list[int] = []
    monkeypatch.setattr(rounds, "leave", lambda _cfg, _id, _addr, pid: here.append(pid))

    def run(via: Callable[[int], bool]) -> tuple[Supervisor, float]:
        done = Completion(client, cfg)
        watch = NodeLoss(cfg, done, torchrun_pid=lambda: None).watch(
            "leave-at-signal", "127.0.0.1", None
        )
        watch.ops = Ops(leave=via)  # type: ignore[assignment]
        # a torchrun whose workers checkpoint for 3 s after the signal
        checkpoints = [
            sys.executable,
            "-c",
            "import signal, sys, time; signal.signal(signal.SIGTERM, lambda *_: None); "
            "time.sleep(3); sys.exit(1)",
        ]
        sup = Supervisor(checkpoints, {}, cfg, done, hooks=watch)
        threading.Timer(0.5, sup.forward, (signal.SIGTERM,)).start()
        start = time.monotonic()
        sup.run()
        return sup, start

    asked: list[tuple[int, float]] = []
    sup, start = run(lambda pid: asked.append((pid, time.monotonic())) or True)
    assert sup.proc is not None
    # at the signal, well before torchrun's end (3 s); once more after its exit
    assert [pid for pid, _ in asked] == [sup.proc.pid] * 2
    assert asked[0][1] - start < 2.5 and asked[1][1] - asked[0][1] > 0.5, (start, asked)
    assert here == []

    def broken(pid: int) -> bool:
        raise HelperError("the lifelines' helper did not answer")

    sup, _ = run(broken)
    assert sup.proc is not None and here == [sup.proc.pid] * 2

    completions.mark_complete(client, cfg)
    asked.clear()
    sup, _ = run(lambda pid: asked.append((pid, time.monotonic())) or True)
    assert asked == []  # complete: no leave at the signal, nor after (exit 0)


def test_a_held_pod_does_not_leave_at_the_signal() -> None:
    loss = make()
    loss.fence.holding = True  # type: ignore[misc]
    watch = loss.watch("run42", "127.0.0.1", None)
    watch.ops = Ops()  # type: ignore[assignment]
    assert watch.held()
    watch.signalled(4242)
    watch.exited(4242)
    assert watch._leaving is None and watch.ops.asked == []  # type: ignore[union-attr]


# -- a stuck round --------------------------------------------------------------------------


@dataclass
class Sup:
    """The supervisor's surface for the rows that follow a torchrun."""

    relaunched: float | None = None
    signalled: int | None = None
    asked: list[str] = field(default_factory=list)

    def relaunch(self, reason: str) -> bool:
        self.asked.append(reason)
        self.relaunched = time.monotonic()
        return True


def test_a_stuck_round_relaunches_torchrun_and_says_so() -> None:
    loss = make()
    watch = loss.watch("run42", "127.0.0.1", None)
    sup = Sup()
    watch.supervisor = sup  # type: ignore[assignment]
    watch.stuck_round("10.0.0.2 (pid 5) left round 3 after it completed", trained=False)
    assert sup.asked and said(loss) == ["TorchrunRelaunched"]
    loss.fence.holding = True  # type: ignore[misc]
    watch.stuck_round("again", trained=False)
    assert len(sup.asked) == 1


def test_relaunched_torchruns_that_never_train_end_after_max_stuck() -> None:
    loss = make()
    afters = []
    for _ in range(MAX_STUCK + 1):
        loss.watch("run42", None, None).stuck_round("stuck", trained=False)
        afters.append(loss.after_torchrun(143, Sup(relaunched=1.0), 0)[0])  # type: ignore[arg-type]
    assert afters == [After.RELAUNCH] * MAX_STUCK + [After.END]
    loss.watch("run42", None, None).stuck_round("stuck", trained=True)  # it trained: count anew
    assert loss.after_torchrun(143, Sup(relaunched=1.0), 0)[0] is After.RELAUNCH  # type: ignore[arg-type]


# -- torch closed the rendezvous ------------------------------------------------------------


def test_a_rendezvous_closed_early_opens_the_next_generation_up_to_max_reopens(
    etcd: EtcdServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    closed: list[str] = []
    monkeypatch.setattr(
        generations, "rendezvous_closed", lambda _cfg, rdzv: closed.append(rdzv) or True
    )
    loss = make(ELASTIC_JOB_ID="reopen", ELASTIC_RDZV_ENDPOINT=etcd.endpoint)
    loss.client = etcdv2.Client(etcd.url)
    seen = []
    generation = 0
    for _ in range(MAX_REOPENS + 1):
        after, generation = loss.after_torchrun(1, Sup(), generation)  # type: ignore[arg-type]
        seen.append((after, generation))
    assert seen == [(After.NEXT_GENERATION, n) for n in range(1, MAX_REOPENS + 1)] + [
        (After.END, MAX_REOPENS)
    ]
    assert closed == ["reopen", "reopen-r1", "reopen-r2"]
    assert generations.current(loss.client, loss.config) == MAX_REOPENS
    assert said(loss) == ["RendezvousReopened"] * MAX_REOPENS


def test_success_a_signal_or_an_open_rendezvous_end_the_pods_torchruns(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(generations, "rendezvous_closed", lambda _cfg, _rdzv: False)
    loss = make()
    assert loss.after_torchrun(0, Sup(), 0) == (After.END, 0)  # type: ignore[arg-type]
    assert loss.after_torchrun(143, Sup(signalled=signal.SIGTERM), 0) == (After.END, 0)  # type: ignore[arg-type]
    assert loss.after_torchrun(1, Sup(), 0) == (After.END, 0)  # type: ignore[arg-type]
    loss.fence.replaced("uid-new")  # type: ignore[attr-defined]
    assert loss.after_torchrun(1, Sup(), 0) == (After.REPLACED, 0)  # type: ignore[arg-type]


# -- a lost peer's node NotReady; a lost peer back ------------------------------------------


def test_reclaim_acts_only_while_this_pod_is_not_held_and_the_job_not_complete() -> None:
    loss = make()
    assert loss.may_reclaim()
    loss.fence.holding = True  # type: ignore[misc]
    assert not loss.may_reclaim()
    loss.fence.holding = False  # type: ignore[misc]
    loss.completion.done = True
    assert not loss.may_reclaim()


def test_a_peer_seen_alive_again_is_not_watched_any_more() -> None:
    loss = make()
    loss.peers_alive({"run42-worker-2"})
    assert loss.reclaimer.made == [("alive", ({"run42-worker-2"},))]  # type: ignore[union-attr]


# -- no rank of the round stepped for the hang bound ------------------------------------------


def hung_rank(rank: int, pod: str) -> hangs.RankState:
    return hangs.RankState(rank, pod, 7, "x", "in wait (threading.py:327)", False, False)


def test_a_hung_rank_of_this_pod_stops_its_attempt_and_says_so(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    complete(monkeypatch, False)
    loss = make()
    loss.tracker = Calls()  # type: ignore[assignment]
    verdict = hangs.Verdict((hung_rank(1, "run42-worker-1"),), "outside any collective")
    loss.hung(ATTEMPT, verdict, 31.0)
    assert loss.tracker.made == [("hung", ("took-out",))]  # type: ignore[union-attr]
    assert made(loss.detector) == ["stop_attempt"]  # type: ignore[arg-type]
    _, (attempt, why, cause) = loss.detector.made[0]  # type: ignore[union-attr]
    assert (attempt, cause) == (ATTEMPT, "hang")
    assert "rank 1 hung, outside any collective" in why and "in wait" in why
    assert said(loss) == ["RankHung"]


def test_a_hung_rank_of_another_pod_is_left_to_that_pod(monkeypatch: pytest.MonkeyPatch) -> None:
    """Its pod stops it, and this pod's attempt ends as the culprit's sockets close."""
    complete(monkeypatch, False)
    loss = make()
    loss.hung(ATTEMPT, hangs.Verdict((hung_rank(2, "run42-worker-2"),), "behind"), 31.0)
    time.sleep(0.1)
    assert made(loss.detector) == ["current"] and said(loss) == []  # type: ignore[arg-type]


def test_a_culprit_whose_processes_do_not_end_is_left_behind(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A culprit blocked in the kernel (a hung mount) cannot be killed and keeps its
    sockets open: once the grace is over, this pod stops its own attempt."""
    complete(monkeypatch, False)
    monkeypatch.setattr(policy.timings, "HANG_TAKEOUT_GRACE", 0.3)
    loss = make()
    loss.detector.answers["current"] = ATTEMPT  # type: ignore[union-attr]
    loss.hung(ATTEMPT, hangs.Verdict((hung_rank(2, "run42-worker-2"),), "behind"), 31.0)
    wait = time.monotonic() + 5
    while "stop_attempt" not in made(loss.detector) and time.monotonic() < wait:  # type: ignore[arg-type]
        time.sleep(0.05)
    stops = [args for name, args in loss.detector.made if name == "stop_attempt"]  # type: ignore[union-attr]
    assert len(stops) == 1 and "did not end" in stops[0][1]


def test_no_single_culprit_restarts_the_round_from_every_pod(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    complete(monkeypatch, False)
    loss = make()
    loss.tracker = Calls()  # type: ignore[assignment]
    loss.hung(ATTEMPT, hangs.Verdict((), "every rank waits at the same place"), 31.0)
    assert loss.tracker.made == [("hung", ("restarted-round",))]  # type: ignore[union-attr]
    assert made(loss.detector) == ["stop_attempt"]  # type: ignore[arg-type]
    assert said(loss) == ["RoundHung"]


@pytest.mark.parametrize("why", ["held", "complete"])
def test_a_hang_stops_nothing_while_held_or_once_the_job_is_complete(
    monkeypatch: pytest.MonkeyPatch, why: str
) -> None:
    complete(monkeypatch, why == "complete")
    loss = make()
    loss.fence.holding = why == "held"  # type: ignore[misc]
    loss.hung(ATTEMPT, hangs.Verdict((hung_rank(1, "run42-worker-1"),), "behind"), 31.0)
    assert loss.detector.made == [] and said(loss) == []  # type: ignore[union-attr]
