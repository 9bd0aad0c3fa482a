"""Start one training process from the warm server (server.py) instead of a new interpreter.

torchrun runs `python -m elastic_worker.warm.client SOCKET -u script.py args...` (through the
attempt shim) where it would run `python -u script.py args...`. This process hands its
argv, environment, working directory and stdin/stdout/stderr to the server, which forks a
child that has already imported torch; then it stands in for that child, so torchrun
sees, signals and reaps it as before: the signals torchrun sends (to this process's
group) are passed on to the child's group, and this process ends as the child did, with
its exit code or by its signal. If it is SIGKILLed, the server kills the child. When
the server cannot be reached, or refuses, the same command runs cold, as it would have
without warm starts.

Only the standard library (and protocol.py): this interpreter starts once per attempt and
must stay cheap.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import sys
from collections.abc import Sequence
from types import FrameType

from elastic_worker import bundle
from elastic_worker.warm import protocol

#: Signals passed on to the child. SIGKILL and SIGSTOP cannot be caught; SIGCHLD, SIGTSTP
#: and the job-control signals are about this process itself.
FORWARDED = (
    signal.SIGTERM,
    signal.SIGINT,
    signal.SIGHUP,
    signal.SIGQUIT,
    signal.SIGUSR1,
    signal.SIGUSR2,
    signal.SIGALRM,
    signal.SIGABRT,
)


def cold(command: Sequence[str], why: str) -> None:
    """Run the command as torchrun would have, in this process: it never returns."""
    sys.stderr.write(f"elastic-worker warm start: {why}; starting cold\n")
    sys.stderr.flush()
    argv = bundle.python_argv(sys.executable, command)  # a module of ours needs the bundle
    os.execv(argv[0], argv)


def _end_like(status: int) -> None:
    """Exit as the child did: its exit code, or killed by the same signal."""
    code = os.waitstatus_to_exitcode(status)
    if code >= 0:
        os._exit(code)
    signal.signal(-code, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, [-code])
    os.kill(os.getpid(), -code)
    os._exit(128 - code)  # not reached for a fatal signal


def main(argv: Sequence[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) < 2:
        sys.exit("usage: python -m elastic_worker.warm.client SOCKET PYTHON-ARGS...")
    path, command = args[0], args[1:]
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.connect(path)
        protocol.send_request(conn, command, dict(os.environ), os.getcwd())
        started = protocol.read_reply(conn)
    except OSError as exc:
        conn.close()
        cold(command, f"server at {path} unavailable ({exc})")
        return
    if started is None or "pid" not in started:
        conn.close()
        cold(command, f"server at {path} did not start it")
        return
    child = started["pid"]

    def forward(signum: int, frame: FrameType | None) -> None:
        try:
            os.killpg(child, signum)
        except ProcessLookupError:  # not yet its own group leader
            with contextlib.suppress(ProcessLookupError):
                os.kill(child, signum)

    for signum in FORWARDED:
        signal.signal(signum, forward)
    ended = protocol.read_reply(conn)
    if ended is None or "status" not in ended:
        # The server is gone; its children die with it (PR_SET_PDEATHSIG).
        sys.stderr.write(f"elastic-worker warm start: server at {path} went away\n")
        os._exit(1)
    _end_like(ended["status"])


if __name__ == "__main__":
    main()
