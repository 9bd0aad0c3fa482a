"""The round's operations (recovery/round.py's RoundOps: read it, take a node out) in a
helper process forked from the warm server, so that elastic-worker itself never imports
torch for them: `python -m elastic_worker.recovery.lifelines.helper ops RDZV_ID`, one
per torchrun (HelperClient here; its requests and answers are in messages.py). Without a
warm server they run in elastic-worker itself (round.InProcess), at the price of torch's
rendezvous module imported there beside torchrun's own start (docs/notes/).
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import subprocess
import sys
import threading
from collections.abc import Callable, Sequence
from typing import Any

from elastic_worker import bundle, timings
from elastic_worker.recovery.lifelines import messages
from elastic_worker.recovery.lifelines.messages import HelperError
from elastic_worker.recovery.round import InProcess, Leases, RoundOps, in_own_keys
from elastic_worker.settings import config
from elastic_worker.settings.config import Config
from elastic_worker.torchcompat import RdzvNode, RoundView
from elastic_worker.warm.protocol import CLIENT_MODULE

logger = logging.getLogger(__name__)

__all__ = ["HelperClient", "HelperError", "main", "ops_for"]


class HelperClient:
    """Both in one process forked from the warm server (torch imported there) through the
    warm start client, for as long as this torchrun runs: a line in, a JSON line out
    (main() below; messages.py). It is started at once, so that it has imported torch's rendezvous
    module (0.1 s) before the first round; one that died is started again at the next
    request."""

    def __init__(self, socket_path: str, rdzv_id: str) -> None:
        client = bundle.module_argv(sys.executable, CLIENT_MODULE, bundle.WARM)
        self._argv = [*client, socket_path]
        self._argv += ["-m", "elastic_worker.recovery.lifelines.helper", "ops", rdzv_id]
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[bytes] | None = None
        self._said = False
        with self._lock:
            self._start()

    def _start(self) -> subprocess.Popen[bytes]:
        self._proc = subprocess.Popen(self._argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        return self._proc

    def _ask(self, request: str) -> dict[str, Any]:
        with self._lock:
            proc = self._proc
            if proc is None or proc.poll() is not None:
                proc = self._start()
            assert proc.stdin is not None and proc.stdout is not None
            try:
                proc.stdin.write(request.encode() + b"\n")
                proc.stdin.flush()
                readable, _, _ = select.select([proc.stdout], [], [], timings.HELPER_TIMEOUT)
                line = proc.stdout.readline() if readable else b""
            except OSError:
                line = b""
            if not line:
                try:  # its output closed: the client ends as the helper did, a moment later
                    ended: int | None = proc.wait(1)
                except subprocess.TimeoutExpired:
                    ended = None  # alive but mute: a timeout
                self._end(proc)
                if ended is not None and not self._said:
                    self._said = True  # once: each round asks again, and says it on stderr
                    logger.warning(
                        "lifelines: the helper that reads the round ended (exit %d): "
                        "a lost peer may leave the round only when its keep-alive lapses",
                        ended,
                    )
                raise HelperError(f"the lifelines' helper did not answer {request!r}")
        return messages.parse_reply(line)

    def participants(self) -> list[RdzvNode]:
        return messages.nodes_of(self._ask(messages.participants_request()))

    def round(self) -> RoundView:
        return messages.round_of(self._ask(messages.round_request()))

    def remove(self, node: RdzvNode, since: float) -> bool:
        return bool(self._ask(messages.remove_request(node, since))["removed"])

    def leave(self, node: RdzvNode) -> bool:
        return bool(self._ask(messages.leave_request(node))["removed"])

    def _end(self, proc: subprocess.Popen[bytes]) -> None:
        with contextlib.suppress(OSError):
            proc.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(5)
        self._proc = None

    def close(self) -> None:
        with self._lock:
            proc, self._proc = self._proc, None
        if proc is None:
            return
        with contextlib.suppress(OSError):
            assert proc.stdin is not None
            proc.stdin.close()  # the helper ends at the end of its input
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            self._end(proc)


def ops_for(
    config: Config,
    rdzv_id: str,
    warm_socket: str | None,
    own: Callable[[], RdzvNode | None] | None = None,
) -> RoundOps:
    """In a helper forked from the warm server when one runs (`warm_socket`), else here;
    on etcd-lease here always (round.Leases needs no torch); `own`: this pod's torchrun."""
    if in_own_keys(config):
        return Leases(config, rdzv_id, own)
    if warm_socket is None:
        return InProcess(config, rdzv_id)
    return HelperClient(warm_socket, rdzv_id)


def main(argv: Sequence[str] | None = None) -> int:
    """`ops RDZV_ID`: the lifelines' helper (HelperClient). Reads `participants` (answers
    {"nodes": [[addr, pid], ...]}), `round` (messages.round_reply), `remove ADDR PID SINCE`
    (answers {"removed": bool}, round.take_out with `dead_since` SINCE) and `leave ADDR
    PID` (the same, this pod's own node) until its input ends; {"error": ...} when one
    fails. Its settings are elastic-worker's environment (a warm child gets it)."""
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 2 or args[0] != "ops":
        print(
            "usage: python -m elastic_worker.recovery.lifelines.helper ops RDZV_ID", file=sys.stderr
        )
        return 2
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("elastic-worker: %(message)s"))
    own = logging.getLogger("elastic_worker")
    own.handlers[:], own.propagate = [handler], False
    own.setLevel(logging.WARNING)
    logging.getLogger("elastic_worker.recovery.round").setLevel(logging.INFO)  # "took ... out"
    try:
        cfg = config.load(["python", "train.py"])  # elastic-worker's environment
    except config.ConfigError as exc:  # elastic-worker itself started with these: not here
        print(f"elastic-worker: the lifelines' helper: {exc}", file=sys.stderr)
        return 2
    ops = InProcess(cfg, args[1])
    with contextlib.suppress(Exception):  # torch's handler before the first round: not needed yet
        ops.participants()
    for line in sys.stdin:
        try:
            request = messages.read_request(line)
        except ValueError as exc:
            print(messages.reply(error=str(exc)), flush=True)
            continue
        try:
            if request.kind == "participants":
                answer = messages.reply(nodes=ops.participants())
            elif request.kind == "round":
                answer = messages.round_reply(ops.round())
            elif request.kind == "remove":
                assert request.node is not None and request.since is not None
                answer = messages.reply(removed=ops.remove(request.node, request.since))
            else:
                assert request.node is not None
                answer = messages.reply(removed=ops.leave(request.node))
        except Exception as exc:  # noqa: BLE001 - etcd's and torch's errors: said, not fatal
            answer = messages.reply(error=f"{type(exc).__name__}: {exc}")
        print(answer, flush=True)
    return 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # Without the interpreter's teardown: with torch's rendezvous loaded it took 2-3 s,
    # and a torchrun started again after a stuck round waits for this helper to end.
    os._exit(code)
