"""memlock.check: RDMA devices in the container and a bounded RLIMIT_MEMLOCK are one warning
at start (docs/rdma.md); a soft limit below the hard one is raised first."""

from __future__ import annotations

import resource
import subprocess
import sys
from pathlib import Path

import pytest
from elastic_worker.gate import memlock

CHECK = (
    "import sys; from pathlib import Path; from elastic_worker.gate import memlock; "
    "print(memlock.check(Path(sys.argv[1]), Path(sys.argv[2])))"
)
STATUS_NO_CAPS = "Name:\tpython\nCapEff:\t0000000000000000\n"
STATUS_IPC_LOCK = "Name:\tpython\nCapEff:\t0000000000004000\n"


def run_check(devices: Path, status: Path, soft: int, hard: int) -> str:
    """The check in a child whose memlock limit is (soft, hard)."""

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_MEMLOCK, (soft, hard))

    proc = subprocess.run(
        [sys.executable, "-c", CHECK, str(devices), str(status)],
        preexec_fn=limit,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    return proc.stdout.strip()


@pytest.fixture
def rdma(tmp_path: Path) -> Path:
    devices = tmp_path / "infiniband"
    devices.mkdir()
    (devices / "uverbs0").touch()
    return devices


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_rdma_with_a_bounded_limit_is_one_warning_naming_the_fix(
    rdma: Path, tmp_path: Path
) -> None:
    status = write(tmp_path / "status", STATUS_NO_CAPS)
    out = run_check(rdma, status, 64 * 1024, 64 * 1024)
    assert out.startswith(f"RLIMIT_MEMLOCK is 64 KiB with RDMA devices in {rdma}"), out
    assert "docs/rdma.md" in out
    assert "rdma-root-ipc-lock.yaml" in out


def test_a_soft_limit_below_the_hard_one_is_raised_first(rdma: Path, tmp_path: Path) -> None:
    status = write(tmp_path / "status", STATUS_NO_CAPS)
    out = run_check(rdma, status, 64 * 1024, 128 * 1024)
    assert out.startswith("RLIMIT_MEMLOCK is 128 KiB"), out


def test_an_unlimited_limit_is_silent(
    rdma: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As on a node whose runtime sets memlock unlimited (this sandbox cannot raise its
    own hard limit, so the limit is given in-process)."""
    unlimited = (resource.RLIM_INFINITY, resource.RLIM_INFINITY)
    monkeypatch.setattr(memlock.resource, "getrlimit", lambda _which: unlimited)
    assert memlock.check(rdma, write(tmp_path / "status", STATUS_NO_CAPS)) is None


def test_no_rdma_devices_or_cap_ipc_lock_means_nothing_to_say(rdma: Path, tmp_path: Path) -> None:
    no_caps = write(tmp_path / "status", STATUS_NO_CAPS)
    assert run_check(tmp_path / "absent", no_caps, 64 * 1024, 64 * 1024) == "None"
    ipc_lock = write(tmp_path / "status-ipc", STATUS_IPC_LOCK)
    assert run_check(rdma, ipc_lock, 64 * 1024, 64 * 1024) == "None"
