"""The mini-cluster's pod lifecycle (StatefulSet controller, scheduler, kubelet) on an
in-memory container runtime: no root, no processes, time given by the test."""

from __future__ import annotations

from pathlib import Path

import pytest
from localrun_fakes import NODES, Harness, statefulset

from localrun.cluster.pod import Backoff, LifecycleError, Phase, Pod


def phase(pod: Pod) -> Phase:
    """The pod's phase now (a call, so that a type checker does not narrow it)."""
    return pod.phase


def test_init_container_first_then_the_main_one_with_the_kubelets_env(tmp_path: Path) -> None:
    h = Harness(tmp_path, statefulset())
    h.tick(0)
    assert [p.name for p in h.cluster.pods()] == ["w-0", "w-1"]
    w0 = h.pod("w-0")
    assert phase(w0) is Phase.INIT and w0.node in NODES and w0.ip
    # the pods' names resolve before any container starts
    assert "w-1.w-headless.ns.svc.cluster.local" in h.runtime.hosts["w-0"]
    h.runtime.running("w-0", "init").rc = 0
    h.tick(1)
    assert phase(w0) is Phase.RUNNING
    main = h.runtime.running("w-0", "main")
    assert main.spec.argv == ["train", "w-0"]  # $(POD_NAME) from the downward API
    assert main.spec.env["HOSTNAME"] == "w-0" and main.spec.env["PATH"] == "/bin"
    assert main.spec.log_path == tmp_path / "logs" / "w-0" / "main.log"
    assert h.exits == [("w-0", "init", 0)]


def test_a_failing_container_restarts_after_a_doubling_back_off(tmp_path: Path) -> None:
    h = Harness(tmp_path, statefulset(replicas=1))
    h.tick(0)
    h.runtime.running("w-0", "init").rc = 0
    h.tick(0)
    h.runtime.running("w-0", "main").rc = 1
    h.tick(1)
    w0 = h.pod("w-0")
    assert phase(w0) is Phase.BACKOFF and w0.last_exit == 1 and w0.failures_in_row == 1
    assert "restart in 2s" in w0.message
    h.tick(2.9)
    assert phase(w0) is Phase.BACKOFF
    h.tick(3)
    assert phase(w0) is Phase.RUNNING and w0.restarts == 1
    h.runtime.running("w-0", "main").rc = 1
    h.tick(4)
    h.tick(7.9)
    assert phase(w0) is Phase.BACKOFF  # 4 s the second time
    h.tick(8)
    assert phase(w0) is Phase.RUNNING and w0.restarts == 2
    h.runtime.running("w-0", "main").rc = 0
    h.tick(9)
    assert w0.failures_in_row == 0 and w0.zero_exit_at == 9


def test_a_deleted_pod_gets_sigkill_after_its_grace_and_comes_back_later(tmp_path: Path) -> None:
    h = Harness(tmp_path, statefulset(replicas=1, grace=5))
    h.tick(0)
    h.runtime.running("w-0", "init").rc = 0
    h.tick(0)
    main = h.runtime.running("w-0", "main")
    main.exit_on_term = None  # ignores SIGTERM
    h.cluster.delete(h.pod("w-0"), 1, down=20)
    assert phase(h.pod("w-0")) is Phase.TERMINATING and main.signals == ["TERM"]
    h.tick(5.9)
    assert main.signals == ["TERM"]
    h.tick(6)
    assert main.signals == ["TERM", "KILL"]
    h.tick(6.1)
    assert "w-0: deleted" in h.events and "w-0" not in h.runtime.sandboxes
    h.tick(6.2)
    new = h.pod("w-0")  # the StatefulSet made it again, with the same name
    assert new.incarnation == 2 and phase(new) is Phase.PENDING and not new.node
    h.tick(20.9)
    assert new.message.startswith("waiting for a node") and not new.node
    h.tick(21)
    assert phase(new) is Phase.INIT and h.runtime.sandboxes["w-0"] == 2


def test_scaling_down_deletes_the_highest_ordinals(tmp_path: Path) -> None:
    h = Harness(tmp_path, statefulset(replicas=3))
    h.tick(0)
    h.cluster.scale("w", 1)
    h.tick(1)  # SIGTERM: the init containers exit 0 at once
    h.tick(2)
    assert [p.name for p in h.cluster.pods()] == ["w-0"]
    assert "statefulset w: replicas 3 -> 1" in h.events
    h.cluster.scale("w", 0)
    h.tick(3)
    h.tick(4)
    assert h.cluster.pods() == []


def test_kill_restarts_the_container_not_before_its_down_time(tmp_path: Path) -> None:
    h = Harness(tmp_path, statefulset(replicas=1))
    h.tick(0)
    h.runtime.running("w-0", "init").rc = 0
    h.tick(0)
    main = h.runtime.running("w-0", "main")
    h.cluster.kill(h.pod("w-0"), 1, down=10)
    assert main.signals == ["KILL"]
    h.tick(1)
    w0 = h.pod("w-0")
    assert phase(w0) is Phase.BACKOFF and w0.last_exit == 137 and w0.incarnation == 1
    h.tick(10.9)
    assert phase(w0) is Phase.BACKOFF
    h.tick(11)
    assert phase(w0) is Phase.RUNNING and w0.restarts == 1


def test_a_pod_that_fits_no_node_stays_pending_with_the_schedulers_reason(
    tmp_path: Path,
) -> None:
    big = statefulset(replicas=1)
    big["spec"]["template"]["spec"]["containers"][0]["resources"] = {"requests": {"cpu": "8"}}
    h = Harness(tmp_path, big)
    h.tick(0)
    w0 = h.pod("w-0")
    assert phase(w0) is Phase.PENDING and not w0.node
    assert w0.message == "0/2 nodes are available: 2 node(s) Insufficient cpu."
    assert h.runtime.containers == []


def test_a_container_whose_config_cannot_be_built_does_not_start(tmp_path: Path) -> None:
    sts = statefulset(replicas=1)
    sts["spec"]["template"]["spec"]["initContainers"][0]["env"] = [
        {"name": "X", "valueFrom": {"configMapKeyRef": {"name": "missing", "key": "k"}}}
    ]
    h = Harness(tmp_path, sts)
    h.tick(0)
    w0 = h.pod("w-0")
    assert phase(w0) is Phase.BACKOFF
    assert w0.message.startswith("CreateContainerConfigError: env X: ConfigMap 'missing'")
    assert h.runtime.containers == []


def test_stop_ends_every_container_and_removes_the_pods(tmp_path: Path) -> None:
    h = Harness(tmp_path, statefulset(replicas=2))
    h.tick(0)
    for n in range(2):
        h.runtime.running(f"w-{n}", "init").rc = 0
    h.tick(1)
    stubborn = h.runtime.running("w-1", "main")
    stubborn.exit_on_term = None
    codes = h.cluster.stop(grace=0)
    assert codes == {"w-0": 0, "w-1": 137}
    assert stubborn.signals == ["TERM", "KILL"]
    assert h.cluster.pods() == [] and h.runtime.sandboxes == {}


def test_the_lifecycle_refuses_a_phase_change_it_does_not_list(tmp_path: Path) -> None:
    h = Harness(tmp_path, statefulset(replicas=1))
    h.tick(0)
    w0 = h.pod("w-0")
    with pytest.raises(LifecycleError, match="Init -> Pending"):
        w0.enter(Phase.PENDING)
    w0.enter(Phase.GONE)
    with pytest.raises(LifecycleError):
        w0.enter(Phase.RUNNING)


def test_backoff_doubles_up_to_the_cap() -> None:
    b = Backoff(base=10, cap=60, reset_after=600)
    assert [b.next_delay(1) for _ in range(6)] == [10, 20, 40, 60, 60, 60]


def test_backoff_resets_after_a_long_run() -> None:
    b = Backoff(base=1, cap=8, reset_after=30)
    assert [b.next_delay(1) for _ in range(3)] == [1, 2, 4]
    assert b.next_delay(31) == 1
    assert b.next_delay(1) == 2
