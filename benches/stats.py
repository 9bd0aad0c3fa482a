"""The statistics the benches print: median and spread over runs, a wait cut at a bound
counted as longer than any that finished, a high percentile."""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

Row = Mapping[str, Any]


def summary(rows: Sequence[Row], key: str = "seconds") -> dict[str, Any]:
    """Runs, median, min and max of `key` over the rows that have it (median None when
    none has)."""
    values = [float(r[key]) for r in rows if r.get(key) is not None]
    if not values:
        return {"runs": len(rows), "median": None}
    return {
        "runs": len(rows),
        "median": round(statistics.median(values), 2),
        "min": round(min(values), 2),
        "max": round(max(values), 2),
    }


def summary_cut(rows: Sequence[Row], key: str) -> dict[str, Any]:
    """Median, min and max of `key` over the runs; a run that timed out counts as longer
    than any that finished, and when the median falls on one it is None ("> bound")."""
    values = [float(r[key]) for r in rows if r.get(key) is not None]
    cut = sum(1 for r in rows if r.get("timed_out"))
    out: dict[str, Any] = {"runs": len(rows), "median": None, "timed_out": cut}
    if values:
        ranked = sorted(values) + [math.inf] * cut
        median = statistics.median_high(ranked) if cut else statistics.median(ranked)
        out.update(
            median=None if math.isinf(median) else round(median, 2),
            min=round(min(values), 2),
            max=round(max(values), 2),
        )
    return out


def percentile(values: Sequence[float], fraction: float) -> float:
    """The value at `fraction` (0.99: p99) of the sorted values, nearest rank below."""
    ranked = sorted(values)
    return ranked[min(len(ranked) - 1, int(len(ranked) * fraction))]


def min_median_max(values: Sequence[float], width: int = 5) -> str:
    """`min / median / max`, two decimals each."""
    low, mid, high = min(values), statistics.median(values), max(values)
    return f"{low:{width}.2f} / {mid:{width}.2f} / {high:{width}.2f}"
