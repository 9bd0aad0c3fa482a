"""Real torchrun agents (gloo, CPU) on `--rdzv-backend=etcd-lease` against etcd with no v2
API, none of elastic-worker's machinery around them: three form a group; one SIGKILLed or
SIGTERMed, the other two re-form and finish; the job's end closes the rendezvous and every
node's keys are gone."""

from __future__ import annotations

import contextlib
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from lease_helpers import keys_under
from testlib import EtcdServer
from torch_etcd_v3.rounds.view import Rounds
from torchrun_helpers import Torchrun
from worker.worker_helpers import kill_tree, wait_until

pytestmark = pytest.mark.slow

PREFIX = b"/torch/elastic/rounds/"


@pytest.fixture
def start(etcd3: EtcdServer, tmp_path: Path) -> Iterator[Callable[..., Torchrun]]:
    started: list[Torchrun] = []

    def make(name: str, job: str, **kwargs: object) -> Torchrun:
        agent = Torchrun(name, etcd3, job, tmp_path, backend="etcd-lease", **kwargs)  # type: ignore[arg-type]
        started.append(agent)
        return agent

    yield make
    for agent in started:
        kill_tree(agent.proc.pid)
        with contextlib.suppress(subprocess.TimeoutExpired):
            agent.proc.wait(10)


def _three_training(start: Callable[..., Torchrun], job: str) -> list[Torchrun]:
    agents = [start(n, job) for n in ("a", "b", "c")]
    wait_until(
        "the three agents training together",
        lambda: all(any(w == 3 for _, w, _ in x.steps()) for x in agents),
        timeout=120,
    )
    return agents


def _finish_as_two(survivors: list[Torchrun]) -> None:
    for survivor in survivors:
        assert survivor.proc.wait(240) == 0, survivor.log.read_text()[-3000:]
        steps = survivor.steps()
        assert steps[-1][0] == 59, "the job did not run to its last step"
        assert [s for s in steps if s[1] == 2], "the survivors never trained as two"


def _members(etcd: EtcdServer, job: str) -> int:
    """The job's live nodes: its membership keys."""
    return len(keys_under(etcd, PREFIX + job.encode() + b"/m/"))


@pytest.mark.parametrize("etcd3", ["3.5"], indirect=True, ids=["etcd3.5"])
def test_three_agents_lose_one_to_sigkill_re_form_and_finish(
    etcd3: EtcdServer, start: Callable[..., Torchrun]
) -> None:
    a, b, c = _three_training(start, "job-kill")
    kill_tree(c.proc.pid, signal.SIGKILL)
    c.proc.wait(10)
    _finish_as_two([a, b])
    # The job done: the survivors shut down, the last closed the rendezvous, every node left.
    rounds = Rounds.connect(etcd3.endpoint, "job-kill", {})
    assert rounds.is_closed()
    wait_until("the dead node's lease to lapse", lambda: _members(etcd3, "job-kill") == 0, 10)


@pytest.mark.parametrize("etcd3", ["3.5"], indirect=True, ids=["etcd3.5"])
def test_a_node_told_to_stop_leaves_at_once_and_the_others_finish(
    etcd3: EtcdServer, start: Callable[..., Torchrun]
) -> None:
    a, b, c = _three_training(start, "job-term")
    assert _members(etcd3, "job-term") == 3
    c.proc.send_signal(signal.SIGTERM)  # a spot reclaim: torch stops its workers, exits
    c.proc.wait(60)
    stopped = time.monotonic()
    # It left as its process exited, not when its lease (3 s) would have lapsed.
    wait_until("its key to be gone", lambda: _members(etcd3, "job-term") <= 2, 2)
    assert time.monotonic() - stopped < 2
    _finish_as_two([a, b])
