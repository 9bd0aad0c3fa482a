"""Warm starts: a server that has imported torch forks each new training process.

After a re-form most of the wait is a new interpreter importing torch (seconds, more in
CUDA images). The entrypoint starts this server once per pod, before torchrun; torchrun
runs client.py in place of `python -u`, which asks the server for a child. The child
is a fork of a process that has imported torch (and the modules in
ELASTIC_WARM_PRELOAD) and nothing else: no CUDA context (checked before every fork), no
user code. In the child, the client's stdin/stdout/stderr, environment, working
directory and argv replace the server's, the server's own modules and logging are
dropped, the script runs as `__main__` like `python -u`, and what import-time state
would differ from a fresh interpreter is redone (child.py): torch's thread count from
OMP_NUM_THREADS, numpy's global seed (Python's `random` reseeds itself after fork).
What the server imported is frozen out of the cycle collector (gc.freeze), and a child's
env:// waits for rank 0's store (master.py). Each child leads its own process group
(torchrun signals groups), dies with the server (PR_SET_PDEATHSIG) and is SIGKILLed when
its client goes. Requests and answers: protocol.py.

A child tells the server when its script has returned (a pipe of its own); with a
teardown bound, a training process (started by torchrun) still running that long
afterwards (its teardown blocks: a destructor, an atexit handler, a thread left running)
is stopped, said in one line, and ends for its client as its script did
(job.exitBarrierTimeoutSeconds, halved: launch/supervisor.py).

Run: python -m elastic_worker.warm.server SOCKET [MODULE,...] [--teardown=SECONDS]
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import logging
import os
import selectors
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from elastic_worker import bundle, timings, torchcompat
from elastic_worker.warm import child, master, protocol

logger = logging.getLogger("elastic_worker.warm.server")

PR_SET_PDEATHSIG = 1


def _fork_safe() -> str | None:
    """Why forking now would hand the child a state a fresh interpreter would not have."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        return "CUDA was initialised in the warm server (by a preloaded module)"
    return None


@dataclass
class _Child:
    """What the server keeps of a child: its client, its pipe, how its script ended."""

    conn: socket.socket
    report: int  # the read end of the pipe the child writes "PID CODE" to at its script's end
    who: str  # how its line names it: the rank torchrun gave it
    bounded: bool  # a training process: its teardown is bounded
    returned: tuple[int, float] | None = None  # (the script's code, when), once told
    stopped: int | None = None  # the code it ends with, once stopped in its teardown


class WarmServer:
    def __init__(self, path: str, teardown: float | None = None) -> None:
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(path)
        self.listener.listen(64)
        #: Seconds a child may run after its script returned; None: as long as it likes.
        self.teardown = teardown
        self.children: dict[int, _Child] = {}
        self.clients: dict[socket.socket, int] = {}
        self.wakeup_r, self.wakeup_w = os.pipe()
        os.set_blocking(self.wakeup_w, False)
        self.selector = selectors.DefaultSelector()

    def preload(self, modules: Sequence[str]) -> None:
        done = []
        for name in modules:
            try:
                __import__(name)
            except Exception as exc:  # noqa: BLE001 - an import's own error, whatever it is
                # Not fatal: the default lists torch's distributed modules, which an older
                # torch may lack; the training process imports what it needs itself.
                logger.warning(
                    "warm server: cannot import %s (%s): left to the training processes", name, exc
                )
            else:
                done.append(name)
        logger.info("warm server ready: %s imported", ", ".join(done) or "nothing")
        dist: Any = sys.modules.get("torch.distributed")
        available = dist is not None and dist.is_available()
        problem = torchcompat.keep_group_problem(dist) if available else None
        if problem is not None:  # said once here; each child then keeps nothing (child.py)
            logger.warning(
                "warm server: torch %s: %s: a training process's default process group is "
                "freed when its script drops it, not at its exit as under python -u (a DDP "
                "script can hang at its end, until its teardown bound: "
                "docs/notes/2026-11-27-end-of-job.md)",
                torchcompat.torch_version(),
                problem,
            )
        rdzv: Any = sys.modules.get("torch.distributed.rendezvous") if available else None
        problem = torchcompat.env_rendezvous_problem(rdzv) if rdzv is not None else None
        if rdzv is not None and problem is None:  # inherited by every child (master.py)
            torchcompat.wait_before_env_rendezvous(rdzv, master.wait_for_master)
        elif problem is not None:
            logger.warning(
                "warm server: torch %s: %s: a rank that connects to rank 0's store before "
                "it listens waits out torch's backoff (0.3-0.6 s of a re-form: "
                "docs/notes/2026-11-26-warm-starts.md)",
                torchcompat.torch_version(),
                problem,
            )
        # What the server imported lives as long as any child: out of the cycle collector's
        # reach (Python's gc.freeze, made for servers that fork). A child's collections, and
        # the one at its interpreter's exit, no longer walk torch's objects, so a failed
        # process ends, and torchrun re-forms, a second sooner (docs/notes/).
        gc.collect()
        gc.freeze()

    def serve(self) -> None:
        """Until SIGTERM: fork a child per request, report how each ends."""
        signal.set_wakeup_fd(self.wakeup_w)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        signal.signal(signal.SIGTERM, self._stop)
        self.selector.register(self.listener, selectors.EVENT_READ, "accept")
        self.selector.register(self.wakeup_r, selectors.EVENT_READ, "wakeup")
        while True:
            for key, _ in self.selector.select(self._until_next_stop()):
                if key.data == "accept":
                    self._accept()
                elif key.data == "wakeup":
                    os.read(self.wakeup_r, 512)
                    self._reap()
                elif key.data == "client":
                    self._client_event(key.fileobj)  # type: ignore[arg-type]
                else:
                    self._returned(key.data, key.fd)
            self._stop_teardowns()

    def _returned(self, pid: int, fd: int) -> None:
        """The child's pipe is readable: its script's end ("PID CODE"), or EOF (it died)."""
        data = os.read(fd, 64)
        self.selector.unregister(fd)
        os.close(fd)
        forked = self.children.get(pid)
        if forked is None:
            return
        forked.report = -1
        words = data.split()
        # Only the child's own line: a process the script forked returns through here too.
        ours = len(words) == 2 and words[0] == str(pid).encode()
        if ours and forked.bounded and words[1].lstrip(b"-").isdigit():
            forked.returned = (int(words[1]), time.monotonic())

    def _until_next_stop(self) -> float | None:
        """Seconds to the next child's teardown bound (None: no bound to watch)."""
        if self.teardown is None:
            return None
        ends = [c.returned[1] for c in self.children.values() if c.returned and c.stopped is None]
        return max(0.0, min(ends) + self.teardown - time.monotonic()) if ends else None

    def _stop_teardowns(self) -> None:
        """Stop each child still running `teardown` s after its script returned."""
        if self.teardown is None:
            return
        now = time.monotonic()
        for pid, forked in self.children.items():
            if forked.returned is None or forked.stopped is not None:
                continue
            code, at = forked.returned
            if now - at < self.teardown:
                continue
            forked.stopped = code
            logger.warning("%s", teardown_stopped(pid, forked.who, now - at, code))
            self._kill(pid)

    def _stop(self, signum: int, frame: object) -> None:
        for pid in self.children:
            self._kill(pid)
        # Not SystemExit: the signal may come during interpreter teardown (torch's
        # finalizers), and there is nothing of the server's own to flush.
        os._exit(0)

    @staticmethod
    def _kill(pid: int) -> None:
        for kill in (os.killpg, os.kill):
            try:
                kill(pid, signal.SIGKILL)
                return
            except ProcessLookupError:
                continue

    def _accept(self) -> None:
        conn, _ = self.listener.accept()
        try:
            request = protocol.recv_request(conn)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            logger.warning("warm server: bad request: %s", exc)
            conn.close()
            return
        unsafe = _fork_safe()
        if unsafe is not None:
            logger.warning("warm server: not forking: %s", unsafe)
            for fd in request.fds:
                os.close(fd)
            conn.close()  # the client starts cold
            return
        report_r, report_w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(report_r)
            self._become_child(conn, request, report_w)  # never returns
        os.close(report_w)
        for fd in request.fds:
            os.close(fd)
        # Only torchrun's workers (its documented TORCHELASTIC_RUN_ID) are training processes
        # whose teardown is bounded: the lifelines' helper, forked here too, is not.
        bounded = "TORCHELASTIC_RUN_ID" in request.env
        self.children[pid] = _Child(conn, report_r, _who(request.env), bounded)
        self.clients[conn] = pid
        self.selector.register(conn, selectors.EVENT_READ, "client")
        self.selector.register(report_r, selectors.EVENT_READ, pid)
        protocol.send(conn, pid=pid)

    def _client_event(self, conn: socket.socket) -> None:
        """The client sends nothing after its request: readable means it is gone."""
        try:
            if conn.recv(1, socket.MSG_PEEK):
                conn.recv(4096)
                return
        except OSError:
            pass
        pid = self.clients.pop(conn)
        self.selector.unregister(conn)
        self._kill(pid)

    def _reap(self) -> None:
        while self.children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            forked = self.children.pop(pid, None)
            if forked is None:
                continue
            if forked.report >= 0:
                self.selector.unregister(forked.report)
                os.close(forked.report)
            if forked.stopped is not None:  # as its script ended, not by our SIGKILL
                status = (forked.stopped & 0xFF) << 8
            conn = forked.conn
            if self.clients.pop(conn, None) is not None:
                self.selector.unregister(conn)
                protocol.send(conn, status=status)
            conn.close()

    def _become_child(self, conn: socket.socket, request: protocol.Request, report: int) -> None:
        signal.set_wakeup_fd(-1)
        for signum in (signal.SIGCHLD, signal.SIGTERM):
            signal.signal(signum, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        self.selector.close()
        self.listener.close()
        for other in self.clients:
            other.close()
        for forked in self.children.values():
            if forked.report >= 0:
                os.close(forked.report)
        conn.close()
        os.close(self.wakeup_r)
        os.close(self.wakeup_w)
        os.setsid()  # torchrun signals the worker's group; the client forwards to ours
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() == 1:  # the server died between fork and prctl
            os._exit(137)
        for target, fd in enumerate(request.fds):
            os.dup2(fd, target)
            os.close(fd)
        code = child.run_program(request.argv, request.env, request.cwd)
        # The script is done; what follows is the interpreter's teardown.
        with contextlib.suppress(OSError):
            os.write(report, f"{os.getpid()} {code}\n".encode())
        sys.exit(code)


def teardown_stopped(pid: int, who: str, seconds: float, code: int) -> str:
    """The line said when a child is stopped in its teardown (localrun parses it)."""
    return (
        f"training process {pid} ({who}) still running {seconds:.0f} s after its script "
        f"returned {code} (its teardown blocks: a destructor, an atexit handler or a thread "
        f"left running): stopped it; it counts as exited {code} (job.exitBarrierTimeoutSeconds)"
    )


def _who(env: Mapping[str, str]) -> str:
    """A child as its line names it: the rank torchrun gave it."""
    return f"rank {env.get('RANK', '?')}, local rank {env.get('LOCAL_RANK', '?')}"


@dataclass
class Handle:
    """The running server, as the entrypoint holds it."""

    proc: subprocess.Popen[bytes]
    socket_path: str
    directory: Path

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        for entry in self.directory.iterdir():
            entry.unlink()
        self.directory.rmdir()


def start(
    python: str, preload: Sequence[str], env: Mapping[str, str], teardown: float | None = None
) -> Handle:
    """Start the server (it listens before it imports, so an early client only waits);
    `teardown`: seconds a training process may run after its script returned (None: no
    bound)."""
    directory = Path(tempfile.mkdtemp(prefix="elastic-warm-"))  # 0700: ours alone
    path = str(directory / "socket")
    bound = [] if teardown is None else [f"--teardown={teardown:g}"]
    proc = subprocess.Popen(
        [
            *bundle.module_argv(python, protocol.SERVER_MODULE, bundle.WARM),
            path,
            ",".join(preload),
            *bound,
        ],
        env=dict(env),
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )
    # It binds within a few tens of ms (before it imports): wait for that, so that no
    # client finds the path missing and starts cold.
    deadline = time.monotonic() + timings.WARM_BIND_WAIT
    while not os.path.exists(path) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    return Handle(proc, path, directory)


def main(argv: Sequence[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    teardown = None
    if args and args[-1].startswith("--teardown="):
        teardown = float(args.pop()[len("--teardown=") :])
    if not 1 <= len(args) <= 2:
        sys.exit(
            "usage: python -m elastic_worker.warm.server SOCKET [MODULE,...] [--teardown=SECONDS]"
        )
    # "elastic-worker:" as the entrypoint's own lines: the local run shows them.
    logging.basicConfig(level=logging.INFO, format="elastic-worker: %(message)s")
    parent = os.getppid()
    # Go with the entrypoint, however it ends; its children (the clients) go with torchrun.
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != parent:
        sys.exit(0)
    server = WarmServer(args[0], teardown)
    modules = [m for m in (args[1] if len(args) > 1 else "").split(",") if m]
    server.preload(modules)
    server.serve()


if __name__ == "__main__":
    main()
