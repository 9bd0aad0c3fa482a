"""The main fault scenarios with `--set global.rendezvousBackend=etcd-lease`: torchrun's
etcd-lease rendezvous (packages/torch-etcd-v3: each node's key under its own lease) and
the worker's own keys on the v3 API, against the chart's bundled etcd with no v2 API.

Written per backend, so that each scenario of test_e2e_etcd_v3.py can run on both: BACKENDS
holds what differs. The worker's lifelines and its leave at SIGTERM take a node out through
torch's internals on etcd-v3 (elastic_worker/torchcompat.py) and by revoking the node's
lease on etcd-lease (recovery/round.py's Leases): each backend's leave says so in its own
words. The partition, node-down, own-image and TLS scenarios take a backend parameter in
their own files.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import pytest
from localrun_e2e import (
    assert_cleaned_up,
    assert_nothing_lost,
    assert_taken_out_by_lifeline,
    in_order,
    pod,
    reform,
    root_with_namespaces,
    run_local,
)
from test_e2e_etcd_v3 import PROBE_DIR, REFORM_BOUND, assert_v3_only, probe_command

pytestmark = [
    pytest.mark.netns,
    pytest.mark.slow,
    pytest.mark.skipif(bool(root_with_namespaces()), reason=root_with_namespaces() or "ok"),
]

USER_SCRIPT = [
    "worker.extraVolumes[0].name=user-script",
    f"worker.extraVolumes[0].hostPath.path={PROBE_DIR}",
    "worker.extraVolumeMounts[0].name=user-script",
    "worker.extraVolumeMounts[0].mountPath=/opt/user-script",
    "worker.extraVolumeMounts[0].readOnly=true",
]


@dataclass(frozen=True)
class Backend:
    name: str
    #: What the worker's leave at SIGTERM says after "left rendezvous <id> " (round.py).
    left: str

    @property
    def sets(self) -> list[str]:
        return [f"global.rendezvousBackend={self.name}", *USER_SCRIPT]


BACKENDS = {
    "etcd-v3": Backend("etcd-v3", left=r"\(participants of round"),
    "etcd-lease": Backend("etcd-lease", left=r"\(its lease revoked\)"),
}
#: The scenarios run here: etcd-lease (etcd-v3's are test_e2e_etcd_v3.py's).
HERE = [pytest.param(BACKENDS["etcd-lease"], id="etcd-lease")]


@pytest.mark.parametrize("backend", HERE)
def test_sigkill_one_pod_reforms_at_two_resumes_and_grows_back(
    tmp_path: Path, backend: Backend
) -> None:
    run = run_local(
        tmp_path, f"--kill={pod(1)}@step=8:15", command=probe_command(80, 5), sets=backend.sets
    )
    assert run.rc == 0, run.describe()
    assert_nothing_lost(run, 80)
    kill = reform(run, f"kill {pod(1)}")
    print(f"{backend.name}: re-form after SIGKILL of {pod(1)}: {kill['seconds']} s")
    assert kill["world_size"] == 2, run.describe()
    assert kill["seconds"] is not None and kill["seconds"] < REFORM_BOUND, kill
    assert kill["steps_lost"] == 0, kill
    assert in_order(run.summary["world_sizes"], [3, 2, 3]), run.describe()
    assert_taken_out_by_lifeline(run, pod(1), [pod(0), pod(2)])
    for n in range(3):
        assert f"--rdzv-backend={backend.name} " in run.log(pod(n)), run.log(pod(n))[-3000:]
        assert_v3_only(run.log(pod(n)))
    assert_cleaned_up(run)


@pytest.mark.parametrize("backend", HERE)
def test_sigterm_spot_reclaim_checkpoints_and_loses_at_most_one_step(
    tmp_path: Path, backend: Backend
) -> None:
    run = run_local(
        tmp_path,
        f"--preempt={pod(2)}@step=8:15",
        command=probe_command(30, 10),
        sets=[*backend.sets, "worker.terminationGracePeriodSeconds=20"],
    )
    assert run.rc == 0, run.describe()
    assert_nothing_lost(run, 30)
    log2 = run.log(pod(2))
    assert re.search(r"^\[train\] sigterm step=(\d+)", log2, re.M), log2[-3000:]
    preempt = reform(run, f"preempt {pod(2)}")
    print(f"{backend.name}: re-form after SIGTERM of {pod(2)}: {preempt['seconds']} s")
    assert preempt["steps_lost"] is not None and preempt["steps_lost"] <= 1, preempt
    assert preempt["seconds"] is not None and preempt["seconds"] < REFORM_BOUND, preempt
    assert f"{pod(2)}: grace period over, SIGKILL" not in run.events()
    assert re.search(rf"elastic-worker: left rendezvous \S+ {backend.left}", log2), log2[-3000:]
    assert 2 in run.summary["world_sizes"], run.describe()
    assert_v3_only(log2)
    assert_cleaned_up(run)


@pytest.mark.parametrize("backend", HERE)
def test_three_pods_complete_and_the_spare_free_job_ends_cleanly(
    tmp_path: Path, backend: Backend
) -> None:
    run = run_local(tmp_path, command=probe_command(20, 5), sets=backend.sets)
    assert run.rc == 0, run.describe()
    assert_nothing_lost(run, 20)
    assert run.summary["world_sizes"][-1] == 3, run.describe()
    for n in range(3):
        p = run.summary["pods"][pod(n)]
        assert p["exit_code"] == 0 and p["restarts"] == 0, (pod(n), run.describe())
    assert run.summary["rendezvous_scaled_to_zero"] is True, run.describe()
    assert_cleaned_up(run)


@pytest.mark.parametrize("backend", HERE)
def test_scale_up_two_to_three_then_down_to_two_while_training(
    tmp_path: Path, backend: Backend
) -> None:
    run = run_local(
        tmp_path,
        "--scale=default=3@step=5",
        "--scale=default=2@world=3",  # once a step ran at three
        command=probe_command(40, 4),
        sets=[*backend.sets, "workerGroups.default.replicas=2"],
    )
    assert run.rc == 0, run.describe()
    assert_nothing_lost(run, 40)
    assert in_order(run.summary["world_sizes"], [2, 3, 2]), run.describe()
    assert run.steps_of(pod(2)), "the added pod trained"
    assert_cleaned_up(run)


@pytest.mark.parametrize("backend", HERE)
def test_four_replicas_with_max_three_the_spare_takes_a_lost_place_and_exits_zero(
    tmp_path: Path, backend: Backend
) -> None:
    run = run_local(
        tmp_path,
        "--scale=default=4@step=3",
        f"--kill={pod(0)}@step=12:20",
        command=probe_command(50, 5),
        sets=backend.sets,
        timeout=420,
    )
    assert run.rc == 0, run.describe()
    assert_nothing_lost(run, 50)
    assert max(run.summary["world_sizes"]) == 3, run.describe()
    first = re.search(r"^\[train\] .*$", run.log(pod(3)), re.M)
    assert first and first.group(0).startswith("[train] resumed"), run.log(pod(3))[-3000:]
    for n in range(4):
        last_run = run.log(pod(n)).rsplit("==== elastic-local: worker start", 1)[-1]
        if "[train] done" not in last_run:
            assert run.summary["pods"][pod(n)]["exit_code"] == 0, (n, run.describe())
    assert_cleaned_up(run)


@pytest.mark.parametrize("backend", HERE)
def test_restart_rendezvous_pod_the_job_recovers_and_completes(
    tmp_path: Path, backend: Backend
) -> None:
    """The bundled etcd's pod deleted and made again, empty: every lease and round is gone;
    the nodes join anew and the job completes."""
    run = run_local(
        tmp_path,
        "--restart-rendezvous@step=8",
        command=probe_command(30, 5),
        sets=backend.sets,
        timeout=420,
    )
    assert run.rc == 0, run.describe()
    assert_nothing_lost(run, 30)
    assert_cleaned_up(run)
