"""The churn figures in scripts/bench's table and plot."""

from __future__ import annotations

from typing import Any

#: The figures scripts/bench shows from this package; --quick skips the slow ones.
FIGURES = ("silent", "goodput")
SLOW = ("silent",)  # four local runs of up to ~3 min each per repeat


def fmt_seconds(s: dict[str, Any], bound: float) -> str:
    cut = f", {s['timed_out']} > {bound:g} s" if s.get("timed_out") else ""
    if s.get("median") is None:
        if not s.get("timed_out"):
            return "failed"
        done = f", others {s['min']:.1f}-{s['max']:.1f}" if s.get("min") is not None else ""
        return f"> {bound:g} s (timed out{done}, n={s['runs']})"
    return f"{s['median']:.1f} s ({s['min']:.1f}-{s['max']:.1f}{cut}, n={s['runs']})"


def _silent_lines(silent: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    out = []
    bound = float(silent["bound"])
    for script, summ in silent["summary"].items():
        base, ours = summ["torch defaults"], summ["elastic-job"]
        ratio = "-"
        if ours.get("median"):
            if base.get("median"):
                ratio = f"{base['median'] / ours['median']:.1f}x"
            elif base.get("timed_out"):
                ratio = f">{bound / ours['median']:.0f}x"
        out.append(
            (f"silent loss, {script}", fmt_seconds(base, bound), fmt_seconds(ours, bound), ratio)
        )
    return out


def _fmt_goodput(s: dict[str, Any]) -> str:
    if s.get("median") is None:
        return "failed"
    c = s["cycles"]
    return f"{s['median']:.0f}/s (cycles {c['min']:.0f}-{c['max']:.0f})"


def _goodput_lines(g: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    base, ours = g["summary"]["fixed-size 3:3"], g["summary"]["elastic-job"]
    ratio = "-"
    if base.get("median") and ours.get("median"):
        ratio = f"{ours['median'] / base['median']:.2f}x"
    # the baseline column holds the fixed-size job here, not torch's defaults
    return [
        ("goodput, samples/s", "fixed 3:3: " + _fmt_goodput(base), _fmt_goodput(ours), ratio),
        (f"  1 loss/{g['T']:g} s, back in {g['R']:g} s", "", "", ""),
        (
            "  no-loss rate before loss 1",
            f"{base.get('steady') or '-'}/s",
            f"{ours.get('steady') or '-'}/s",
            "",
        ),
    ]


def table_lines(results: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    """(title, baseline, elastic-job, ratio) rows of scripts/bench's table."""
    out: list[tuple[str, str, str, str]] = []
    if "silent" in results:
        out += _silent_lines(results["silent"])
    if "goodput" in results:
        out += _goodput_lines(results["goodput"])
    return out


def plot_panels(axes: list[Any], results: dict[str, Any]) -> None:
    """One matplotlib panel per figure of this package in `results`, in FIGURES order."""
    names = [f for f in FIGURES if f in results]
    for ax, name in zip(axes, names, strict=False):
        if name == "silent":
            _silent_panel(ax, results["silent"])
        else:
            g = results["goodput"]
            labels = list(g["summary"])
            values = [g["summary"][lb]["median"] or 0 for lb in labels]
            ax.bar(labels, values, color=["#999999", "#1f77b4"][: len(labels)])
            ax.set_title(f"goodput: samples/s, loss every {g['T']:g} s, back {g['R']:g} s")


def _silent_panel(ax: Any, silent: dict[str, Any]) -> None:
    bound = float(silent["bound"])
    labels, heights, timed_out = [], [], []
    for script, summ in silent["summary"].items():
        for lb, s in summ.items():
            labels.append(f"{script}\n{lb}")
            heights.append(s["median"] if s["median"] is not None else bound)
            timed_out.append(s["median"] is None)
    colors = ["#999999" if "torch" in lb else "#1f77b4" for lb in labels]
    bars = ax.bar(labels, heights, color=colors)
    for bar, cut in zip(bars, timed_out, strict=True):
        if cut:  # drawn at the bound: the real wait is the script's PG timeout
            bar.set_hatch("//")
            ax.annotate(f"> {bound:g} s", (bar.get_x(), bar.get_height()))
    ax.set_title("silent loss: seconds to train at 2")
    ax.tick_params(axis="x", labelsize=7)
