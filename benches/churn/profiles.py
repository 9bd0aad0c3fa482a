"""What the churn figures compare, as values files for the chart: torch's defaults
through the chart, the project's defaults, a fixed-size job; and the scripts of the
silent figure with the line that begins a step."""

from __future__ import annotations

import re

from benches.churn.localrun import Values
from benches.env import ROOT

USER_SCRIPT_DIR = ROOT / "tests" / "e2e" / "user_script"
#: train.py's per-rank batch (images/worker/examples/train.py, batch()).
SAMPLES_PER_RANK_STEP = 16
#: torch's defaults through the chart: its rendezvous waits (last call 30 s, close 30 s,
#: keep-alive 5 s x 3, monitor 0.1 s), no round liveness, a new interpreter per training
#: process. (A values file, not --set: helm reads `--set x=0.1` as a string.)
TORCH_DEFAULTS: Values = {
    "rendezvous": {
        "lastCallTimeout": 30,
        "closeTimeout": 30,
        "keepAliveInterval": 5,
        "keepAliveMaxAttempt": 3,
        "monitorInterval": 0.1,
        "lossDetection": {"enabled": False},
        "lifeline": {"enabled": False},
    },
    "job": {"warmStart": {"enabled": False}},
}
SILENT_PROFILES: dict[str, Values] = {"torch defaults": TORCH_DEFAULTS, "elastic-job": {}}
GOODPUT_PROFILES: dict[str, Values] = {
    "fixed-size 3:3": {"job": {"minNodes": 3, "maxNodes": 3}},
    "elastic-job": {},  # cpu-smoke's 2:3
}
USEFUL_WORK = "train.py samples of kept steps (not rolled back), all ranks, per wall second"
#: The user script mounted as the e2e scenarios mount it (a hostPath volume).
USER_SCRIPT: Values = {
    "worker": {
        "extraVolumes": [{"name": "user-script", "hostPath": {"path": str(USER_SCRIPT_DIR)}}],
        "extraVolumeMounts": [
            {"name": "user-script", "mountPath": "/opt/user-script", "readOnly": True}
        ],
    }
}
# The scripts of the silent figure: command, extra values, a line that begins a step.
TRAIN_COMMAND = [
    "python", "/opt/elastic-worker/examples/train.py", "--steps", "1000000",
    "--checkpoint-every", "10", "--step-seconds", "0.5",
]  # fmt: skip
SCRIPTS: dict[str, tuple[list[str], Values, re.Pattern[str]]] = {
    "train.py": (TRAIN_COMMAND, {}, re.compile(r"^\[train\] step=")),
    "no pg timeout": (
        [
            "python", "/opt/user-script/multinode.py", "1000000", "5",
            "--snapshot-path", "/checkpoints/snapshot.pt", "--epoch-seconds", "0.5",
        ],
        USER_SCRIPT,
        re.compile(r"^\[GPU\d+\] Epoch \d+ \|"),
    ),
}  # fmt: skip


def merged(*layers: Values) -> Values:
    """Values layers merged as helm merges -f files: maps deeply, the last one wins."""
    out: Values = {}
    for layer in layers:
        for key, value in layer.items():
            if isinstance(value, dict) and isinstance(out.get(key), dict):
                out[key] = merged(out[key], value)
            else:
                out[key] = value
    return out
