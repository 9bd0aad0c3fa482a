"""Interface choice in real network namespaces with several interfaces.

Each namespace holds: eth0 (a veth, default route), eth0.100 (a macvlan on eth0 with its
own subnet: this kernel has no 8021q or dummy module, and the name is what NCCL's
prefix match trips on), wg0 (a bridge standing in for WireGuard, down unless a test
brings it up), docker0 (a bridge) and lo. Addresses are from 198.18.0.0/15 only.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from worker.worker_helpers import PYTHON, WORKER, worker_env

pytestmark = pytest.mark.netns

SETUP = """
set -e
ip link set lo up
ip link add eth0 type veth peer name eth0-peer
ip link set eth0-peer up
ip link set eth0 up
ip addr add 198.18.1.2/24 dev eth0
ip link add link eth0 name eth0.100 type macvlan mode bridge
ip link set eth0.100 up
ip addr add 198.18.100.2/24 dev eth0.100
ip link add wg0 type bridge
ip addr add 198.18.200.2/24 dev wg0
ip link add docker0 type bridge
ip link set docker0 up
ip addr add 198.18.50.1/24 dev docker0
ip route add default via 198.18.1.1 dev eth0
"""

PROBE = """
import json, sys
from elastic_worker.gate import netif
globs = sys.argv[1].split(",")
choice, reason = netif.choose(globs, sys.argv[2] or None, 2379)
print(json.dumps(None if choice is None else
      {"name": choice.name, "nccl": choice.nccl, "gloo": choice.gloo, "address": choice.address,
       "reason": reason}))
"""

Netns = Callable[..., subprocess.CompletedProcess[str]]


@pytest.fixture
def netns() -> Iterator[Netns]:
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("needs root and iproute2 for network namespaces")
    name = f"ewt-{os.getpid()}"
    subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        subprocess.run(["ip", "netns", "exec", name, "sh", "-c", SETUP], check=True)

        def run(
            *argv: str, check: bool = True, env: dict[str, str] | None = None
        ) -> subprocess.CompletedProcess[str]:
            return subprocess.run(
                ["ip", "netns", "exec", name, *argv],
                check=check,
                capture_output=True,
                text=True,
                timeout=60,
                env=env,
            )

        yield run
    finally:
        subprocess.run(["ip", "netns", "del", name], check=False)
        assert not Path(f"/run/netns/{name}").exists()


def choose(netns: Netns, endpoint: str, globs: str = "wg*") -> dict[str, str] | None:
    out = netns(str(PYTHON), "-c", PROBE, globs, endpoint).stdout
    return json.loads(out)  # type: ignore[no-any-return]


def test_the_interface_routing_to_the_endpoint_is_chosen_exactly(netns: Netns) -> None:
    choice = choose(netns, "198.19.0.10")  # via the default route
    assert choice == {
        "name": "eth0",
        "nccl": "=eth0",  # exact: a bare eth0 would also match eth0.100
        "gloo": "eth0",
        "address": "198.18.1.2",
        "reason": "no mesh interface is up; eth0 (198.18.1.2) routes to 198.19.0.10",
    }


def test_a_subinterface_is_chosen_when_it_routes_to_the_endpoint(netns: Netns) -> None:
    choice = choose(netns, "198.18.100.50")
    assert choice is not None
    assert (choice["name"], choice["nccl"], choice["gloo"]) == ("eth0.100", "=eth0.100", "eth0.100")


def test_an_up_mesh_interface_wins_over_the_route(netns: Netns) -> None:
    assert choose(netns, "198.19.0.10")["name"] == "eth0"  # type: ignore[index]
    netns("ip", "link", "set", "wg0", "up")
    choice = choose(netns, "198.19.0.10")
    assert choice is not None
    assert choice["name"] == "wg0" and choice["nccl"] == "=wg0"
    assert choice["address"] == "198.18.200.2"
    assert choice["reason"] == "mesh interface wg0 is up (matches wg*)"


def test_mesh_globs_are_configurable(netns: Netns) -> None:
    netns("ip", "link", "set", "wg0", "up")
    choice = choose(netns, "198.19.0.10", globs="tailscale*,eth0.1*")
    assert choice is not None and choice["name"] == "eth0.100"


@pytest.mark.parametrize(("endpoint", "via"), [("198.18.50.7", "docker0"), ("127.0.0.1", "lo")])
def test_lo_and_docker0_are_never_chosen(netns: Netns, endpoint: str, via: str) -> None:
    out = netns(
        str(PYTHON),
        "-c",
        "from elastic_worker.gate import netif; "
        f"print(netif.choose(['wg*'], {endpoint!r}, 2379)[1])",
    ).stdout.strip()
    assert out == (
        f"no mesh interface is up and the route to {endpoint} goes through {via}, "
        "which is never chosen"
    )


@pytest.fixture
def netns_etcd(netns: Netns, tmp_path: Path) -> Iterator[str]:
    """A real etcd inside the namespace, on eth0's address."""
    proc = subprocess.Popen(
        [
            "ip", "netns", "exec", f"ewt-{os.getpid()}", "etcd", "--name=default",
            f"--data-dir={tmp_path / 'etcd'}",
            "--listen-client-urls=http://198.18.1.2:2379",
            "--advertise-client-urls=http://198.18.1.2:2379",
            "--listen-peer-urls=http://127.0.0.1:2380",
            "--initial-advertise-peer-urls=http://127.0.0.1:2380",
            "--initial-cluster=default=http://127.0.0.1:2380",
            "--enable-v2=true",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        yield "198.18.1.2:2379"
    finally:
        proc.terminate()
        proc.wait(10)


SHOW = (
    "import os\n"
    "print('SEEN', os.environ['NCCL_SOCKET_IFNAME'], os.environ['GLOO_SOCKET_IFNAME'],"
    " os.environ['TORCH_ELASTIC_SHUTDOWN_TIMEOUT'], flush=True)\n"
)


def entrypoint_env(endpoint: str, job: str, **extra: str) -> dict[str, str]:
    """min = max = 1, so the rendezvous forms alone; no interface preset."""
    env = worker_env(endpoint, job, ELASTIC_MIN_NODES="1", ELASTIC_MAX_NODES="1", **extra)
    for key in ("GLOO_SOCKET_IFNAME", "ELASTIC_LOCAL_ADDR"):
        env.pop(key)
    return env


@pytest.mark.slow
def test_the_entrypoint_logs_the_choice_once_and_exports_it(
    netns: Netns, netns_etcd: str, tmp_path: Path
) -> None:
    """elastic-worker in the namespace; the "training" script prints what it was given."""
    script = tmp_path / "show.py"
    script.write_text(SHOW)
    result = netns(str(WORKER), "python", str(script), env=entrypoint_env(netns_etcd, "netif"),
                   check=False)  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SEEN =eth0 eth0 25" in result.stdout
    choice_lines = [line for line in result.stderr.splitlines() if "interface eth0:" in line]
    assert choice_lines == [
        "elastic-worker: interface eth0: no mesh interface is up; "
        "eth0 (198.18.1.2) routes to 198.18.1.2"
    ]
    assert "--local-addr=198.18.1.2" in result.stderr


@pytest.mark.slow
def test_a_required_mesh_is_waited_for_then_chosen(
    netns: Netns, netns_etcd: str, tmp_path: Path
) -> None:
    script = tmp_path / "show.py"
    script.write_text(SHOW)
    env = entrypoint_env(netns_etcd, "mesh-up", ELASTIC_MESH_REQUIRED="true",
                         ELASTIC_GATE_TIMEOUT="60")  # fmt: skip
    proc = subprocess.Popen(
        ["ip", "netns", "exec", f"ewt-{os.getpid()}", str(WORKER), "python", str(script)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    time.sleep(3)
    assert proc.poll() is None  # still waiting for wg0
    netns("ip", "link", "set", "wg0", "up")
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, out + err
    assert "SEEN =wg0 wg0 25" in out
    assert "elastic-worker: interface wg0: mesh interface wg0 is up (matches wg*)" in err
    assert "--local-addr=198.18.200.2" in err  # the mesh address, not eth0's
