"""torch's torchrun, with the job's exit barrier timeout, telling elastic-worker when its
workers succeeded (docs/notes/2026-11-27-end-of-job.md).

When a node's training processes have all exited 0, its torchrun waits in torch's exit
barrier until every other node's have too, or a timeout passes; only then does it exit
0. torchrun has no option for that timeout (300 s): torchcompat.py, the one reach into
torch's launcher, gives it the job's, then torch's own `main` runs. A torch whose launcher
does not take it is said in one line and keeps its own.

With `--report=PATH`, the moment torchrun sees its worker group succeed (torch's
documented metrics API: the agent puts `workers.<role>.succeeded` just before its exit
barrier) is appended to PATH as `succeeded <unix time>`: elastic-worker then says whom
the node waits for (supervisor.py, ExitBarrier).

    python -m elastic_worker.launch.torchrun --exit-barrier-timeout=S [--report=PATH] ARGS...
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence

from elastic_worker import torchcompat

#: Our options, before torchrun's own (which have none of these names).
TIMEOUT_OPTION = "--exit-barrier-timeout="
REPORT_OPTION = "--report="
SUCCEEDED = "succeeded"


def argv_prefix(timeout: float, report: str | None) -> list[str]:
    """Our options as argv.build_argv puts them after the module."""
    return [f"{TIMEOUT_OPTION}{timeout:g}", *([f"{REPORT_OPTION}{report}"] if report else [])]


def split_args(args: Sequence[str]) -> tuple[float, str | None, list[str]]:
    """(exit barrier timeout, report path, torchrun's arguments)."""
    rest = list(args)
    timeout: float | None = None
    report: str | None = None
    while rest and rest[0].startswith((TIMEOUT_OPTION, REPORT_OPTION)):
        arg = rest.pop(0)
        if arg.startswith(TIMEOUT_OPTION):
            timeout = float(arg[len(TIMEOUT_OPTION) :])
        else:
            report = arg[len(REPORT_OPTION) :]
    if timeout is None or not timeout > 0:
        raise ValueError(f"{TIMEOUT_OPTION}SECONDS (> 0) must come first")
    return timeout, report, rest


def report_success(path: str) -> None:
    """Append `succeeded <time>` to `path` when the agent puts workers.<role>.succeeded."""
    from torch.distributed.elastic.metrics import api  # noqa: PLC0415

    class Handler(api.MetricHandler):
        def emit(self, metric_data: api.MetricData) -> None:
            if metric_data.name.endswith(f".{SUCCEEDED}") and metric_data.value:
                try:
                    with open(path, "a") as out:
                        out.write(f"{SUCCEEDED} {time.time():.3f}\n")
                except OSError:  # elastic-worker's view only: never torchrun's end
                    pass

    api.configure(Handler(), group="torchelastic")


def main(argv: Sequence[str] | None = None) -> None:
    try:
        timeout, report, rest = split_args(sys.argv[1:] if argv is None else argv)
    except ValueError as exc:
        sys.exit(
            f"usage: python -m elastic_worker.launch.torchrun {exc}, then torchrun's arguments"
        )
    problem = torchcompat.exit_barrier_problem()
    if problem is None:
        torchcompat.set_exit_barrier_timeout(timeout)
    else:
        sys.stderr.write(
            f"elastic-worker: torch {torchcompat.torch_version()}: {problem}: torchrun keeps "
            "its own exit barrier timeout (300 s), not job.exitBarrierTimeoutSeconds\n"
        )
    if report:
        report_success(report)
    from torch.distributed import run  # noqa: PLC0415

    sys.argv = ["torchrun", *rest]  # what torch's own errors and @record name
    run.main(rest)


if __name__ == "__main__":
    main()
