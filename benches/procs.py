"""What every bench starts and stops: a private etcd, free ports, a process's
descendants, busy loops that saturate the cores, and a check that the machine is quiet."""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

#: A process that keeps one core busy (soaks saturate the machine with these).
BUSY_LOOP = "while True: pass"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def etcd_argv(etcd: str, data_dir: Path, client: int, peer: int, *, v2: bool) -> list[str]:
    """One etcd member on 127.0.0.1, the v2 API on or off (etcd-v3 runs without it)."""
    url = f"http://127.0.0.1:{peer}"
    return [
        etcd,
        "--name=default",
        f"--data-dir={data_dir}",
        f"--listen-client-urls=http://127.0.0.1:{client}",
        f"--advertise-client-urls=http://127.0.0.1:{client}",
        f"--listen-peer-urls={url}",
        f"--initial-advertise-peer-urls={url}",
        f"--initial-cluster=default={url}",
        f"--enable-v2={'true' if v2 else 'false'}",
    ]


def start_etcd(
    workdir: Path, *, v2: bool = True, who: str = "bench", data: Path | None = None
) -> tuple[subprocess.Popen[bytes], str]:
    """A private etcd with its data (in `data`, else `workdir`) and log (etcd.log) in
    `workdir`, once it answers /health: the process and its client endpoint (host:port)."""
    etcd = shutil.which("etcd")
    if etcd is None:
        sys.exit(f"{who}: etcd is not installed: run scripts/bootstrap")
    client, peer = free_port(), free_port()
    log = open(workdir / "etcd.log", "wb")  # noqa: SIM115 - lives as long as etcd
    argv = etcd_argv(etcd, (data or workdir) / "etcd", client, peer, v2=v2)
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        with (
            contextlib.suppress(OSError),
            urllib.request.urlopen(f"http://127.0.0.1:{client}/health", timeout=1),
        ):
            return proc, f"127.0.0.1:{client}"
        time.sleep(0.1)
    proc.kill()
    sys.exit(f"{who}: etcd did not start (see {workdir / 'etcd.log'})")


def descendants(pid: int) -> list[int]:
    """Every process below `pid`, from /proc."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        ppid = int(text.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(stat.parent.name))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def busy_loops(count: int) -> list[subprocess.Popen[bytes]]:
    """`count` processes that each keep a core busy until killed."""
    return [subprocess.Popen([sys.executable, "-c", BUSY_LOOP]) for _ in range(count)]


def cpu_idle(seconds: float = 2.0) -> float:
    """The fraction of this machine's CPU time that was idle over `seconds`."""

    def sample() -> tuple[int, int]:
        fields = [int(v) for v in Path("/proc/stat").read_text().split("\n")[0].split()[1:]]
        return fields[3] + fields[4], sum(fields)  # idle + iowait, total

    idle0, total0 = sample()
    time.sleep(seconds)
    idle1, total1 = sample()
    return (idle1 - idle0) / max(1, total1 - total0)


def wait_quiet(say: Callable[[str], None], most: float = 60.0) -> float:
    """Up to `most` s until other work leaves this machine mostly idle (a run's timings
    are only fair on a quiet machine); the idle fraction seen last, kept in the row."""
    deadline = time.monotonic() + most
    idle = cpu_idle()
    while idle < 0.6 and time.monotonic() < deadline:
        say(f"bench-churn: the machine is busy ({1 - idle:.0%} CPU used), waiting")
        time.sleep(10)
        idle = cpu_idle()
    return round(idle, 2)
