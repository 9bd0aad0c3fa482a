"""The chart's settings become one frozen Config; a bad one is one line and exit 2."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest
from elastic_worker.settings import config

from worker.worker_helpers import WORKER

BASE = {
    "ELASTIC_JOB_ID": "default-run42",
    "ELASTIC_RDZV_ENDPOINT": "run42-etcd-rendezvous.default.svc.cluster.local:2379",
    "ELASTIC_MIN_NODES": "2",
    "ELASTIC_MAX_NODES": "4",
    "ELASTIC_INJECT_ENV": "/nonexistent/env",
    "POD_NAME": "run42-worker-0",
    "POD_NAMESPACE": "default",
}


def load(**overrides: str | None) -> config.Config:
    env = {**BASE}
    for key, value in overrides.items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    return config.load(["python", "train.py"], env)


def test_defaults_fill_everything_the_chart_may_leave_out() -> None:
    cfg = load()
    assert cfg.endpoint == config.Endpoint("run42-etcd-rendezvous.default.svc.cluster.local", 2379)
    assert (cfg.min_nodes, cfg.max_nodes, cfg.nproc_per_node) == (2, 4, "1")
    assert cfg.max_restarts == 20
    assert dict(cfg.rdzv_conf) == {
        "join_timeout": "600",
        "last_call_timeout": "1",
        "close_timeout": "10",
        "keep_alive_interval": "1",
        "keep_alive_max_attempt": "3",
        "heartbeat_timeout": "5",
    }
    assert cfg.monitor_interval == 0.1
    # The chart's defaults (tests/charts/test_worker_env_settings.py checks them against a render).
    assert (cfg.gate_timeout, cfg.grace_period, cfg.gate_peers) == (600, 90, True)
    assert cfg.mesh_interfaces == ("wg*",)
    assert cfg.tls is None and cfg.rdzv_url.startswith("http://")
    assert cfg.key_prefix == "/elastic-job/default-run42"
    assert cfg.command == ("python", "train.py")
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.job_id = "x"  # type: ignore[misc]


@pytest.mark.parametrize(
    ("max_nodes", "interval"), [("4", "1"), ("32", "1"), ("33", "2"), ("128", "4"), ("256", "8")]
)
def test_keep_alive_interval_scales_with_max_nodes(max_nodes: str, interval: str) -> None:
    """Up to 32 nodes heartbeat every second; a larger job every ELASTIC_MAX_NODES / 32 s,
    so the one rendezvous key takes ~32 heartbeat writes a second
    (docs/notes/2026-11-25-rendezvous-at-scale.md)."""
    assert dict(load(ELASTIC_MAX_NODES=max_nodes).rdzv_conf)["keep_alive_interval"] == interval


@pytest.mark.parametrize("max_nodes", ["4", "256", "1024"])
def test_etcd_lease_heartbeats_every_second_at_every_size(max_nodes: str) -> None:
    """etcd-lease's heartbeat is a lease keep-alive that no other write contends with
    (docs/rendezvous.md): 1 s whatever ELASTIC_MAX_NODES, a silent node out after 3 s."""
    cfg = load(ELASTIC_RDZV_BACKEND="etcd-lease", ELASTIC_MAX_NODES=max_nodes)
    assert dict(cfg.rdzv_conf)["keep_alive_interval"] == "1"


def test_a_given_keep_alive_interval_wins_over_the_scaled_default() -> None:
    cfg = load(ELASTIC_MAX_NODES="256", ELASTIC_RDZV_CONF="keep_alive_interval=2")
    assert dict(cfg.rdzv_conf)["keep_alive_interval"] == "2"


def test_every_setting_is_read() -> None:
    cfg = load(
        ELASTIC_NPROC_PER_NODE="8",
        ELASTIC_MAX_RESTARTS="5",
        ELASTIC_RDZV_CONF="last_call_timeout=5, read_timeout=30",
        ELASTIC_MONITOR_INTERVAL="1.5",
        ELASTIC_GATE_TIMEOUT="120",
        ELASTIC_GATE_PEERS="true",
        ELASTIC_MESH_INTERFACES="wg*, tailscale0",
        ELASTIC_MESH_REQUIRED="True",
        ELASTIC_GRACE_PERIOD="90",
        ELASTIC_SCALE_DOWN="true",
        ELASTIC_STATEFULSETS_FILE="/etc/elastic-job/release/statefulsets",
        POD_IP="198.18.0.5",
    )
    assert cfg.nproc_per_node == "8"
    assert cfg.max_restarts == 5
    conf = dict(cfg.rdzv_conf)
    assert conf["last_call_timeout"] == "5"  # the chart's value wins over the default
    assert conf["read_timeout"] == "30"
    assert conf["keep_alive_interval"] == "1"  # the default's, for a key not given
    assert cfg.monitor_interval == 1.5
    assert cfg.gate_timeout == 120
    assert cfg.gate_peers and cfg.mesh_required and cfg.scale_down
    assert cfg.mesh_interfaces == ("wg*", "tailscale0")
    assert cfg.grace_period == 90
    assert cfg.statefulsets_file == Path("/etc/elastic-job/release/statefulsets")
    assert cfg.pod_ip == "198.18.0.5"


def test_the_statefulsets_file_is_read_when_asked_one_name_a_line(tmp_path: Path) -> None:
    """ELASTIC_STATEFULSETS_FILE (the chart's ConfigMap, mounted): read at each use, so
    what the kubelet wrote since start (a group an upgrade added) counts."""
    listing = tmp_path / "statefulsets"
    listing.write_text("run42-worker-a\n")
    cfg = load(ELASTIC_STATEFULSETS_FILE=str(listing))
    assert config.read_statefulsets(cfg.statefulsets_file) == ("run42-worker-a",)
    listing.write_text("run42-worker-a\nrun42-worker-b\n")
    assert config.read_statefulsets(cfg.statefulsets_file) == ("run42-worker-a", "run42-worker-b")
    assert config.read_statefulsets(load().statefulsets_file) == ()


def test_a_statefulsets_file_that_cannot_be_used_is_said_naming_it(tmp_path: Path) -> None:
    listing = tmp_path / "statefulsets"
    listing.write_text("run42-worker-a\nBad_Name\n")
    with pytest.raises(config.ConfigError, match=r"ELASTIC_STATEFULSETS_FILE=.*'Bad_Name' is not"):
        config.read_statefulsets(listing)
    with pytest.raises(config.ConfigError, match=r"ELASTIC_STATEFULSETS_FILE=.*cannot read it"):
        config.read_statefulsets(tmp_path / "missing")


@pytest.mark.parametrize(
    ("raw", "host", "port"),
    [
        ("etcd:2379", "etcd", 2379),
        ("http://10.0.0.1:2379/", "10.0.0.1", 2379),
        ("[fd00::1]:2379", "fd00::1", 2379),
    ],
)
def test_endpoint_forms(raw: str, host: str, port: int) -> None:
    assert config.parse_endpoint(raw) == config.Endpoint(host, port)


@pytest.mark.parametrize(
    ("overrides", "names"),
    [
        ({"ELASTIC_JOB_ID": None}, "ELASTIC_JOB_ID is not set"),
        ({"ELASTIC_JOB_ID": "a/b"}, "ELASTIC_JOB_ID='a/b'"),
        ({"ELASTIC_RDZV_ENDPOINT": None}, "ELASTIC_RDZV_ENDPOINT is not set"),
        ({"ELASTIC_RDZV_ENDPOINT": "etcd"}, "ELASTIC_RDZV_ENDPOINT='etcd' is not host:port"),
        ({"ELASTIC_RDZV_ENDPOINT": "etcd:99999"}, "ELASTIC_RDZV_ENDPOINT"),
        ({"ELASTIC_MIN_NODES": None}, "ELASTIC_MIN_NODES is not set"),
        ({"ELASTIC_MAX_NODES": None}, "ELASTIC_MAX_NODES is not set"),
        ({"ELASTIC_MIN_NODES": "two"}, "ELASTIC_MIN_NODES='two' is not an integer"),
        ({"ELASTIC_MIN_NODES": "0"}, "ELASTIC_MIN_NODES=0 is below 1"),
        ({"ELASTIC_MAX_NODES": "1"}, "ELASTIC_MAX_NODES=1 is below ELASTIC_MIN_NODES=2"),
        ({"ELASTIC_NPROC_PER_NODE": "0"}, "ELASTIC_NPROC_PER_NODE='0'"),
        ({"ELASTIC_MAX_RESTARTS": "-1"}, "ELASTIC_MAX_RESTARTS=-1 is below 0"),
        ({"ELASTIC_RDZV_CONF": "last_call_timeout"}, "ELASTIC_RDZV_CONF: 'last_call_timeout'"),
        ({"ELASTIC_RDZV_CONF": "lastcall=2"}, "unknown key 'lastcall'"),
        ({"ELASTIC_MONITOR_INTERVAL": "0"}, "ELASTIC_MONITOR_INTERVAL='0'"),
        ({"ELASTIC_GATE_TIMEOUT": "soon"}, "ELASTIC_GATE_TIMEOUT='soon'"),
        ({"ELASTIC_GATE_PEERS": "maybe"}, "ELASTIC_GATE_PEERS='maybe' is not a boolean"),
        ({"ELASTIC_GRACE_PERIOD": "0"}, "ELASTIC_GRACE_PERIOD=0"),
        (
            {"ELASTIC_RDZV_BACKEND": "etcd-v4"},
            "ELASTIC_RDZV_BACKEND='etcd-v4' is not a rendezvous backend: use etcd-v2, etcd-v3 "
            "or etcd-lease",
        ),
        # lease_ttl is the etcd-v3 handler's; torch's etcd-v2 would ignore it silently.
        ({"ELASTIC_RDZV_CONF": "lease_ttl=30"}, "torch's etcd-v2 reads:"),
        # is_host is etcd-v2's; the etcd-v3 handler has no such key.
        (
            {"ELASTIC_RDZV_BACKEND": "etcd-v3", "ELASTIC_RDZV_CONF": "is_host=1"},
            "unknown key 'is_host'; torch-etcd-v3's etcd-v3 reads:",
        ),
    ],
)
def test_a_bad_setting_names_itself(overrides: dict[str, str | None], names: str) -> None:
    with pytest.raises(config.ConfigError) as info:
        load(**overrides)
    message = str(info.value)
    assert names in message
    assert "\n" not in message


def test_the_env_file_fills_only_what_the_pod_spec_left_unset(tmp_path: Path) -> None:
    inject = tmp_path / "env"
    inject.write_text("ELASTIC_MAX_RESTARTS='7'\nELASTIC_MIN_NODES='9'\nNCCL_IB_HCA='mlx5'\n")
    env = {**BASE, "ELASTIC_INJECT_ENV": str(inject)}
    cfg = config.load(["train.py"], env)
    assert cfg.max_restarts == 7  # absent from the environment: taken from the file
    assert cfg.min_nodes == 2  # set in the environment: the file does not override it
    assert env["NCCL_IB_HCA"] == "mlx5"


def test_a_malformed_env_file_is_a_config_error_naming_the_line(tmp_path: Path) -> None:
    inject = tmp_path / "env"
    inject.write_text("A='1'\nB=oops\n")
    with pytest.raises(config.ConfigError, match=r"env:2: B: .*single-quoted"):
        config.load(["train.py"], {**BASE, "ELASTIC_INJECT_ENV": str(inject)})


def test_the_command_is_required() -> None:
    with pytest.raises(config.ConfigError, match="no training command"):
        config.load([], dict(BASE))


def test_the_console_script_prints_one_line_and_exits_2(tmp_path: Path) -> None:
    (tmp_path / "env").write_text("ZONE='a'\n")
    env = {k: v for k, v in BASE.items() if k != "ELASTIC_MIN_NODES"}
    env["ELASTIC_INJECT_ENV"] = str(tmp_path / "env")
    result = subprocess.run(  # noqa: PLW1510 - the code is asserted
        [str(WORKER), "python", "train.py"], env=env, capture_output=True, text=True, timeout=30
    )
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert lines == [
        "elastic-worker: ELASTIC_MIN_NODES is not set: give an integer >= 1",
    ], result.stderr


def test_a_python_without_torch_is_an_image_that_cannot_run_the_worker() -> None:
    """The entrypoint under an interpreter that cannot import torch (system python): exit 5,
    exits.IMAGE (elastic_worker/image.py), not a setting."""
    python = "/usr/bin/python3"
    probe = subprocess.run([python, "-c", "import torch"], capture_output=True, check=False)
    if probe.returncode == 0:
        pytest.skip(f"{python} has torch")
    src = WORKER.parents[2] / "images" / "worker" / "src"
    env = {**BASE, "PYTHONPATH": str(src), "PATH": "/usr/bin:/bin"}
    code = "import sys; from elastic_worker.main import main; sys.exit(main())"
    result = subprocess.run(  # noqa: PLW1510 - the code is asserted
        [python, "-c", code, "python", "train.py"],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 5, result.stderr
    assert f"elastic-worker: torch is not installed for {python}" in result.stderr


def test_the_backend_defaults_to_etcd_v2_and_takes_etcd_v3_and_etcd_lease() -> None:
    assert load().rdzv_backend == "etcd-v2"
    assert load(ELASTIC_RDZV_BACKEND="etcd-v3").rdzv_backend == "etcd-v3"
    assert load(ELASTIC_RDZV_BACKEND="etcd-lease").rdzv_backend == "etcd-lease"


def test_etcd_lease_takes_the_keys_of_torch_etcd_v3() -> None:
    """etcd-lease is torch_etcd_v3's too: the same connection keys (TLS, user, key_prefix)
    and torch's timing keys, which it reads itself."""
    from torch_etcd_v3.config import KEYS  # noqa: PLC0415

    assert config.rdzv_keys("etcd-lease") == KEYS


def test_etcd_v3_takes_exactly_the_keys_its_handler_reads() -> None:
    """With etcd-v3, ELASTIC_RDZV_CONF accepts the keys torch_etcd_v3 reads (its config.KEYS:
    its own and those torch's dynamic rendezvous reads), e.g. lease_ttl and user."""
    from torch_etcd_v3.config import KEYS  # noqa: PLC0415

    assert config.rdzv_keys("etcd-v3") == KEYS
    cfg = load(ELASTIC_RDZV_BACKEND="etcd-v3", ELASTIC_RDZV_CONF="lease_ttl=30,key_prefix=/t")
    assert ("lease_ttl", "30") in cfg.rdzv_conf
    assert ("key_prefix", "/t") in cfg.rdzv_conf


def test_etcd_v2_takes_the_keys_torchs_dynamic_rendezvous_reads_as_etcd_v3_does() -> None:
    """The worker writes out etcd-v2's keys (it must run without torch-etcd-v3): the
    dynamic rendezvous' share is torch_etcd_v3's RENDEZVOUS_KEYS, one list in effect."""
    from elastic_worker.settings.rendezvous import DYNAMIC_RENDEZVOUS_KEYS  # noqa: PLC0415
    from torch_etcd_v3.config import RENDEZVOUS_KEYS  # noqa: PLC0415

    assert DYNAMIC_RENDEZVOUS_KEYS == RENDEZVOUS_KEYS
    assert config.rdzv_keys("etcd-v2") >= RENDEZVOUS_KEYS
    assert config.rdzv_keys("etcd-v3") >= RENDEZVOUS_KEYS


def test_etcd_v3_without_its_package_is_one_line_naming_the_fix() -> None:
    """An image without torch-etcd-v3 and ELASTIC_RDZV_BACKEND=etcd-v3: a bad setting (exit
    2, one line), not a traceback from deep inside the worker."""
    code = (
        "import sys; sys.modules['torch_etcd_v3'] = None\n"
        "from elastic_worker.settings import config\n"
        "try:\n"
        "    config.rdzv_keys('etcd-v3')\n"
        "except config.ConfigError as exc:\n"
        "    print(exc)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    ).stdout.strip()
    assert out.startswith("ELASTIC_RDZV_BACKEND=etcd-v3 needs the torch-etcd-v3 package")
    assert "set global.rendezvousBackend=etcd-v2" in out
    assert "\n" not in out
