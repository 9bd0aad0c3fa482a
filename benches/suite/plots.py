"""Plots of a bench.json: bench.png (every figure's medians, scripts/bench writes it after
a run) and the benchmarks page's two (docs/benchmarks.md):

    recovery-phases.png     where the seconds of a recovery go, per figure and profile:
                            until the failure is seen, the round re-formed, the checkpoint
                            loaded, the first step
    goodput-over-time.png   kept samples per second around each loss, the elastic job
                            beside the fixed-size one

`scripts/bench --replot out/bench/bench.json --out docs/benchmarks` draws them again from a
bench.json without running anything. matplotlib is optional (in the venv): without it,
nothing is drawn and the caller says so.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from benches.churn.goodput import SERIES_BIN_S
from benches.churn.report import FIGURES as CHURN_FIGURES
from benches.churn.report import plot_panels as churn_panels
from benches.suite.figures import PROFILES, RUNS

#: A recovery's phases in the order they happen (benches/recovery/agent.py's PHASES,
#: then the first step), and what the segment that ends at each one is.
PHASE_ORDER = ("up", "failed", "rendezvous", "resumed", "step")
SEGMENTS = {
    "up": "torchrun up (new node)",
    "failed": "until the failure is seen",
    "rendezvous": "round re-formed",
    "resumed": "worker up, checkpoint loaded",
    "step": "first step",
}
PHASED = ("kill", "sigterm", "scaleup")
COLORS = {"torch defaults": "#999999", "elastic-job": "#1f77b4", "fixed-size 3:3": "#999999"}
#: Every PNG is drawn at this size and resolution: the same bench.json, the same bytes.
DPI = 100


def _pyplot() -> Any:
    try:
        import matplotlib  # noqa: PLC0415 - optional

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # noqa: PLC0415
    except ImportError:
        return None
    return plt


def _save(plt: Any, fig: Any, title: str, path: Path) -> bool:
    """The figure's one axes titled, laid out and written at DPI; True."""
    fig.axes[0].set_title(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return True


def caption(results: dict[str, Any]) -> str:
    """Which run a plot shows: its command, day, cores and torch."""
    machine = results.get("machine") or {}
    day = str(results.get("started", ""))[:10]
    load = machine.get("load_average")
    return (
        f"{results.get('command', 'scripts/bench')}, {day}, "
        f"{machine.get('cpus', '?')} cores"
        + (f" (load {load} at the start)" if load else "")
        + f", torch {machine.get('torch', '?')}"
    )


def phase_bars(results: dict[str, Any]) -> list[tuple[str, list[tuple[str, float, float]]]]:
    """Per (figure, profile) with phases: its bar, as (segment, start s, width s) from the
    medians over the runs of each phase's time; a phase seen before the one it follows
    (a median's quirk) gets no width."""
    bars = []
    for figure in PHASED:
        if figure not in results:
            continue
        for label in PROFILES:
            rows = [r for r in results[figure]["rows"] if r["label"] == label and r.get("phases")]
            if not rows:
                continue
            marks = {
                name: statistics.median(r["phases"][name] for r in rows if name in r["phases"])
                for name in PHASE_ORDER
                if any(name in r["phases"] for r in rows)
            }
            segments, at = [], 0.0
            for name in PHASE_ORDER:
                if name in marks:
                    end = max(at, float(marks[name]))
                    segments.append((name, at, round(end - at, 2)))
                    at = end
            bars.append((f"{RUNS[figure][0]}\n{label}", segments))
    return bars


def goodput_series(results: dict[str, Any]) -> dict[str, list[list[float]]]:
    """Per goodput profile, the first run's [seconds from the first loss, samples/s]."""
    out: dict[str, list[list[float]]] = {}
    for row in (results.get("goodput") or {}).get("rows", []):
        if row.get("series") and row["label"] not in out:
            out[row["label"]] = row["series"]
    return out


def overview(results: dict[str, Any], path: Path) -> bool:
    """bench.png: a panel per figure (medians; rendezvous by size). False: no figure in
    `results`, or no matplotlib."""
    figures = [f for f in RUNS if f in results]
    churn = [f for f in CHURN_FIGURES if f in results]
    panels = len(figures) + (1 if "rendezvous" in results else 0) + len(churn)
    plt = _pyplot()
    if plt is None or not panels:
        return False
    fig, axes = plt.subplots(1, panels, figsize=(5 * panels, 4), squeeze=False)
    for ax, name in zip(axes[0], figures, strict=False):
        labels = list(results[name]["summary"])
        medians = [results[name]["summary"][lb]["median"] or 0 for lb in labels]
        ax.bar(labels, medians, color=["#999999", "#1f77b4"][: len(labels)])
        ax.set_title(f"{name}: seconds (median)")
    if churn:  # before the rendezvous panel, the last one
        churn_panels(list(axes[0][len(figures) : len(figures) + len(churn)]), results)
    if "rendezvous" in results:
        ax = axes[0][-1]
        for label, cells in results["rendezvous"]["summary"].items():
            xs = sorted(int(n) for n in cells)
            # A bench.json from before scripts/bench-rendezvous holds the join's summary itself.
            ys = [cells[str(n)].get("bringup_s", cells[str(n)])["median"] for n in xs]
            ax.plot(xs, ys, marker="o", label=label)  # None: not converged, left out
        ax.set_xscale("log", base=2)
        ax.set_xlabel("agents")
        ax.set_title("rendezvous: bring-up seconds")
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return True


def recovery_phases(results: dict[str, Any], path: Path) -> bool:
    """recovery-phases.png; False when there is nothing to draw or no matplotlib."""
    bars = phase_bars(results)
    plt = _pyplot()
    if plt is None or not bars:
        return False
    fig, ax = plt.subplots(figsize=(9, 0.7 * len(bars) + 1.8))
    shades = dict(zip(PHASE_ORDER, plt.get_cmap("tab10").colors, strict=False))
    handles: dict[str, Any] = {}
    for y, (_, segments) in enumerate(reversed(bars)):
        for name, start, width in segments:
            handles[name] = ax.barh(y, width, left=start, color=shades[name], height=0.6)
        total = segments[-1][1] + segments[-1][2] if segments else 0.0
        ax.annotate(f"{total:.1f} s", (total, y), xytext=(4, -4), textcoords="offset points")
    ax.set_yticks(range(len(bars)), [title for title, _ in reversed(bars)], fontsize=8)
    ax.set_xlabel("seconds from the loss (scale-up: from the new node's start), medians")
    shown = [name for name in PHASE_ORDER if name in handles]  # in the order they happen
    ax.legend([handles[n] for n in shown], [SEGMENTS[n] for n in shown], fontsize=7,
              loc="lower right")  # fmt: skip
    return _save(plt, fig, f"Recovery by phase\n{caption(results)}", path)


def goodput_over_time(results: dict[str, Any], path: Path) -> bool:
    """goodput-over-time.png; False when there is nothing to draw or no matplotlib."""
    lines = goodput_series(results)
    plt = _pyplot()
    if plt is None or not lines:
        return False
    g = results["goodput"]
    period, down, losses = float(g["T"]), float(g["R"]), int(g["losses"])
    fig, ax = plt.subplots(figsize=(9, 3.8))
    for k in range(losses):
        ax.axvspan(k * period, k * period + down, color="#f2d7d5", lw=0)
        ax.axvline(k * period, color="#c0392b", lw=0.8, ls=":")
    for label, points in lines.items():
        xs = [p[0] for p in points]
        ys = [p[1] for p in points]
        width = xs[1] - xs[0] if len(xs) > 1 else SERIES_BIN_S
        # each point is a bin's start: the last bin drawn to its end
        ax.step([*xs, xs[-1] + width], [*ys, ys[-1]], where="post", label=label,
                color=COLORS.get(label))  # fmt: skip
    churn = f"a pod lost every {period:g} s, back after {down:g} s: shaded"
    ax.set_xlabel(f"seconds from the first loss ({churn})")
    ax.set_ylabel("kept samples / s")
    ax.legend(fontsize=8)
    return _save(plt, fig, f"Goodput over time\n{caption(results)}", path)


def draw_all(results: dict[str, Any], out: Path) -> list[Path]:
    """Every plot `results` has data for, into `out`: the paths written."""
    drawn = []
    for name, draw in (
        ("bench.png", overview),
        ("recovery-phases.png", recovery_phases),
        ("goodput-over-time.png", goodput_over_time),
    ):
        if draw(results, out / name):
            drawn.append(out / name)
    return drawn
