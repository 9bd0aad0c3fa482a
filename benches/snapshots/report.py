"""The snapshot figures' lines in scripts/bench's (and bench-snapshots') table."""

from __future__ import annotations

from typing import Any

FIGURES = ("snap-loss", "snap-overhead", "snap-goodput")
SLOW = ("snap-goodput",)  # two local runs of ~8 min each per repeat (the short variant ~3)
LOSS_NAMES = {"kill": "SIGKILL", "silent": "silent loss", "sigterm": "SIGTERM"}


def _lost(s: dict[str, Any]) -> str:
    lost, seconds = s["steps_lost"], s["seconds"]
    if lost.get("median") is None:
        return "failed"
    return (
        f"lost {lost['median']:g} ({lost['min']:g}-{lost['max']:g}), "
        f"{seconds['median']:.1f} s, n={lost['runs']}"
    )


def loss_lines(results: dict[str, Any]) -> list[str]:
    fig = results["snap-loss"]
    out = [
        f"\nsteps lost per loss of 1 of 3 and seconds to train again "
        f"(checkpoint every {fig['checkpoint_every']} steps)",
        f"{'loss':<24} {'checkpoint only':>30} {'snapshots':>30}  state from",
    ]
    for key, ours in fig["summary"].items():
        parallel, how, label = key.split("/")
        if label != "snapshots":
            continue
        base = fig["summary"][f"{parallel}/{how}/checkpoint only"]
        title = f"{LOSS_NAMES.get(how, how)}, {parallel}"
        out.append(f"{title:<24} {_lost(base):>30} {_lost(ours):>30}  {','.join(ours['sources'])}")
    return out


def overhead_lines(results: dict[str, Any]) -> list[str]:
    rows = [r for r in results["snap-overhead"]["rows"] if "error" not in r]
    out = ["\nper-step cost of keeping the state (median over repeats)"]

    def median(values: list[float]) -> float | None:
        values = sorted(values)
        return values[len(values) // 2] if values else None

    base = median(
        [r["step_seconds"] for r in rows if r["what"] == "train.py" and not r["snapshots"]]
    )
    ours = median([r["step_seconds"] for r in rows if r["what"] == "train.py" and r["snapshots"]])
    if base and ours:
        out.append(
            f"  train.py (DDP): {base * 1e3:.2f} ms -> {ours * 1e3:.2f} ms a step "
            f"({(ours / base - 1) * 100:+.1f} %)"
        )
    for parallel, none, kept in (("ddp", None, 0), ("fsdp2", 0, 1)):
        what = f"100M+ {parallel}"
        b = [r for r in rows if r["what"] == what and r["every"] == none]
        o = [r for r in rows if r["what"] == what and r["every"] == kept]
        if not b or not o:
            continue
        bs, os_ = median([r["step_seconds"] for r in b]), median([r["step_seconds"] for r in o])
        assert bs is not None and os_ is not None
        line = (
            f"  {o[0]['params'] / 1e6:.0f}M params, {parallel}"
            f"{', ring replica every step' if kept else ''}: {bs:.2f} s -> {os_:.2f} s a step "
            f"({(os_ / bs - 1) * 100:+.1f} %, load average {o[0]['load_average']})"
        )
        out.append(line)
        r = next((x for x in b + o if "restore_from_memory_s" in x), None)
        if r is not None:
            out.append(
                f"    restore after a loss: save to memory {r['save_to_memory_s']:.2f} s, "
                f"restore from memory {r['restore_from_memory_s']:.2f} s "
                f"({r['restored_source']}) against a checkpoint load {r['load_checkpoint_s']:.2f} s"
            )
        stats = o[0].get("stats", {})
        if kept and stats.get("ring_copies"):
            n = stats["ring_copies"]
            out.append(
                f"    in the ring's thread per step: copy {stats['ring_copy_seconds'] / n:.2f} s, "
                f"exchange {stats['ring_exchange_seconds'] / n:.2f} s, "
                f"{stats['ring_bytes_sent'] / n / 1e6:.0f} MB sent; main thread waited "
                f"{stats['ring_wait_seconds'] / n * 1e3:.0f} ms"
            )
    epochs = [r for r in rows if r["what"].endswith("updates per step")]
    stats = epochs[0].get("stats", {}) if epochs else {}
    if stats.get("step_copies"):
        n, r = stats["step_copies"], epochs[0]
        out.append(
            f"  {r['params'] / 1e6:.0f}M params, ddp, {r['updates_per_step']} optimizer steps per "
            f"step_done: a copy of {stats['step_copy_bytes'] / 1e9:.2f} GB in host memory, "
            f"{stats['step_copy_seconds'] / n:.2f} s per step_done (mean of {n:g}, the first "
            f"allocating it; load average {r['load_average']})"
        )
    return out


def goodput_lines(results: dict[str, Any]) -> list[str]:
    fig = results["snap-goodput"]
    out = [
        f"\ngoodput, one loss every {fig['T']:g} s, back after {fig['R']:g} s, "
        "checkpoint every 100 steps (kept steps/s over the no-loss rate; samples/s)"
    ]
    for label, s in fig["summary"].items():
        ratio, samples = s["ratio"], s["samples_per_s"]
        if ratio.get("median") is None:
            out.append(f"  {label}: failed")
            continue
        out.append(
            f"  {label:<16} {ratio['median']:.2f} ({ratio['min']:.2f}-{ratio['max']:.2f}, "
            f"n={ratio['runs']}); {samples['median']:.0f} samples/s"
        )
    return out


def table_lines(results: dict[str, Any]) -> list[str]:
    out: list[str] = []
    if "snap-loss" in results:
        out += loss_lines(results)
    if "snap-overhead" in results:
        out += overhead_lines(results)
    if "snap-goodput" in results:
        out += goodput_lines(results)
    return out
