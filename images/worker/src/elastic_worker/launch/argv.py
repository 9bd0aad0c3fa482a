"""torchrun's command line and environment, built by pure functions (data in, data out):
the user's command wrapped in the attempt shim (attempt_line.py), started warm when a
warm server runs (warm/), the rendezvous settings, and the variables torchrun's
environment gets. supervisor.py runs what these build."""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Mapping, Sequence

from elastic_worker import bundle
from elastic_worker.attempt_line import ATTEMPT_ARGV0, attempt_script
from elastic_worker.gate.netif import Choice
from elastic_worker.launch.torchrun import argv_prefix
from elastic_worker.settings.config import Config
from elastic_worker.warm.protocol import warm_command

_PYTHON = re.compile(r"python(\d+(\.\d+)?)?")


def shutdown_timeout(grace_period: int) -> int:
    """Seconds torchrun gives its workers after SIGTERM: the pod's grace period minus a
    margin (2-10 s) for torchrun and this process to exit before the kubelet's SIGKILL."""
    margin = min(10, max(2, grace_period // 6))
    return max(1, grace_period - margin)


def program_argv(command: Sequence[str], python: str) -> list[str]:
    """The argv torchrun itself would give the user's program (torch.distributed.run:
    `python -u` in front of a script or `-m module`), so that wrapping it in the attempt
    shim changes nothing the program sees.

    `python script.py a` -> `PY -u script.py a`; `python -m pkg a` -> `PY -u -m pkg a`;
    `script.py a` -> `PY -u script.py a`; anything else (a binary, `python -u x.py`)
    -> the command as given.
    """
    cmd = list(command)
    if not cmd:
        raise ValueError("empty command")
    if _PYTHON.fullmatch(os.path.basename(cmd[0])):
        rest = cmd[1:]
        if len(rest) >= 2 and rest[0] == "-m":
            return [python, "-u", *rest]
        if rest and not rest[0].startswith("-"):
            return [python, "-u", *rest]
        return cmd
    if cmd[0].endswith(".py"):
        return [python, "-u", *cmd]
    return cmd


def command_args(
    command: Sequence[str], python: str, pwd: str | None = None, warm_socket: str | None = None
) -> list[str]:
    """torchrun's trailing arguments: the attempt shim in front of the program, started
    warm through `warm_socket` when given and the program is a python one (warm.py)."""
    shim = ["sh", "-c", attempt_script(pwd), ATTEMPT_ARGV0]
    program = program_argv(command, python)
    if warm_socket is not None:
        program = warm_command(program, python, warm_socket) or program
    return ["--no-python", *shim, *program]


def rdzv_conf_arg(pairs: Sequence[tuple[str, str]]) -> str:
    return ",".join(f"{key}={value}" for key, value in pairs)


def build_argv(
    config: Config,
    local_addr: str | None,
    python: str = sys.executable,
    *,
    rdzv_id: str | None = None,
    pwd: str | None = None,
    warm_socket: str | None = None,
    report: str | None = None,
) -> list[str]:
    """torchrun's command line (torch's, through torchrun.py for the exit barrier's
    timeout); `rdzv_id` defaults to the job id (generation 0), `pwd` is PWD in
    torchrun's environment (attempt_script), `warm_socket` the warm server's (warm.py),
    if one runs, `report` where torchrun tells when its workers succeeded."""
    argv = [
        *bundle.module_argv(python, bundle.TORCHRUN),
        *argv_prefix(config.exit_barrier_timeout, report),
        f"--rdzv-backend={config.rdzv_backend}",
        f"--rdzv-endpoint={config.endpoint}",
        f"--rdzv-id={rdzv_id or config.job_id}",
        f"--nnodes={config.min_nodes}:{config.max_nodes}",
        f"--nproc-per-node={config.nproc_per_node}",
        f"--max-restarts={config.max_restarts}",
        f"--monitor-interval={config.monitor_interval:g}",
    ]
    if config.rdzv_conf:
        argv.append(f"--rdzv-conf={rdzv_conf_arg(config.rdzv_conf)}")
    if local_addr:
        argv.append(f"--local-addr={local_addr}")
    return argv + command_args(config.command, python, pwd, warm_socket)


def build_env(
    config: Config, choice: Choice | None, base: Mapping[str, str]
) -> tuple[dict[str, str], dict[str, str]]:
    """torchrun's environment and the subset this function added (for the log)."""
    added: dict[str, str] = {}

    def default(name: str, value: str) -> None:
        if not base.get(name):
            added[name] = value

    if choice is not None:
        default("NCCL_SOCKET_IFNAME", choice.nccl)
        default("GLOO_SOCKET_IFNAME", choice.gloo)
    default("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", str(shutdown_timeout(config.grace_period)))
    # With the agent's shared TCPStore (docs/notes/2026-11-21-torch-rendezvous-settings.md),
    # restarted workers read the previous attempt's gloo addresses (connection refused) and
    # a survivor keeps the dead rank 0's store address (init_process_group hangs). Off: each
    # round's rank 0 worker hosts a fresh store on a port published for that round.
    default("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")
    default("PYTHONUNBUFFERED", "1")
    env = dict(base)
    env.update(added)
    return env, added
