"""The rendezvous figure's runs reduced to medians, and its table: each backend at each
size, torch's backends as a ratio to etcd-lease (how many times as long)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from benches.rendezvous.profiles import LABELS
from benches.stats import summary

#: The timed phases (figure.py), in the table's order.
PHASES = (("bringup_s", "bring-up"), ("kill_s", "SIGKILL re-form"), ("silent_s", "silent re-form"))
#: The costs per agent the table shows.
COSTS: tuple[tuple[str, str, Callable[[dict[str, Any]], Any]], ...] = (
    ("join_requests", "requests per join", lambda r: (r.get("join") or {}).get("requests")),
    ("join_bytes", "bytes written per join", lambda r: (r.get("join") or {}).get("written_bytes")),
    (
        "beat_bytes",
        "bytes written per heartbeat",
        lambda r: (r.get("heartbeat") or {}).get("bytes_per_beat"),
    ),
    (
        "monitor_requests",
        "requests/s asking num_nodes_waiting",
        lambda r: (r.get("heartbeat") or {}).get("monitor_requests_per_agent_s"),
    ),
    (
        "kill_requests",
        "requests per SIGKILL re-form",
        lambda r: (r.get("kill") or {}).get("requests"),
    ),
    (
        "kill_bytes",
        "bytes written per SIGKILL re-form",
        lambda r: (r.get("kill") or {}).get("written_bytes"),
    ),
    ("etcd_sockets", "etcd connections held", lambda r: r.get("etcd_sockets_per_agent")),
    ("lifelines", "lifelines held", lambda r: r.get("lifelines_per_agent")),
)


def summarize(rows: Sequence[dict[str, Any]]) -> dict[str, dict[str, dict[str, Any]]]:
    """label -> size -> {phase: summary (runs, median, min, max, failed), cost: median}."""
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for label in LABELS:
        mine = [r for r in rows if r["label"] == label]
        for n in sorted({r["agents"] for r in mine}):
            runs = [r for r in mine if r["agents"] == n]
            failed = [r["error"] for r in runs if r.get("error")]
            cell: dict[str, Any] = {"runs": len(runs), "failed": failed}
            for key, _ in PHASES:
                cell[key] = summary(runs, key)
            for key, _, get in COSTS:
                values = [{"v": get(r)} for r in runs if get(r) is not None]
                cell[key] = summary(values, "v")["median"]
            out.setdefault(label, {})[str(n)] = cell
    return out


def _seconds(cell: dict[str, Any] | None, key: str) -> str:
    if cell is None:
        return "-"
    s = cell[key]
    if s["median"] is None:
        return f"none of {cell['runs']}"
    text = f"{s['median']:.2f} s"
    done = sum(1 for _ in range(s["runs"])) - len(cell["failed"])
    return text if not cell["failed"] else f"{text} ({done}/{cell['runs']})"


def _ratio(theirs: dict[str, Any] | None, ours: dict[str, Any] | None, key: str) -> str:
    if theirs is None or ours is None or not ours[key]["median"]:
        return ""
    if theirs[key]["median"] is None:
        return "n/a"
    return f"{theirs[key]['median'] / ours[key]['median']:.1f}x"


def table_lines(results: dict[str, Any]) -> list[str]:
    summ = summarize(results["rows"])
    if not summ:  # a bench.json from before these backends (its labels were profiles)
        return ["\nrendezvous: no run of etcd-v2, etcd-v3 or etcd-lease in these results"]
    sizes = sorted({int(n) for cells in summ.values() for n in cells})
    labels = [lb for lb in LABELS if lb in summ]
    out = [f"\n{'rendezvous':<38}" + "".join(f"{lb:>22}" for lb in labels)]
    for n in sizes:
        cells = {lb: summ[lb].get(str(n)) for lb in labels}
        ours = cells.get("etcd-lease")
        for key, title in PHASES:
            line = f"{f'{title}, {n} agents':<38}"
            for lb in labels:
                ratio = _ratio(cells[lb], ours, key) if lb != "etcd-lease" else ""
                line += f"{_seconds(cells[lb], key) + (' ' + ratio if ratio else ''):>22}"
            out.append(line)
        for key, title, _ in COSTS:
            line = f"{'  ' + title:<38}"
            for lb in labels:
                value = (cells[lb] or {}).get(key)
                line += f"{_count(value):>22}"
            out.append(line)
    m = results.get("machine", {})
    out.append(f"\nload average at start {m.get('load_at_start')}, at end {m.get('load_at_end')}")
    return out


def _count(value: float | None) -> str:
    """A cost: '-' when not measured, whole above 1000 (1,045,030, not 1.04503e+06)."""
    if value is None:
        return "-"
    return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:g}"


def print_table(results: dict[str, Any]) -> None:
    for line in table_lines(results):
        print(line)


def _md_seconds(cell: dict[str, Any] | None, key: str) -> str:
    if cell is None:
        return "-"
    s, runs = cell[key], cell["runs"]
    if s["median"] is None:
        return f"none in {runs}"
    spread = f" ({s['min']:.2f}-{s['max']:.2f})" if s["runs"] > 1 else ""
    text = f"{s['median']:.2f} s{spread}"
    return text if s["runs"] == runs else f"{text}, {s['runs']} of {runs}"


def markdown_lines(results: dict[str, Any]) -> list[str]:
    """The table docs/rendezvous.md shows: per size, each phase's median (min-max; how
    many runs converged when not all), torch's backends as a ratio to etcd-lease, then what
    an agent cost etcd."""
    summ = summarize(results["rows"])
    labels = [lb for lb in LABELS if lb in summ]
    head = "| agents | figure | " + " | ".join(labels) + " |"
    out = [head, "| --- | --- | " + " | ".join("---" for _ in labels) + " |"]
    sizes = sorted({int(n) for cells in summ.values() for n in cells})
    for n in sizes:
        cells = {lb: summ[lb].get(str(n)) for lb in labels}
        ours = cells.get("etcd-lease")
        for key, title in PHASES:
            row = []
            for lb in labels:
                text = _md_seconds(cells[lb], key)
                ratio = _ratio(cells[lb], ours, key) if lb != "etcd-lease" else ""
                row.append(text + (f"; {ratio}" if ratio and ratio != "n/a" else ""))
            out.append(f"| {n} | {title} | " + " | ".join(row) + " |")
        for key, title, _ in COSTS:
            values = [(cells[lb] or {}).get(key) for lb in labels]
            out.append(f"| {n} | {title} | " + " | ".join(_count(v) for v in values) + " |")
    return out
