"""torchrun's command line and environment are pure functions of the Config."""

from __future__ import annotations

import pytest
from elastic_worker import exits
from elastic_worker.attempt_line import attempt_script
from elastic_worker.gate import netif
from elastic_worker.gate.netif import Choice
from elastic_worker.launch import argv as launch
from elastic_worker.settings import config
from torch.distributed.elastic.rendezvous.dynamic_rendezvous import DynamicRendezvousHandler
from torch.distributed.launcher.api import LaunchConfig

ENV = {
    "ELASTIC_JOB_ID": "default-run42",
    "ELASTIC_RDZV_ENDPOINT": "etcd.default.svc:2379",
    "ELASTIC_MIN_NODES": "2",
    "ELASTIC_MAX_NODES": "4",
    "ELASTIC_NPROC_PER_NODE": "8",
    "ELASTIC_MAX_RESTARTS": "6",
    "ELASTIC_RDZV_CONF": "last_call_timeout=3",
    "ELASTIC_MONITOR_INTERVAL": "0.5",
    "ELASTIC_INJECT_ENV": "/nonexistent",
    "POD_IP": "198.18.0.7",
}


def cfg(command: list[str], **extra: str) -> config.Config:
    return config.load(command, {**ENV, **extra})


def test_build_argv_is_the_full_torchrun_command() -> None:
    argv = launch.build_argv(
        cfg(["python", "/workspace/train.py", "--epochs", "3"]), "198.18.0.7", python="/py"
    )
    conf = ",".join(f"{k}={v}" for k, v in cfg(["x"]).rdzv_conf)
    assert argv == [
        "/py",
        "-m",
        # torch's torchrun, with the job's exit barrier timeout (launch/torchrun.py)
        "elastic_worker.launch.torchrun",
        "--exit-barrier-timeout=60",
        "--rdzv-backend=etcd-v2",
        "--rdzv-endpoint=etcd.default.svc:2379",
        "--rdzv-id=default-run42",
        "--nnodes=2:4",
        "--nproc-per-node=8",
        "--max-restarts=6",
        "--monitor-interval=0.5",
        f"--rdzv-conf={conf}",
        "--local-addr=198.18.0.7",
        # The attempt shim (tests/worker/test_attempt_line.py runs it), then the program
        # as torchrun itself would start it.
        "--no-python",
        "sh",
        "-c",
        attempt_script(None),
        "elastic-worker-attempt",
        "/py",
        "-u",
        "/workspace/train.py",
        "--epochs",
        "3",
    ]
    assert "last_call_timeout=3" in conf


@pytest.mark.parametrize(
    ("command", "expected"),
    [
        (["python", "train.py", "--x"], ["/py", "-u", "train.py", "--x"]),
        (["/usr/bin/python3.12", "train.py"], ["/py", "-u", "train.py"]),
        (
            ["python3", "-m", "pkg.train", "--lr", "1"],
            ["/py", "-u", "-m", "pkg.train", "--lr", "1"],
        ),
        (["python", "-u", "train.py"], ["python", "-u", "train.py"]),
        (["train.py", "--steps", "5"], ["/py", "-u", "train.py", "--steps", "5"]),
        (["/workspace/run.sh", "a"], ["/workspace/run.sh", "a"]),
    ],
)
def test_program_argv_is_what_torchrun_would_run(command: list[str], expected: list[str]) -> None:
    """torch.distributed.run without --no-python runs `sys.executable -u [-m] ...`."""
    assert launch.program_argv(command, "/py") == expected


def test_the_shim_keeps_pwd_as_torchrun_passes_it() -> None:
    assert attempt_script(None).endswith('unset PWD; exec "$@"')
    assert attempt_script("/work dir").endswith("PWD='/work dir'; exec \"$@\"")


@pytest.mark.parametrize(("grace", "timeout"), [(1, 1), (5, 3), (30, 25), (60, 50), (600, 590)])
def test_shutdown_timeout_leaves_a_margin_inside_the_grace_period(grace: int, timeout: int) -> None:
    assert launch.shutdown_timeout(grace) == timeout
    assert launch.shutdown_timeout(grace) < grace or grace == 1


def test_build_env_adds_interfaces_and_timeouts_but_keeps_what_the_user_set() -> None:
    choice = Choice("eth0", "198.18.0.7", "routes to the endpoint")
    env, added = launch.build_env(
        cfg(["t.py"], ELASTIC_GRACE_PERIOD="60"), choice, {"GLOO_SOCKET_IFNAME": "bond0", "A": "b"}
    )
    assert added == {
        "NCCL_SOCKET_IFNAME": "=eth0",
        "TORCH_ELASTIC_SHUTDOWN_TIMEOUT": "50",
        "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1",
        "PYTHONUNBUFFERED": "1",
    }
    assert env["GLOO_SOCKET_IFNAME"] == "bond0"
    assert env["A"] == "b"


def test_local_address_precedence() -> None:
    mesh = Choice("wg0", "198.19.1.1", "mesh")
    eth = Choice("eth0", "198.18.0.9", "route")
    assert netif.local_address(cfg(["t.py"], ELASTIC_LOCAL_ADDR="1.2.3.4"), mesh, True) == "1.2.3.4"
    assert netif.local_address(cfg(["t.py"]), mesh, True) == "198.19.1.1"
    assert netif.local_address(cfg(["t.py"]), eth, False) == "198.18.0.7"  # POD_IP
    assert netif.local_address(cfg(["t.py"], POD_IP=""), eth, False) == "198.18.0.9"
    assert netif.local_address(cfg(["t.py"], POD_IP=""), None, False) is None


def test_exit_code_maps_signals_like_a_shell() -> None:
    assert exits.from_returncode(-15) == 143
    assert exits.from_returncode(3) == 3


def test_torch_reads_the_variables_build_env_sets(monkeypatch: pytest.MonkeyPatch) -> None:
    """Pins the torch 2.13 behaviour the worker relies on
    (docs/notes/2026-11-21-torch-rendezvous-settings.md); fails loudly if it moves."""
    monkeypatch.setenv("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")
    handler = object.__new__(DynamicRendezvousHandler)
    assert handler.use_agent_store is False
    monkeypatch.setenv("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "17")
    assert LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=1).shutdown_timeout == 17


def test_build_argv_passes_the_backend_from_the_config() -> None:
    """ELASTIC_RDZV_BACKEND=etcd-v3: torchrun gets --rdzv-backend=etcd-v3, and torch's
    registry has that backend (the torch-etcd-v3 package's entry point)."""
    from torch.distributed.elastic.rendezvous import rendezvous_handler_registry  # noqa: PLC0415

    argv = launch.build_argv(cfg(["train.py"], ELASTIC_RDZV_BACKEND="etcd-v3"), None, python="/py")
    assert "--rdzv-backend=etcd-v3" in argv
    assert "--rdzv-backend=etcd-v2" not in argv
    assert "etcd-v3" in rendezvous_handler_registry._registry
