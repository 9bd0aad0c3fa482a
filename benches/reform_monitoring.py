"""Whether metrics slow recovery: the SIGKILL re-form time of the local run with
monitoring off, with the workers' metrics on (`monitoring.enabled`, nothing scrapes them)
and with `--prometheus` (metrics on, scraped and rules evaluated every second, Prometheus
on the same cores), runs alternating so that a loaded machine weighs on each alike.

    scripts/bench-reform-monitoring              # 3 runs each, about 8 minutes, as root
    scripts/bench-reform-monitoring --repeat 5 --json out/bench-monitoring.json

Each run: values-examples/cpu-smoke.yaml, train.py with 30 steps of 0.5 s, pod 1
SIGKILLed at step 8 and kept down 15 s; the figure is the run summary's
`reforms[].seconds` of that kill (from the SIGKILL to the first training step of the group
of two). Prints every figure, then per mode the median and the spread (min-max).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from benches.env import ROOT, VENV_PYTHON

RELEASE = "bench"
VICTIM = f"{RELEASE}-elastic-job-default-1"
TRAIN = (
    "job.command={python,/opt/elastic-worker/examples/train.py,"
    "--steps,30,--checkpoint-every,5,--step-seconds,0.5}"
)
MODES = {
    "off": ["--set", "monitoring.enabled=false"],
    "metrics": ["--set", "monitoring.enabled=true"],  # served, not scraped
    "prometheus": ["--prometheus"],  # served, scraped every second, rules evaluated
}


def kill_reform_seconds(summary: dict[str, Any]) -> float | None:
    """The run summary's re-form after the SIGKILL of VICTIM: seconds to the first step of
    the group of two (None: no such re-form, or it never trained again)."""
    for r in summary["reforms"]:
        if r["cause"].startswith(f"kill {VICTIM}") and r["seconds"] is not None:
            return float(r["seconds"])
    return None


def one_run(mode: str, workdir: Path) -> float | None:
    summary = workdir / "summary.json"
    cmd = [
        str(VENV_PYTHON), "-m", "localrun.cli", "run",
        "--chart", str(ROOT / "charts" / "elastic-job"),
        "-f", str(ROOT / "values-examples" / "cpu-smoke.yaml"),
        "--release", RELEASE, "--set", TRAIN,
        f"--kill={VICTIM}@step=8:15", "--backoff=2:20", "--plain", "--timeout=300",
        "--output", str(workdir / "out"), "--json", str(summary),
        *MODES[mode],
    ]  # fmt: skip
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=False)
    if proc.returncode != 0 or not summary.exists():
        tail = "\n".join(proc.stdout.splitlines()[-15:])
        print(f"bench: {mode} run failed (exit {proc.returncode}):\n{tail}", file=sys.stderr)
        return None
    return kill_reform_seconds(json.loads(summary.read_text()))


def mode_lines(figures: dict[str, list[float]]) -> list[str]:
    """Per mode with figures: n, the median and the spread."""
    return [
        f"{mode:10s} n={len(xs)} median {statistics.median(xs):.2f} s "
        f"spread {min(xs):.2f}-{max(xs):.2f} s"
        for mode, xs in figures.items()
        if xs
    ]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    p.add_argument("--repeat", type=int, default=3, help="runs per mode (default 3)")
    p.add_argument("--json", type=Path, help="write the figures here")
    args = p.parse_args(argv)
    figures: dict[str, list[float]] = {m: [] for m in MODES}
    for i in range(args.repeat):
        for mode in MODES:
            with tempfile.TemporaryDirectory(prefix="bench-monitoring-") as tmp:
                seconds = one_run(mode, Path(tmp))
            shown = "failed" if seconds is None else f"{seconds:.2f} s"
            print(f"run {i + 1} {mode:10s} re-form {shown}", flush=True)
            if seconds is not None:
                figures[mode].append(seconds)
    for line in mode_lines(figures):
        print(line)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(figures, indent=1) + "\n")
    return 0 if all(figures.values()) else 1
