"""round.py: a node taken out of torch's rendezvous round (a stopped one, a dead peer). It
runs torch internals, so these tests pin them: the torch version it was checked against,
and the behaviour on a real etcd (both backends) with an agent that joined a round and
went away, as torchrun does after a SIGTERM."""

from __future__ import annotations

import logging
import re
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from elastic_worker import torchcompat
from elastic_worker.completion import Completion
from elastic_worker.keystore import interface as kvstore
from elastic_worker.recovery import generations, rendezvous
from elastic_worker.recovery import round as rounds
from elastic_worker.recovery.lifelines import helper
from elastic_worker.recovery.policy import NodeLoss
from elastic_worker.settings import config
from elastic_worker.warm import server as warm
from testlib import EtcdServer, free_port

from worker.worker_helpers import BACKENDS, ROOT, backend_etcd, wait_until, worker_env

# One agent process, as torchrun makes it: the first handler of its process (local_id 0),
# node address 127.0.0.1. It joins, prints its pid and exits without a word to the
# rendezvous: its node stays in the round until its keep-alive lapses (a minute here).
AGENT = textwrap.dedent(
    """
    import os, sys
    from torch.distributed.elastic.rendezvous import RendezvousParameters, registry
    backend, endpoint, run_id, nodes = sys.argv[1:5]
    params = RendezvousParameters(
        backend, endpoint, run_id, int(nodes), int(nodes), local_addr="127.0.0.1",
        last_call_timeout=1, keep_alive_interval=5, keep_alive_max_attempt=12,
    )
    handler = registry.get_rendezvous_handler(params)
    info = handler.next_rendezvous()
    print(os.getpid(), info.rank, flush=True)
    os._exit(0)
    """
)


def _config(etcd: EtcdServer, job: str, backend: str | None = None, **extra: str) -> config.Config:
    backend = backend or ("etcd-v2" if etcd.v2 else "etcd-v3")
    env = worker_env(etcd.endpoint, job, POD_NAME="w0", ELASTIC_RDZV_BACKEND=backend, **extra)
    env["ELASTIC_MIN_NODES"] = env["ELASTIC_MAX_NODES"] = "1"
    env["ELASTIC_RDZV_CONF"] = "last_call_timeout=1,keep_alive_interval=5,keep_alive_max_attempt=12"
    return config.load(["python", "train.py"], env)


def _agent(
    cfg: config.Config, run_id: str, timeout: float = 60, nodes: int = 1
) -> tuple[int, float]:
    """Run one agent through a round of `nodes`; its pid and the seconds the round took."""
    started = time.monotonic()
    out = subprocess.run(
        [sys.executable, "-c", AGENT, cfg.rdzv_backend, str(cfg.endpoint), run_id, str(nodes)],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=True,
    )
    return int(out.stdout.split()[0]), time.monotonic() - started


def test_the_torch_leave_py_was_checked_against_is_the_one_pinned() -> None:
    """round.py reads torch internals (dynamic_rendezvous, through torchcompat). Bumping torch in
    requirements/dev.txt fails here: re-read round.py against the new torch, run this file,
    then update the version below."""
    pinned = re.search(r"^torch==(\S+)$", (ROOT / "requirements" / "dev.txt").read_text(), re.M)
    assert pinned is not None
    assert torch.__version__.split("+")[0] == pinned[1] == "2.13.0", (
        f"torch {torch.__version__}: check images/worker/src/elastic_worker/torchcompat.py against "
        "its dynamic_rendezvous.py"
    )


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.slow
def test_a_gone_agent_leaves_and_the_next_round_forms_without_waiting_for_its_keep_alive(
    etcd_factory: Callable[..., EtcdServer], backend: str
) -> None:
    cfg = _config(backend_etcd(etcd_factory, backend), "gone")
    gone, _ = _agent(cfg, "gone")
    # The round of one is complete and holds the gone agent's node (a 60 s keep-alive):
    # a newcomer could only wait. Taking it out moves the rendezvous to the next round.
    assert rounds.leave(cfg, "gone", "127.0.0.1", gone) is True
    assert rounds.leave(cfg, "gone", "127.0.0.1", gone) is False  # not there any more
    _, took = _agent(cfg, "gone", timeout=40)
    assert took < 30, f"the next round took {took:.1f} s: the gone node was still in it"
    assert not generations.rendezvous_closed(cfg, "gone")


def test_another_node_is_left_alone(etcd_factory: Callable[..., EtcdServer]) -> None:
    """Only torchrun's own node (its address and pid) is taken out."""
    cfg = _config(backend_etcd(etcd_factory, "etcd-v2"), "other")
    member, _ = _agent(cfg, "other")
    assert rounds.leave(cfg, "other", "127.0.0.1", member + 100_000) is False
    assert rounds.leave(cfg, "other", "10.0.0.9", member) is False
    assert rounds.leave(cfg, "other", "127.0.0.1", member) is True


def test_a_node_seen_dead_stays_when_it_beat_after_and_goes_otherwise(
    etcd_factory: Callable[..., EtcdServer], caplog: pytest.LogCaptureFixture
) -> None:
    """lifeline.py's removal of another pod's node: a heartbeat newer than the moment its
    lifeline closed means a new torchrun with the same address and pid; it stays."""
    cfg = _config(backend_etcd(etcd_factory, "etcd-v3"), "dead")
    before = time.time()
    member, _ = _agent(cfg, "dead")
    made = lambda: rendezvous.handler(cfg, "dead")  # noqa: E731
    with caplog.at_level(logging.INFO, logger="elastic_worker"):
        assert rounds.take_out(made, "dead", "127.0.0.1", member, dead_since=before) is False
        assert f"kept 127.0.0.1:{member} in rendezvous dead" in caplog.text
        assert rounds.participants(made()) == [("127.0.0.1", member)]
        assert rounds.take_out(made, "dead", "127.0.0.1", member, dead_since=time.time())
    assert f"took 127.0.0.1:{member} out of rendezvous dead (participants" in caplog.text
    assert rounds.participants(made()) == []
    # read once it was out already (torch's heartbeat timeout first, on a loaded host): said
    with caplog.at_level(logging.INFO, logger="elastic_worker"):
        assert not rounds.take_out(made, "dead", "127.0.0.1", member, dead_since=time.time() - 6)
    assert re.search(
        rf"127\.0\.0\.1:{member} was no longer in rendezvous dead when read, 6\.\d s after",
        caplog.text,
    ), caplog.text


def test_of_two_survivors_taking_out_one_dead_node_only_one_reports_it(
    etcd_factory: Callable[..., EtcdServer],
) -> None:
    """Both survivors see the lifeline close and both try; the compare-and-swap lets one
    write it, and the other, finding the node gone, says nothing was removed."""
    cfg = _config(backend_etcd(etcd_factory, "etcd-v2"), "twice")
    member, _ = _agent(cfg, "twice")
    since = time.time()
    results: list[bool] = []
    gate = threading.Barrier(2)

    def survivor() -> None:
        handler = rendezvous.handler(cfg, "twice")
        handler._state_holder.sync()  # type: ignore[attr-defined]  # both hold the same state
        gate.wait()
        results.append(
            rounds.take_out(lambda: handler, "twice", "127.0.0.1", member, dead_since=since)
        )

    threads = [threading.Thread(target=survivor) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert sorted(results) == [False, True]


# A peer's elastic-worker: its lifeline greets with its torchrun's pid (argv 3).
PEER = textwrap.dedent(
    """
    import sys, time
    from elastic_worker.recovery.lifelines.server import LifelineServer
    LifelineServer(sys.argv[1], int(sys.argv[2]), lambda: int(sys.argv[3])).start()
    print("ready", flush=True)
    time.sleep(600)
    """
)


@pytest.mark.parametrize("backend", ["etcd-v3", "etcd-lease"])
@pytest.mark.slow
def test_the_lifelines_read_the_round_when_an_attempt_starts_and_take_a_dead_node_out(
    etcd_factory: Callable[..., EtcdServer], tmp_path: Path, backend: str
) -> None:
    """The node-loss policy's lifelines as elastic-worker runs them, on a real round: nothing
    is read before the attempt log gets a line; then the node of a peer whose elastic-worker
    dies is taken out (a 60 s keep-alive, or etcd-lease's lease of 60 s, would keep it)."""
    port = free_port()
    etcd = backend_etcd(etcd_factory, "etcd-v3")
    cfg = _config(etcd, "lines", backend, ELASTIC_LIFELINE_PORT=str(port))
    member, _ = _agent(cfg, "lines")  # its node, 127.0.0.1, stays in the complete round
    peer = subprocess.Popen(
        [sys.executable, "-c", PEER, "127.0.0.1", str(port), str(member)],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert peer.stdout is not None and peer.stdout.readline() == "ready\n"
    log = tmp_path / "attempts"
    # This pod: another address, its own torchrun (pid 1 here).
    loss = NodeLoss(cfg, Completion(kvstore.connect(cfg), cfg), torchrun_pid=lambda: 1)
    loss.attempt_log = log
    taken: list[torchcompat.RdzvNode] = []
    watch = loss.watch("lines", "127.0.0.5", None)
    peer_gone = watch.peer_gone
    watch.peer_gone = lambda node, since: taken.append(node) or peer_gone(node, since)  # type: ignore[method-assign]
    try:
        with watch.running(None):
            watcher = watch.lifelines
            assert watcher is not None
            time.sleep(0.7)
            assert watcher._lines == {}  # no attempt yet: the round is not read
            log.write_text("[elastic-worker] attempt run_id=lines restart=0 group_rank=0 nodes=2\n")
            wait_until("the lifeline held", lambda: ("127.0.0.1", member) in watcher._lines, 20)
            peer.kill()
            wait_until("the node taken out", lambda: taken == [("127.0.0.1", member)], 10)
            assert watch.ops is not None and watch.ops.participants() == []
    finally:
        peer.kill()
        peer.wait()


@pytest.mark.slow
def test_the_lifelines_helper_forked_from_the_warm_server_reads_the_round_and_takes_a_node_out(
    etcd_factory: Callable[..., EtcdServer],
    monkeypatch: pytest.MonkeyPatch,
    capfd: pytest.CaptureFixture[str],
) -> None:
    """lifeline.py's torch work in one helper forked from the warm server (torch imported
    there) for the whole torchrun, so that elastic-worker never imports torch for its
    lifelines: the same answers as in-process, with the settings from the entrypoint's
    environment; one process for every request; a helper that died is started again."""
    cfg = _config(backend_etcd(etcd_factory, "etcd-v3"), "warm")
    member, _ = _agent(cfg, "warm")
    env = worker_env(str(cfg.endpoint), "warm", POD_NAME="w0")
    env.update(ELASTIC_RDZV_BACKEND="etcd-v3", ELASTIC_MIN_NODES="1", ELASTIC_MAX_NODES="1")
    env["ELASTIC_RDZV_CONF"] = "last_call_timeout=1,keep_alive_interval=5,keep_alive_max_attempt=12"
    env["PYTHONPATH"] = str(ROOT / "images" / "worker" / "src")
    for name, value in env.items():
        monkeypatch.setenv(name, value)  # the client passes its environment to the child
    # Its own handler: caplog listens at the root, where an earlier test's
    # main.setup_logging() (propagate off) may keep the record from arriving.
    said: list[logging.LogRecord] = []
    listener = logging.Handler(logging.WARNING)
    listener.emit = said.append  # type: ignore[method-assign]
    logging.getLogger("elastic_worker.recovery.lifelines.helper").addHandler(listener)
    server = warm.start(sys.executable, ["torch"], env)
    client = helper.HelperClient(server.socket_path, "warm")
    try:
        first = client._proc
        assert client.participants() == [("127.0.0.1", member)]
        assert client.remove(("127.0.0.1", member), time.time()) is True
        assert client.leave(("127.0.0.1", member)) is False  # gone already (a SIGTERM's leave)
        assert client.participants() == []
        assert client._proc is first  # one helper for every request
        assert first is not None
        first.kill()
        first.wait(5)
        assert client.participants() == []  # a helper that died: the next request starts one
        assert client._proc is not first
        client._proc.kill()
        client._proc.wait(5)
        monkeypatch.delenv("ELASTIC_JOB_ID")  # a helper that cannot start: said once
        for _ in range(2):
            with pytest.raises(helper.HelperError):
                client.participants()
    finally:
        logging.getLogger("elastic_worker.recovery.lifelines.helper").removeHandler(listener)
        client.close()
        server.stop()
    err = capfd.readouterr().err
    assert "starting cold" not in err  # the server's children did it
    assert err.count("the lifelines' helper: ELASTIC_JOB_ID is not set") == 2, err
    ended = [r for r in said if "the helper that reads the round ended" in r.getMessage()]
    assert len(ended) == 1, [r.getMessage() for r in said]


def test_without_the_internals_it_says_so_and_the_keep_alive_remains(
    etcd: EtcdServer, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Another torch in the user's base image: one line, no exception, no leave."""
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous  # noqa: PLC0415

    cfg = _config(etcd, "other-torch")
    older = {
        k: v for k, v in vars(dynamic_rendezvous).items() if k != "_DistributedRendezvousOpExecutor"
    }
    monkeypatch.setattr(torchcompat, "dynamic_rendezvous", lambda: SimpleNamespace(**older))
    with caplog.at_level(logging.INFO, logger="elastic_worker"):
        assert rounds.leave(cfg, "other-torch", "127.0.0.1", 1) is False
    assert "cannot take a node out of rendezvous other-torch with this torch" in caplog.text


def test_an_unreachable_etcd_costs_only_the_speed_up(caplog: pytest.LogCaptureFixture) -> None:
    env = worker_env("127.0.0.1:9", "away", POD_NAME="w0")
    cfg = config.load(["python", "train.py"], env)
    with caplog.at_level(logging.INFO, logger="elastic_worker"):
        assert rounds.leave(cfg, "away", "127.0.0.1", 1) is False
    assert "could not take 127.0.0.1:1 out of rendezvous away" in caplog.text


# -- etcd-lease: the round in the job's own keys (round.Leases) ------------------------------


@pytest.mark.slow
def test_on_etcd_lease_the_round_is_read_and_a_node_taken_out_without_torch(
    etcd_factory: Callable[..., EtcdServer],
) -> None:
    """etcd-lease's round through its own keys (torch_etcd_v3.rounds.view): in
    elastic-worker itself even when a warm server runs (no helper, nothing of torch), the
    live members with their group ranks; a dead node out at once (its lease of 60 s
    revoked), found by its address and pid; a second take-out or a leave finds it gone."""
    cfg = _config(backend_etcd(etcd_factory, "etcd-v3"), "lease", "etcd-lease")
    member, _ = _agent(cfg, "lease")  # os._exit: its lease outlives it by a minute
    node = ("127.0.0.1", member)
    ops = helper.ops_for(cfg, "lease", "/nonexistent/warm.sock")
    assert isinstance(ops, rounds.Leases)
    try:
        assert ops.participants() == [node]
        view = ops.round()
        assert (view.complete, dict(view.ranks), view.keep_alive) == (True, {node: 0}, 60.0)
        assert ops.remove(node, time.time()) is True
        assert ops.participants() == []
        assert ops.remove(node, time.time()) is False
        assert ops.leave(node) is False
    finally:
        ops.close()
    # Its round and its take-out, in a process of their own: torch is never imported.
    probe = textwrap.dedent(
        f"""
        import sys
        from elastic_worker.recovery import round as rounds
        from elastic_worker.settings import config
        cfg = config.load(["python", "train.py"], {dict(_env(cfg))!r})
        ops = rounds.Leases(cfg, "lease")
        print(ops.participants(), ops.leave(("127.0.0.1", {member})),
              sorted(m for m in sys.modules if m.split(".")[0] == "torch"))
        """
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.split("\n")[0] == "[] False []", out.stdout + out.stderr


def _env(cfg: config.Config) -> dict[str, str]:
    env = worker_env(str(cfg.endpoint), cfg.job_id, POD_NAME="w0")
    env.update(ELASTIC_RDZV_BACKEND=cfg.rdzv_backend, ELASTIC_MIN_NODES="1", ELASTIC_MAX_NODES="1")
    env["ELASTIC_RDZV_CONF"] = ",".join(f"{k}={v}" for k, v in cfg.rdzv_conf)
    return env


@pytest.mark.slow
def test_on_etcd_lease_a_pod_holds_lifelines_to_the_next_members_in_rank_order_only(
    etcd_factory: Callable[..., EtcdServer],
) -> None:
    """At n nodes each pod watches round.LIFELINE_PEERS others, not n - 1: the members after
    its own in rank order, wrapping around, so that every member is watched by as many."""
    cfg = _config(backend_etcd(etcd_factory, "etcd-v3"), "ring", "etcd-lease")
    joined: list[tuple[int, float]] = []
    agents = [
        threading.Thread(target=lambda: joined.append(_agent(cfg, "ring", nodes=4)))
        for _ in range(4)
    ]
    for agent in agents:
        agent.start()
    for agent in agents:
        agent.join(90)
    assert len(joined) == 4
    every = rounds.Leases(cfg, "ring")
    view = every.round()
    by_rank = sorted(view.ranks, key=lambda n: view.ranks[n])
    assert sorted(view.ranks.values()) == [0, 1, 2, 3]
    assert every.participants() == by_rank  # nobody's own: the whole round
    assert rounds.LIFELINE_PEERS == 2
    for rank, node in enumerate(by_rank):
        ring = rounds.Leases(cfg, "ring", own=lambda node=node: node)
        assert ring.participants() == [by_rank[(rank + 1) % 4], by_rank[(rank + 2) % 4]]
    every.close()


def test_on_etcd_lease_a_stopped_node_leaves_and_an_unreachable_etcd_costs_only_the_speed_up(
    etcd_factory: Callable[..., EtcdServer], caplog: pytest.LogCaptureFixture
) -> None:
    """The leave at SIGTERM (policy.TorchrunWatch.signalled, round.leave) on etcd-lease: the
    node's lease revoked, said once; with etcd away, one line and no exception."""
    cfg = _config(backend_etcd(etcd_factory, "etcd-v3"), "bye", "etcd-lease")
    member, _ = _agent(cfg, "bye")
    with caplog.at_level(logging.INFO, logger="elastic_worker"):
        assert rounds.leave(cfg, "bye", "127.0.0.1", member) is True
        assert rounds.leave(cfg, "bye", "127.0.0.1", member) is False
    assert caplog.text.count("left rendezvous bye (its lease revoked)") == 1
    assert rounds.Leases(cfg, "bye").participants() == []
    env = _env(cfg)
    env["ELASTIC_RDZV_ENDPOINT"] = "127.0.0.1:9"
    away = config.load(["python", "train.py"], env)
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="elastic_worker"):
        assert rounds.leave(away, "bye", "127.0.0.1", member) is False
    assert f"could not take 127.0.0.1:{member} out of rendezvous bye" in caplog.text


def test_on_etcd_lease_no_stuck_round_watch_runs(
    etcd_factory: Callable[..., EtcdServer], tmp_path: Path
) -> None:
    """etcd-lease's store stops a wait itself once the round lost a member, so the policy
    starts no stuck-round watch for it (its row's `unless`); on etcd-v3 it does."""
    etcd = backend_etcd(etcd_factory, "etcd-v3")
    for backend, watched in (("etcd-lease", False), ("etcd-v3", True)):
        cfg = _config(etcd, "stuck", backend)
        loss = NodeLoss(cfg, Completion(kvstore.connect(cfg), cfg), torchrun_pid=lambda: None)
        loss.attempt_log = tmp_path / f"attempts-{backend}"
        with loss.watch("stuck", "127.0.0.5", None).running(SimpleNamespace()):  # type: ignore[arg-type]
            names = {t.name for t in threading.enumerate()}
            assert ("stuck-round" in names) is watched, (backend, names)
