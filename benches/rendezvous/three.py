"""The README's performance figures at three and four nodes, with elastic-job's defaults
(bench-recovery's tuned-warm: real torchrun agents, train.py, gloo, warm starts, the
worker's lifelines and leave), on each backend in turn (`scripts/bench-rendezvous
--three-nodes`): SIGKILL of one of three (the group-rank-0 node and another), SIGTERM of
one, scale-up 2 -> 3, bring-up of 4; seconds until every survivor (or every node) trains.

The worker's lifelines and leave act on every backend (elastic_worker/recovery/round.py):
on torch's dynamic rendezvous through torchcompat.py, on etcd-lease by revoking the lost
node's lease, after which the round re-forms without it at once.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benches.recovery.measure import run_once as recovery_run
from benches.stats import summary
from benches.suite.figures import PROFILES, RUNS, reduce

#: bench-recovery's profile for elastic-job's defaults (scripts/bench's "elastic-job").
PROFILE = PROFILES["elastic-job"]
BACKENDS = ("etcd-v2", "etcd-v3", "etcd-lease")


def run(backends: list[str], repeat: int, say: Callable[[str], None] = print) -> dict[str, Any]:
    rows: list[dict[str, Any]] = []
    for figure, (_, kwargs, victims) in RUNS.items():
        for _ in range(repeat):
            for victim in victims:
                for backend in backends:  # in turn: the same stretch of the machine for each
                    workdir = Path(tempfile.mkdtemp(prefix=f"bench-three-{figure}-"))
                    result = recovery_run(
                        PROFILE, victim, workdir, 120.0, backend=backend, **kwargs
                    )
                    row = {**reduce(figure, backend, victim, result), "backend": backend}
                    rows.append(row)
                    say(json.dumps(row))
                    shutil.rmtree(workdir, ignore_errors=True)
    summ = {
        figure: {
            b: summary([r for r in rows if r["figure"] == figure and r["backend"] == b])
            for b in backends
        }
        for figure in RUNS
    }
    return {"rows": rows, "summary": summ}


def table_lines(results: dict[str, Any]) -> list[str]:
    summ = results["summary"]
    backends = list(next(iter(summ.values())))
    out = [f"\n{'elastic-job defaults':<28}" + "".join(f"{b:>24}" for b in backends)]
    for figure, (title, _, _) in RUNS.items():
        cells = summ.get(figure, {})
        line = f"{title:<28}"
        for b in backends:
            s = cells.get(b) or {}
            text = (
                "failed"
                if s.get("median") is None
                else f"{s['median']:.2f} s ({s['min']:.1f}-{s['max']:.1f})"
            )
            line += f"{text:>24}"
        out.append(line)
    return out
