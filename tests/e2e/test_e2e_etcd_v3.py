"""The main fault scenarios with `--set global.rendezvousBackend=etcd-v3`: torchrun's
etcd-v3 backend (packages/torch-etcd-v3) and the worker's own keys on the v3 API, against
the chart's bundled etcd started by the local run from its rendered command, which then
has no v2 API (no --enable-v2; Debian's etcd 3.4 defaults to off, as 3.6 has none).

The job runs tests/e2e/user_script/api_probe.py, which asks that etcd from inside each
pod which APIs it serves before it runs the reference train.py: the proof that nothing
in the run could have used v2.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from localrun_e2e import (
    ETCD_POD,
    ROOT,
    assert_cleaned_up,
    assert_nothing_lost,
    assert_taken_out_by_lifeline,
    in_order,
    pod,
    reform,
    root_with_namespaces,
    run_local,
)

pytestmark = [
    pytest.mark.netns,
    pytest.mark.skipif(bool(root_with_namespaces()), reason=root_with_namespaces() or "ok"),
]

REFORM_BOUND = 120.0  # as tests/e2e/test_e2e_scenarios.py: the machine is shared
PROBE_DIR = ROOT / "tests" / "e2e" / "user_script"
V3_SETS = [
    "global.rendezvousBackend=etcd-v3",
    "worker.extraVolumes[0].name=user-script",
    f"worker.extraVolumes[0].hostPath.path={PROBE_DIR}",
    "worker.extraVolumeMounts[0].name=user-script",
    "worker.extraVolumeMounts[0].mountPath=/opt/user-script",
    "worker.extraVolumeMounts[0].readOnly=true",
]
PROBE = re.compile(r"^\[probe\] etcd (\S+): v2 API (.+), v3 API (.+)$", re.M)


def probe_command(steps: int, every: int, step_seconds: float = 0.5) -> list[str]:
    return [
        "python", "/opt/user-script/api_probe.py",
        "--steps", str(steps), "--checkpoint-every", str(every),
        "--step-seconds", str(step_seconds),
    ]  # fmt: skip


def assert_v3_only(log: str) -> None:
    """The pod's etcd answered 404 on v2 and its version on v3, every time it was asked."""
    found = PROBE.findall(log)
    assert found, log[-3000:]
    for endpoint, v2, v3 in found:
        assert endpoint.endswith(":2379") and "etcd-rendezvous" in endpoint, endpoint
        assert v2 == "HTTP 404", found
        assert v3.startswith("version 3."), found


@pytest.mark.slow
@pytest.mark.extended  # CI budget: a variant; the backend/TLS is covered by the SIGKILL scenario
def test_etcd_v3_three_pods_complete_on_an_etcd_without_v2(tmp_path: Path) -> None:
    run = run_local(tmp_path, command=probe_command(20, 5), sets=V3_SETS)
    assert run.rc == 0, run.describe()
    assert_nothing_lost(run, 20)
    s = run.summary
    assert s["world_sizes"][-1] == 3, run.describe()
    for n in range(3):
        assert_v3_only(run.log(pod(n)))
        assert "--rdzv-backend=etcd-v3 " in run.log(pod(n)), run.log(pod(n))[-3000:]
        p = s["pods"][pod(n)]
        assert p["exit_code"] == 0 and p["restarts"] == 0, (pod(n), run.describe())
    # The marker the worker set on v3, read by the run on v3; or the scale-down after it.
    assert s["etcd_complete"] in (True, None), run.describe()
    assert s["rendezvous_scaled_to_zero"] is True, run.describe()
    assert f"API: scale statefulset {ETCD_POD.removesuffix('-0')} to 0" in run.events()
    assert_cleaned_up(run)


@pytest.mark.slow
@pytest.mark.extended  # CI budget: test_e2e_tls's etcd-v3 scenario loses a node the same way
def test_etcd_v3_sigkill_one_pod_reforms_at_two_resumes_and_grows_back(tmp_path: Path) -> None:
    # As the etcd-v2 scenario: pod 1 SIGKILLed at step 8 and down 15 s.
    run = run_local(
        tmp_path, f"--kill={pod(1)}@step=8:15", command=probe_command(80, 5), sets=V3_SETS
    )
    assert run.rc == 0, run.describe()
    assert_nothing_lost(run, 80)
    s = run.summary
    kill = reform(run, f"kill {pod(1)}")
    print(f"etcd-v3: re-form after SIGKILL of {pod(1)}: {kill['seconds']} s")
    assert kill["world_size"] == 2, run.describe()
    assert kill["seconds"] is not None and kill["seconds"] < REFORM_BOUND, kill
    # train.py keeps snapshots: the survivors resume at the step before the kill, from
    # memory, as in the etcd-v2 scenario (was: the last checkpoint)
    assert kill["state_from"] in ("peer-memory", "local-memory"), kill
    assert kill["steps_lost"] == 0, kill
    assert in_order(s["world_sizes"], [3, 2, 3]), run.describe()
    assert_taken_out_by_lifeline(run, pod(1), [pod(0), pod(2)])
    log1 = run.log(pod(1))
    assert log1.count("==== elastic-local: worker start") >= 2
    assert re.search(r"^\[train\] resumed step=\d+", log1, re.M), "pod 1 rejoined from a checkpoint"
    for n in range(3):
        assert_v3_only(run.log(pod(n)))
    assert_cleaned_up(run)


@pytest.mark.slow
@pytest.mark.extended  # CI budget: a variant; the backend/TLS is covered by the SIGKILL scenario
def test_etcd_v3_sigterm_spot_reclaim_checkpoints_and_loses_at_most_one_step(
    tmp_path: Path,
) -> None:
    grace = 20
    run = run_local(
        tmp_path,
        f"--preempt={pod(2)}@step=8:15",
        command=probe_command(30, 10),
        sets=[*V3_SETS, f"worker.terminationGracePeriodSeconds={grace}"],
    )
    assert run.rc == 0, run.describe()
    assert_nothing_lost(run, 30)
    log2 = run.log(pod(2))
    m = re.search(r"^\[train\] sigterm step=(\d+)", log2, re.M)
    assert m, f"pod 2 did not report SIGTERM\n{log2[-3000:]}"
    preempt = reform(run, f"preempt {pod(2)}")
    assert preempt["steps_lost"] is not None and preempt["steps_lost"] <= 1, preempt
    assert preempt["seconds"] is not None and preempt["seconds"] < REFORM_BOUND, preempt
    assert f"{pod(2)}: grace period over, SIGKILL" not in run.events()
    assert re.search(r"elastic-worker: left rendezvous \S+ \(participants of round", log2), log2
    assert 2 in run.summary["world_sizes"], run.describe()
    assert_v3_only(log2)
    assert_cleaned_up(run)


@pytest.mark.slow
@pytest.mark.extended  # CI budget: a variant; the backend/TLS is covered by the SIGKILL scenario
def test_etcd_v3_scale_up_two_to_three_then_down_to_two_while_training(tmp_path: Path) -> None:
    run = run_local(
        tmp_path,
        "--scale=default=3@step=5",
        "--scale=default=2@world=3",  # once a step ran at three
        command=probe_command(40, 4),
        sets=[*V3_SETS, "workerGroups.default.replicas=2"],
    )
    assert run.rc == 0, run.describe()
    assert_nothing_lost(run, 40)
    assert in_order(run.summary["world_sizes"], [2, 3, 2]), run.describe()
    assert run.steps_of(pod(2)), "the added pod trained"
    assert_v3_only(run.log(pod(2)))
    assert_cleaned_up(run)
