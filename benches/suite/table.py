"""The table scripts/bench prints at the end: each figure's median (min-max, n) for
torch's defaults and elastic-job's, the ratio, and what each run cost."""

from __future__ import annotations

from typing import Any

from benches.churn.report import table_lines as churn_lines
from benches.rendezvous.report import table_lines as rendezvous_lines
from benches.snapshots.report import table_lines as snapshot_lines
from benches.suite.figures import PROFILES, RUNS


def fmt(s: dict[str, Any]) -> str:
    if s.get("median") is None:
        return "failed"
    return f"{s['median']:.1f} s ({s['min']:.1f}-{s['max']:.1f}, n={s['runs']})"


def _num(value: object) -> str:
    return "-" if value is None else str(value)


def _values(value: object) -> list[object]:
    if value is None:
        return []
    return list(value) if isinstance(value, list) else [value]


def _run_lines(results: dict[str, Any]) -> list[str]:
    out = []
    for name, (title, _, _) in RUNS.items():
        if name not in results:
            continue
        summ = results[name]["summary"]
        base, ours = summ["torch defaults"], summ["elastic-job"]
        ratio = "-"
        if base.get("median") and ours.get("median"):
            ratio = f"{base['median'] / ours['median']:.1f}x"
        out.append(f"{title:<28} {fmt(base):>26} {fmt(ours):>26} {ratio:>6}")
        for key, what in (("restarts", "restarts per failure"), ("steps_lost", "steps lost")):
            per = []
            for label in PROFILES:
                rows = [r for r in results[name]["rows"] if r["label"] == label]
                seen = {str(v) for r in rows for v in _values(r.get(key))}
                per.append(",".join(sorted(seen)) or "-")
            if name in ("kill", "sigterm") and (key != "steps_lost" or name == "sigterm"):
                out.append(f"{'  ' + what:<28} {per[0]:>26} {per[1]:>26}")
    return out


def table_lines(results: dict[str, Any]) -> list[str]:
    """The table's lines, a header first, for the figures in `results`."""
    out = [f"\n{'figure':<28} {'torch defaults':>26} {'elastic-job':>26} {'ratio':>6}"]
    out += _run_lines(results)
    if "rendezvous" in results:
        out += rendezvous_lines(results["rendezvous"])
    for title, fixed, elastic, ratio in churn_lines(results):
        out.append(f"{title:<34} {fixed:>34} {elastic:>30} {ratio:>6}")
    return out + snapshot_lines(results)


def print_table(results: dict[str, Any]) -> None:
    for line in table_lines(results):
        print(line)
