"""How the command prints: kubectl's `-o` formats (the table, `wide`, `json`, `yaml`), its
column layout and its AGE."""

from __future__ import annotations

import json
from typing import Any

import yaml

#: -o of every command that prints data; `list` adds wide.
FORMATS = ("text", "json", "yaml")


def dump(data: Any, fmt: str) -> str:
    """`data` as one JSON or YAML document (keys in their order)."""
    if fmt == "json":
        return json.dumps(data, indent=1) + "\n"
    return str(yaml.safe_dump(data, sort_keys=False, default_flow_style=False))


def stream_item(data: Any, fmt: str) -> str:
    """One item of a stream (events, `events -w`): a JSON line, or a YAML document that
    starts with `---` (as `kubectl get -w -o yaml` prints them)."""
    if fmt == "json":
        return json.dumps(data) + "\n"
    return "---\n" + str(yaml.safe_dump(data, sort_keys=False, default_flow_style=False))


def table(rows: list[list[str]]) -> str:
    """Columns two spaces apart, left-aligned, no trailing blanks (kubectl's printer)."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "".join(
        "  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip() + "\n"
        for r in rows
    )


def age(seconds: float) -> str:
    """kubectl's AGE (apimachinery's duration.HumanDuration): 90s, 5m30s, 3h20m, 2d4h,
    400d, 2y3d."""
    s = int(seconds)
    if s < -1:
        return "<invalid>"
    if s < 0:
        return "0s"
    if s < 120:
        return f"{s}s"
    minutes = s // 60
    if minutes < 10:
        return f"{minutes}m{s % 60}s" if s % 60 else f"{minutes}m"
    if minutes < 180:
        return f"{minutes}m"
    hours = s // 3600
    if hours < 8:
        return f"{hours}h{minutes % 60}m" if minutes % 60 else f"{hours}h"
    if hours < 48:
        return f"{hours}h"
    if hours < 24 * 8:
        return f"{hours // 24}d{hours % 24}h" if hours % 24 else f"{hours // 24}d"
    if hours < 24 * 365 * 2:
        return f"{hours // 24}d"
    if hours < 24 * 365 * 8:
        days = (hours // 24) % 365
        return f"{hours // 24 // 365}y{days}d" if days else f"{hours // 24 // 365}y"
    return f"{hours // 24 // 365}y"
