"""benches/snapshots: the lines it reads from the scripts and the library, and its table."""

from __future__ import annotations

from benches.snapshots.report import table_lines
from benches.snapshots.scripts import DDP, FSDP2, RESTORED


def test_the_lines_of_both_scripts_and_of_the_library_are_read() -> None:
    step = DDP.step.match("[train] step=41 world_size=3 restart=0 loss=0.1234")
    assert step and (step[1], step[2]) == ("41", "3")
    assert DDP.start.match("[train] resumed step=40")[1] == "40"  # type: ignore[index]
    fsdp = FSDP2.step.match("[snap] step=7 rank=2 world=3 digest=1.0e+01")
    assert fsdp and (fsdp[1], fsdp[2]) == ("7", "3")
    start = "[snap] start step=7 source=peer-memory lost=0 rank=0 world=2 digest=1.0e+01"
    assert FSDP2.start.match(start)[1] == "7"  # type: ignore[index]
    line = "[elastic-snapshot] restored step=7 from peer-memory (world 2, was 3), lost=0 step(s)"
    assert RESTORED.search(line)[2] == "peer-memory"  # type: ignore[index]
    assert "--no-snapshots" in DDP.command(snapshots=False, checkpoint_every=20, step_seconds=0.2)


def test_the_table_sets_each_loss_beside_todays_path() -> None:
    def s(median: float, runs: int = 2) -> dict[str, float]:
        return {"runs": runs, "median": median, "min": median, "max": median}

    results = {
        "snap-loss": {
            "checkpoint_every": 20,
            "summary": {
                "ddp/kill/checkpoint only": {"seconds": s(4.2), "steps_lost": s(13), "sources": []},
                "ddp/kill/snapshots": {
                    "seconds": s(4.0),
                    "steps_lost": s(0),
                    "sources": ["peer-memory"],
                },
            },
        },
        "snap-overhead": {
            "rows": [
                {"what": "train.py", "snapshots": False, "step_seconds": 0.010},
                {"what": "train.py", "snapshots": True, "step_seconds": 0.0101},
                {
                    "what": "100M+ ddp, 3 updates per step",
                    "params": 102_789_120,
                    "updates_per_step": 3,
                    "load_average": 1.5,
                    "stats": {
                        "step_copies": 4.0,
                        "step_copy_seconds": 2.0,
                        "step_copy_bytes": 1.24e9,
                    },
                },
            ]
        },
    }
    text = "\n".join(table_lines(results))
    assert "SIGKILL, ddp" in text
    assert "lost 13 (13-13), 4.2 s, n=2" in text and "lost 0 (0-0), 4.0 s, n=2" in text
    assert "train.py (DDP): 10.00 ms -> 10.10 ms a step (+1.0 %)" in text
    assert (
        "103M params, ddp, 3 optimizer steps per step_done: a copy of 1.24 GB in host memory, "
        "0.50 s per step_done (mean of 4, the first allocating it; load average 1.5)"
    ) in text
