"""A warm server's child becoming the user's program, as `python -u PROGRAM` would run it:
its argv, environment and working directory installed, the import-time state a fresh
interpreter would read from that environment redone, the server's own modules and
logging dropped (_forget_the_server), the script run as `__main__`, and
its end reported as the interpreter would (exit code, traceback, signal). The end is
`python -u`'s too: what the script leaves (its globals, its default process group) is
freed at the interpreter's exit, not before (_keep_for_exit says why)."""

from __future__ import annotations

import atexit
import logging
import os
import runpy
import signal
import sys
import traceback
from collections.abc import Mapping, Sequence
from types import TracebackType
from typing import Any

from elastic_worker import bundle, rankprobe, torchcompat


def run_program(argv: Sequence[str], env: Mapping[str, str], cwd: str) -> int:
    """`python ARGV` in this process, from its environment on: returns the exit code
    (None and SystemExit handled as the interpreter does)."""
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    _after_fork(env)
    sys.orig_argv = [sys.executable, *argv]
    args = list(argv)
    if args and args[0] == "-u":
        args = args[1:]
        _unbuffered()
    try:
        return _run(args, cwd)
    finally:
        rankprobe.ended()  # the script is over: its teardown is not a hang


def _run(args: list[str], cwd: str) -> int:
    try:
        if args[0] == "-m":
            sys.argv = [args[1], *args[2:]]
            sys.path[0] = cwd
            _libraries(args)
            _LEFT_FOR_EXIT.append(runpy.run_module(args[1], run_name="__main__", alter_sys=True))
        else:
            sys.argv = list(args)
            sys.path[0] = os.path.dirname(os.path.abspath(args[0]))
            _libraries(args)
            _LEFT_FOR_EXIT.append(runpy.run_path(args[0], run_name="__main__"))
    except SystemExit as exc:
        _keep_globals(exc.__traceback__)
        return _exit_code(exc.code)
    except KeyboardInterrupt:
        traceback.print_exc()
        sys.stderr.flush()
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
        return 130
    except BaseException as exc:  # noqa: BLE001 - reported as the interpreter would
        trimmed = _user_frames(exc.__traceback__)
        _keep_globals(trimmed)
        sys.excepthook(type(exc), exc.with_traceback(trimmed), trimmed)
        return 1
    return 0


#: The script's globals, kept for the interpreter's exit: under `python -u` the `__main__`
#: module lives until the interpreter finalizes, where runpy's copy of it would be freed
#: at the next garbage collection. The list (and _KEPT_GROUP) go when the interpreter
#: clears this module.
_LEFT_FOR_EXIT: list[object] = []
#: The default process group _keep_for_exit keeps (python -u's defaults hold only one),
#: until _release_kept_group.
_KEPT_GROUP: list[object] = []


def _keep_globals(tb: TracebackType | None) -> None:
    """The globals of the script's top frame in `tb` (it ended by an exception), kept."""
    frames = _user_frames(tb)
    if frames is not None:
        _LEFT_FOR_EXIT.append(frames.tb_frame.f_globals)


def _keep_for_exit() -> None:
    """Keep the first default process group the script destroys until the interpreter
    finalizes, as a fresh interpreter does, so that it is freed there and not when the
    script's last reference to it goes.

    Under `python -u`, torch.distributed.nn.functional is first imported by DDP's
    constructor (through torch.distributed._shard), after init_process_group, and its
    functions' default `group=group.WORLD` holds the default group until the interpreter
    finalizes: it is freed through its Python object, whose holder releases the GIL
    while ~ProcessGroupGloo joins the group's worker threads. The server imports that
    module before any group exists (torch.distributed.checkpoint and .fsdp, preloaded by
    default, import it), so in a child the last owner was DDP's Reducer, a pybind11 object
    freed with the GIL held: ~ProcessGroupGloo then ran when the script's main() returned
    and waited forever for a worker thread that was waiting for the GIL, to free the
    last tensor of a collective it had just finished (pytorch/pytorch#56297; gdb stacks in
    docs/notes/2026-11-27-end-of-job.md). What it relies on of torch is torchcompat.py's
    (keep_destroyed_group); a torch without it keeps nothing here (the server said so).

    The kept group is released by an exit handler registered before the script's (so it
    runs after theirs), not left to finalization: once the interpreter finalizes, a gloo
    thread that takes the GIL to free a collective's tensor is ended by pthread_exit,
    which unwinds through a noexcept destructor: std::terminate, exit -6 ("terminate
    called without an active exception", once in a CI run)."""
    dist: Any = sys.modules.get("torch.distributed")  # imported by the server, or not at all
    if dist is None or not dist.is_available() or torchcompat.keep_group_problem(dist):
        return
    torchcompat.keep_destroyed_group(dist, _KEPT_GROUP)
    atexit.register(_release_kept_group)


def _release_kept_group() -> None:
    """Drop the kept group while other threads may still take the GIL: through its Python
    object, whose holder releases the GIL while ~ProcessGroupGloo joins its threads."""
    _KEPT_GROUP.clear()


def _libraries(args: Sequence[str]) -> None:
    """An injected worker's libraries (bundle.py): a module of ours (the lifelines' helper)
    gets them ahead of the image's; the user's program gets the image's path alone, as
    `python -u` would have it (the server itself runs with the bundle's lib/), the hang
    watch's probe (rankprobe.py: nothing the script can see but a hook and a signal
    handler), and none of the server's own state (_forget_the_server)."""
    if bundle.our_module(args) is not None:
        bundle.enter(bundle.WORKER)
    else:
        sys.path[1:] = bundle.user_path(sys.path[1:])
        rankprobe.install(os.environ)  # the hang watch's steps and stacks (recovery/hangs.py)
        _forget_the_server()


def _forget_the_server() -> None:
    """Leave the program nothing of the server's own that `python -u` would not have: its
    modules (elastic_worker's: `import elastic_worker` then finds what a fresh interpreter
    finds, a module of the user's or nothing) and its logging (the root logger's handler
    and level, its loggers), so that the script's logging.basicConfig takes effect.
    What the server installed into torch (torchcompat's wrappers, master.wait_for_master)
    and this module's exit handler keep their code alive through their globals; none of
    them imports a module of ours again."""
    for name in [n for n in sys.modules if n.split(".")[0] == bundle.PACKAGE]:
        del sys.modules[name]
    root = logging.getLogger()
    for handler in root.handlers[:]:
        root.removeHandler(handler)
    root.setLevel(logging.WARNING)
    loggers = logging.Logger.manager.loggerDict
    for name in [n for n in loggers if n.split(".")[0] == bundle.PACKAGE]:
        del loggers[name]


def _exit_code(code: object) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


def _user_frames(tb: TracebackType | None) -> TracebackType | None:
    """Drop this module's and runpy's frames, as `python script.py` shows none of them."""
    skip = {__file__, runpy.__file__, "<frozen runpy>"}
    while tb is not None and tb.tb_frame.f_code.co_filename in skip:
        tb = tb.tb_next
    return tb


def _unbuffered() -> None:
    """What `-u` does at startup: stdout and stderr written through, unbuffered."""
    import io  # noqa: PLC0415

    for name, fd in (("stdout", 1), ("stderr", 2)):
        old = getattr(sys, name)
        stream = io.TextIOWrapper(
            io.FileIO(fd, "w", closefd=False),
            encoding=old.encoding,
            errors=old.errors,
            write_through=True,
        )
        setattr(sys, name, stream)
        setattr(sys, f"__{name}__", stream)


def _after_fork(env: Mapping[str, str]) -> None:
    """Redo what a fresh interpreter would have read from this environment at import."""
    torch = sys.modules.get("torch")
    threads = env.get("OMP_NUM_THREADS", "")
    if torch is not None and threads.isdigit() and int(threads) > 0:
        torch.set_num_threads(int(threads))
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        numpy.random.seed()
    _keep_for_exit()
