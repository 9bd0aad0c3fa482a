"""One `elastic-local run` of the chart for a churn figure: its event lines and the pods'
log lines, each stamped with this process's monotonic clock when read (every 0.2 s at
most)."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benches.env import ROOT, VENV_PYTHON

RELEASE = "bench"
POD = f"{RELEASE}-elastic-job-default"  # worker pods POD-0, POD-1, POD-2
Values = dict[str, Any]
_EVENT = re.compile(r"^\[\s*(\d+(?:\.\d+)?)s\] (.*)$")


def pod(n: int) -> str:
    return f"{POD}-{n}"


def needs_root() -> str:
    """Why the local run cannot cut a link here ("" when it can)."""
    if os.geteuid() != 0:
        return "needs root: the local run cuts a pod's link in its network namespace"
    for tool in ("ip", "unshare", "etcd"):
        if shutil.which(tool) is None and not (ROOT / ".venv" / "bin" / tool).exists():
            return f"{tool} is not installed: run scripts/bootstrap"
    return ""


@dataclass
class LocalRun:
    """One `elastic-local run` of the chart, its events and the pods' lines, stamped."""

    workdir: Path
    argv: list[str]
    proc: subprocess.Popen[str] | None = None
    events: list[tuple[float, str]] = field(default_factory=list)
    lines: list[tuple[float, str, str]] = field(default_factory=list)  # (t, pod, line)
    started: float = 0.0  # the runner's start, on this clock
    _stop: threading.Event = field(default_factory=threading.Event)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @classmethod
    def start(cls, workdir: Path, values: Values, faults: list[str], timeout: float) -> LocalRun:
        argv = [
            str(VENV_PYTHON), "-m", "localrun.cli", "run",
            "--chart", str(ROOT / "charts" / "elastic-job"),
            "-f", str(ROOT / "values-examples" / "cpu-smoke.yaml"),
            "--release", RELEASE, "--output", str(workdir / "out"),
            "--json", str(workdir / "summary.json"), "--timeout", str(timeout),
            "--plain", "--backoff=2:20",
        ]  # fmt: skip
        (workdir / "values.json").write_text(json.dumps(values))  # JSON is YAML
        argv += ["-f", str(workdir / "values.json")]
        run = cls(workdir, argv + faults)
        run.started = time.monotonic()
        run.proc = subprocess.Popen(
            run.argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        threading.Thread(target=run._read_events, daemon=True).start()
        threading.Thread(target=run._follow_logs, daemon=True).start()
        return run

    def _read_events(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        with (self.workdir / "runner-output.txt").open("w") as out:
            for line in self.proc.stdout:
                now = time.monotonic()
                out.write(line)
                m = _EVENT.match(line.rstrip("\n"))
                if m:
                    if not self.events:  # the runner's clock starts before its first line
                        self.started = now - float(m[1])
                    with self._lock:
                        self.events.append((now, m[2]))

    def _follow_logs(self) -> None:
        offsets: dict[Path, int] = {}
        partial: dict[Path, bytes] = {}
        while not self._stop.is_set():
            for path in sorted((self.workdir / "out" / "logs").glob(f"{POD}-*/worker.log")):
                with path.open("rb") as fh:
                    fh.seek(offsets.get(path, 0))
                    data = fh.read()
                offsets[path] = offsets.get(path, 0) + len(data)
                chunks = (partial.get(path, b"") + data).split(b"\n")
                partial[path] = chunks.pop()
                now = time.monotonic()
                with self._lock:
                    self.lines += [
                        (now, path.parent.name, c.decode(errors="replace")) for c in chunks
                    ]
            time.sleep(0.2)

    def event_at(self, needle: str) -> float | None:
        with self._lock:
            return next((t for t, text in self.events if needle in text), None)

    def all_lines(self) -> list[tuple[float, str, str]]:
        with self._lock:
            return list(self.lines)

    def pod_lines(self, name: str, since: float = 0.0) -> list[tuple[float, str]]:
        with self._lock:
            return [(t, line) for t, p, line in self.lines if p == name and t >= since]

    def ended(self) -> bool:
        return self.proc is None or self.proc.poll() is not None

    def stop(self) -> None:
        """SIGTERM: the runner removes its pods, namespaces and links, then exits."""
        self._stop.set()
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(120)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def tail(self) -> str:
        path = self.workdir / "runner-output.txt"
        return (
            "\n".join(path.read_text(errors="replace").splitlines()[-15:]) if path.exists() else ""
        )


def done(row: dict[str, Any], workdir: Path, say: Callable[[str], None]) -> None:
    """Say the row; keep the run's logs when it failed or timed out (named in the row)."""
    if row.get("error") or row.get("timed_out"):
        row["logs"] = str(workdir)
    else:
        shutil.rmtree(workdir, ignore_errors=True)
    say(json.dumps(row))
