"""The worker injected into a user's own training image (the chart's
`worker.entrypoint: injected`): a self-contained bundle that an init container copies into
the pod (an emptyDir at /opt/elastic-worker) and that the image's own python and torch run.
It is built by images/worker/bundle/build.py:

    bin/elastic-worker   the container's command (POSIX sh): the image's python, its version
    bin/boot.py          runs one module of ours with the libraries of its role (boot())
    lib/                 elastic_worker alone
    deps/                torch_etcd_v3 (the etcd-v3 backend, with the dist-info that holds its
                         `torchrun.handlers` entry point), python-etcd, urllib3, dnspython and
                         prometheus-client at the worker's pins (images/worker/pyproject.toml)
    examples/            the reference train.py, at the worker image's path
    bundle.json          what it holds and what it needs (Python, torch)

Who sees what. The user's packages (their urllib3, say) must stay theirs in their training
processes, and ours must be ours where we need them; so nothing is passed through
PYTHONPATH, which every child would inherit: each of our processes is started through
boot.py, which sets its own sys.path by role.

    WORKER   lib/ and deps/ ahead of the image's path: elastic-worker itself, torchrun (torch's
             etcd-v2 handler imports python-etcd; the etcd-v3 handler is found through
             torch_etcd_v3's entry point), the lifelines' helper (a warm child, enter())
    WARM     lib/ ahead of the image's path: the warm server and its client, standard library
             and elastic_worker only. Not deps/: the server's preloads import torch's
             rendezvous registry, which imports every `torchrun.handlers` entry point it can
             see, and its children become the user's program, which must find none of ours.
             Those children get the image's path alone (user_path()), as `python -u` would.
    (none)   the training processes torchrun starts, cold: the attempt shim (sh) execs the
             image's python with the environment torchrun has, which holds nothing of ours.

In the worker image there is no bundle (the packages are installed): `python -m MODULE`.
The warm client imports this at every attempt (through warm/protocol.py): the standard
library's lightest modules only.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass

#: The roles (the module docstring says what each sees).
WORKER = "worker"
WARM = "warm"
ROLES = (WORKER, WARM)

#: Where the chart mounts the bundle in the worker container, and the file that marks one.
MOUNT_PATH = "/opt/elastic-worker"
MANIFEST = "bundle.json"
#: Our package, whose modules run with the WORKER role wherever they are started.
PACKAGE = "elastic_worker"
#: What runs torch's torchrun: our wrapper of it (launch/torchrun.py).
TORCHRUN = "elastic_worker.launch.torchrun"


@dataclass(frozen=True)
class Bundle:
    root: str

    @property
    def lib(self) -> str:
        return os.path.join(self.root, "lib")

    @property
    def deps(self) -> str:
        return os.path.join(self.root, "deps")

    @property
    def boot(self) -> str:
        return os.path.join(self.root, "bin", "boot.py")

    def paths(self, role: str) -> list[str]:
        """What a process of `role` sees ahead of the image's own path."""
        if role not in ROLES:
            raise ValueError(f"unknown role {role!r} (one of {', '.join(ROLES)})")
        return [self.lib, self.deps] if role == WORKER else [self.lib]

    def owns(self, entry: str) -> bool:
        return entry in (self.lib, self.deps)


def find(module_file: str = __file__) -> Bundle | None:
    """The bundle this module was loaded from (lib/elastic_worker/bundle.py under a root
    holding bundle.json), or None when elastic_worker is installed (the worker image, a venv)."""
    lib = os.path.dirname(os.path.dirname(os.path.realpath(module_file)))
    root = os.path.dirname(lib)
    if os.path.basename(lib) != "lib" or not os.path.isfile(os.path.join(root, MANIFEST)):
        return None
    return Bundle(root)


BUNDLE = find()


def module_argv(python: str, module: str, role: str = WORKER) -> list[str]:
    """The argv that runs `python -m module` as a process of `role`."""
    if BUNDLE is None:
        return [python, "-m", module]
    return [python, BUNDLE.boot, role, module]


def our_module(args: Sequence[str]) -> str | None:
    """The module of ours that `python ARGS` runs (`[-u] -m elastic_worker...`), else None."""
    rest = list(args[1:] if args[:1] == ["-u"] else args)
    if len(rest) >= 2 and rest[0] == "-m" and rest[1].split(".")[0] == PACKAGE:
        return rest[1]
    return None


def python_argv(python: str, args: Sequence[str]) -> list[str]:
    """`python ARGS` as a fresh interpreter runs it: a module of ours through boot.py (it
    needs lib/ and deps/), anything else as it is (the user's program: nothing of ours)."""
    module = our_module(args)
    if BUNDLE is None or module is None:
        return [python, *args]
    rest = list(args[1:] if args[:1] == ["-u"] else args)
    return [*module_argv(python, module, WORKER), *rest[2:]]


def enter(role: str, path: list[str] | None = None) -> None:
    """Put `role`'s libraries ahead on `path` (sys.path), once each; nothing without a bundle."""
    if BUNDLE is None:
        return
    target = sys.path if path is None else path
    wanted = BUNDLE.paths(role)
    target[:] = wanted + [p for p in target if p not in wanted]


def user_path(path: Sequence[str]) -> list[str]:
    """`path` without the bundle's lib/ and deps/: what the image's own python has."""
    if BUNDLE is None:
        return list(path)
    return [p for p in path if not BUNDLE.owns(p)]


def boot(argv: Sequence[str]) -> None:
    """bin/boot.py: `ROLE MODULE ARGS...` run as `python -m MODULE ARGS...` would, with the
    role's libraries on sys.path (sys.path[0] is the bundle's lib/ when this is called)."""
    if len(argv) < 2 or argv[0] not in ROLES:
        sys.exit(f"usage: boot.py {{{','.join(ROLES)}}} MODULE [ARGS...] (got {list(argv)})")
    role, module, *args = argv
    lib = sys.path.pop(0)
    enter(role)
    if lib not in sys.path:  # no manifest (a broken copy): run from lib/ all the same
        sys.path.insert(0, lib)
    if module == TORCHRUN:
        _torch_distributed_or_exit()
    sys.argv = [module, *args]
    import runpy  # noqa: PLC0415 - only boot.py runs modules

    runpy.run_module(module, run_name="__main__", alter_sys=True)


def _torch_distributed_or_exit() -> None:
    """torchrun imports torch.distributed anyway: a build without it (USE_DISTRIBUTED=0) is
    said here in one line, before torch's own traceback would."""
    from elastic_worker import exits, image  # noqa: PLC0415

    problem = image.distributed_problem()
    if problem is not None:
        sys.stderr.write(f"elastic-worker: {problem}\n")
        sys.stderr.flush()
        os._exit(exits.IMAGE)
