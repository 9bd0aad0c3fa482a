"""The readiness gate: every wait is bounded and says what it still waits for."""

from __future__ import annotations

import base64
import contextlib
import http.server
import json
import logging
import subprocess
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from elastic_worker import timings
from elastic_worker.gate import wait as gate
from testlib import EtcdServer, free_port

from localrun.cluster.apiserver import FakeApiServer
from worker.worker_helpers import WORKER, worker_env


def test_wait_returns_once_every_check_passes() -> None:
    calls = {"n": 0}

    def flaky() -> gate.CheckResult:
        calls["n"] += 1
        return calls["n"] >= 3, "not yet"

    gate.wait([gate.Check("a", lambda: (True, "")), gate.Check("b", flaky)], 5, poll_every=0.01)
    assert calls["n"] == 3


def test_wait_times_out_naming_the_first_missing_check_and_the_rest(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="elastic_worker")
    checks = [
        gate.Check("DNS name etcd", lambda: (True, "")),
        gate.Check("etcd v2 API", lambda: (False, "connection refused")),
        gate.Check("2 peers", lambda: (True, "")),
    ]
    start = time.monotonic()
    with pytest.raises(gate.GateTimeout) as info:
        gate.wait(checks, 1.0, progress_every=0.3, poll_every=0.05)
    assert 1.0 <= time.monotonic() - start < 3
    assert str(info.value) == (
        "readiness gate timed out after 1 s waiting for: etcd v2 API (connection refused); 2 peers"
    )
    progress = [r.getMessage() for r in caplog.records if r.getMessage().startswith("waiting")]
    assert 2 <= len(progress) <= 4
    assert "etcd v2 API (connection refused); then 2 peers" in progress[0]


def test_a_signal_interrupts_the_wait() -> None:
    stop = threading.Event()
    threading.Timer(0.2, stop.set).start()
    with pytest.raises(gate.Interrupted):
        gate.wait([gate.Check("never", lambda: (False, ""))], 30, stop=stop)


def run_worker(env: dict[str, str], timeout: float = 60) -> tuple[int, list[str], float]:
    start = time.monotonic()
    result = subprocess.run(  # noqa: PLW1510 - the code is asserted
        [str(WORKER), "python", "train.py"],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    return result.returncode, result.stderr.strip().splitlines(), time.monotonic() - start


def test_an_etcd_without_v2_is_one_line_and_exit_4_at_once(
    etcd_factory: Callable[..., EtcdServer],
) -> None:
    etcd = etcd_factory(v2=False)
    code, lines, took = run_worker(worker_env(etcd.endpoint, "nov2", ELASTIC_GATE_TIMEOUT="120"))
    assert code == 4
    errors = [line for line in lines if "v2" in line]
    assert len(errors) == 1, lines
    assert errors[0].startswith(f"elastic-worker: rendezvous endpoint http://{etcd.endpoint} ")
    assert "has no etcd v2 API (etcd 3.4" in errors[0]
    assert "etcd 3.6 removed the v2 API" in errors[0]
    assert took < 30  # at once, not after the 120 s gate timeout


def test_the_etcd_v2_backend_on_an_etcd_without_v2_says_to_switch_to_etcd_v3(
    etcd_factory: Callable[..., EtcdServer],
) -> None:
    """The one line names the endpoint, the backend and both fixes."""
    etcd = etcd_factory(v2=False)
    code, lines, _ = run_worker(worker_env(etcd.endpoint, "nov2fix", ELASTIC_GATE_TIMEOUT="60"))
    assert code == 4
    (line,) = [line for line in lines if "v2 API" in line]
    assert f"http://{etcd.endpoint}" in line
    assert "the etcd-v2 backend needs" in line
    assert "set global.rendezvousBackend=etcd-v3" in line
    assert "run etcd 3.5 with --enable-v2=true" in line


def test_the_etcd_v3_backend_passes_the_gate_on_an_etcd_without_v2(
    etcd_factory: Callable[..., EtcdServer],
) -> None:
    """ELASTIC_RDZV_BACKEND=etcd-v3 on an etcd with the v2 API off: the gate probes the v3
    API, passes, and the peer gate registers this pod with a lease (exit 3 only because
    the second peer never comes)."""
    etcd = etcd_factory(v2=False)
    env = worker_env(
        etcd.endpoint,
        "v3gate",
        ELASTIC_RDZV_BACKEND="etcd-v3",
        ELASTIC_GATE_PEERS="true",
        ELASTIC_GATE_TIMEOUT="4",
        POD_NAME="v3gate-worker-0",
        POD_IP="198.18.0.9",
    )
    code, lines, _ = run_worker(env)
    assert code == 3
    assert lines[-1].endswith("waiting for: 2 peers (1 of 2 registered)"), lines
    assert not [line for line in lines if "v2" in line], lines
    key = base64.b64encode(b"/elastic-job/v3gate/members/v3gate-worker-0").decode()
    req = urllib.request.Request(f"{etcd.url}/v3/kv/range", json.dumps({"key": key}).encode())
    with urllib.request.urlopen(req, timeout=5) as resp:
        (kv,) = json.load(resp)["kvs"]
    member = json.loads(base64.b64decode(kv["value"]))  # docs/contracts.md: the member value
    assert member["ip"] == "198.18.0.9"
    assert int(kv["lease"]) != 0  # gone with its lease when the pod stops renewing it


def test_the_etcd_v3_backend_on_an_endpoint_without_v3_is_one_line_and_exit_4() -> None:
    """An HTTP server that 404s the v3 gateway (etcd before 3.4, or not etcd): exit 4 at
    once, one line naming the endpoint, the backend and the fixes."""
    with _not_found_server() as port:
        env = worker_env(
            f"127.0.0.1:{port}", "nov3", ELASTIC_RDZV_BACKEND="etcd-v3", ELASTIC_GATE_TIMEOUT="60"
        )
        code, lines, took = run_worker(env)
    assert code == 4
    (line,) = [line for line in lines if "v3 API" in line]
    assert line.startswith(f"elastic-worker: rendezvous endpoint http://127.0.0.1:{port} ")
    assert "has no etcd v3 API" in line
    assert "the etcd-v3 backend needs: run etcd 3.4 or newer" in line
    assert "global.rendezvousBackend=etcd-v2" in line
    assert took < 30


@contextlib.contextmanager
def _not_found_server() -> Iterator[int]:
    class NotFound(http.server.BaseHTTPRequestHandler):
        def _404(self) -> None:
            self.send_response(404)
            self.end_headers()
            self.wfile.write(b"404 page not found\n")

        do_GET = do_POST = _404

        def log_message(self, *_: object) -> None:
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), NotFound)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        yield httpd.server_address[1]
    finally:
        httpd.shutdown()


def test_an_etcd_that_does_not_answer_times_out_with_exit_3() -> None:
    port = free_port()
    env = worker_env(f"127.0.0.1:{port}", "down", ELASTIC_GATE_TIMEOUT="2")
    code, lines, took = run_worker(env)
    assert code == 3
    assert lines[-1].startswith(
        "elastic-worker: readiness gate timed out after 2 s waiting for: "
        f"etcd v2 API at 127.0.0.1:{port}"
    ), lines
    assert took < 30


def test_a_name_that_does_not_resolve_times_out_naming_it() -> None:
    env = worker_env("etcd.nowhere.invalid:2379", "dns", ELASTIC_GATE_TIMEOUT="2")
    code, lines, _ = run_worker(env)
    assert code == 3
    assert "waiting for: DNS name etcd.nowhere.invalid (" in lines[-1]
    assert lines[-1].endswith("; etcd v2 API at etcd.nowhere.invalid:2379"), lines


def test_the_peer_gate_registers_with_a_ttl_and_waits_for_min_nodes(etcd: EtcdServer) -> None:
    env = worker_env(
        etcd.endpoint,
        "peers",
        ELASTIC_GATE_PEERS="true",
        ELASTIC_GATE_TIMEOUT="3",
        POD_NAME="peers-worker-0",
        POD_IP="198.18.0.9",
    )
    code, lines, _ = run_worker(env)
    assert code == 3
    assert lines[-1].endswith("waiting for: 2 peers (1 of 2 registered)"), lines
    url = f"{etcd.url}/v2/keys/elastic-job/peers/members/peers-worker-0"
    with urllib.request.urlopen(url, timeout=5) as resp:
        node = json.loads(resp.read())["node"]
    assert 0 < node["ttl"] <= timings.MEMBER_TTL
    member = json.loads(node["value"])  # docs/contracts.md: the member value
    assert (member["ip"], member["addr"]) == ("198.18.0.9", "127.0.0.1")


def test_the_mesh_gate_waits_for_a_mesh_interface(etcd: EtcdServer, tmp_path: Path) -> None:
    env = worker_env(
        etcd.endpoint,
        "mesh",
        ELASTIC_MESH_REQUIRED="true",
        ELASTIC_MESH_INTERFACES="meshtest-none*",
        ELASTIC_GATE_TIMEOUT="2",
    )
    code, lines, _ = run_worker(env)
    assert code == 3
    assert lines[-1].endswith(
        "waiting for: mesh interface (no up interface matches meshtest-none*)"
    ), lines


def test_a_pod_that_finds_its_rendezvous_scaled_to_0_exits_0_at_once(tmp_path: Path) -> None:
    """After completion the job scales its etcd to 0 last; a pod that starts later (Argo CD
    restoring replicas, a kubelet restart) cannot reach etcd, reads the scale, exits 0."""
    with FakeApiServer(workdir=tmp_path / "api") as api:
        api.add_statefulset("default", "late-etcd", replicas=0)
        env = worker_env(
            f"127.0.0.1:{free_port()}",
            "late",
            ELASTIC_GATE_TIMEOUT="120",
            ELASTIC_SCALE_DOWN="true",
            ELASTIC_RENDEZVOUS_STATEFULSET="late-etcd",
            ELASTIC_SERVICEACCOUNT_DIR=str(api.serviceaccount_dir),
            POD_NAMESPACE="default",
            **api.env(),
        )
        code, lines, took = run_worker(env)
    assert code == 0, lines
    assert "rendezvous StatefulSet late-etcd was scaled to 0" in lines[-1], lines
    assert took < 30  # not after the 120 s gate timeout


def test_a_rendezvous_still_scaled_up_keeps_the_gate_waiting(tmp_path: Path) -> None:
    with FakeApiServer(workdir=tmp_path / "api") as api:
        api.add_statefulset("default", "up-etcd", replicas=1)
        env = worker_env(
            f"127.0.0.1:{free_port()}",
            "up",
            ELASTIC_GATE_TIMEOUT="3",
            ELASTIC_SCALE_DOWN="true",
            ELASTIC_RENDEZVOUS_STATEFULSET="up-etcd",
            ELASTIC_SERVICEACCOUNT_DIR=str(api.serviceaccount_dir),
            POD_NAMESPACE="default",
            **api.env(),
        )
        code, lines, _ = run_worker(env)
    assert code == 3, lines
