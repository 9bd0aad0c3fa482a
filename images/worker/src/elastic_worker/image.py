"""What the worker needs of the image it runs in, checked at the pod's start, each lack said
in one line (exit exits.IMAGE): Python >= MIN_PYTHON (bin/elastic-worker checks it before
any of this runs, for an injected worker), torch >= MIN_TORCH, and a torch built with
torch.distributed (checked where torchrun imports it anyway: bundle.boot).

MIN_TORCH is the oldest torch the worker was read against (torchcompat.READ_FROM); the
version is read without importing torch (1-2 s of CPU), from its metadata or, for a torch
installed without any (some source builds), from torch/version.py.
"""

from __future__ import annotations

import importlib.util
import re
import sys
from importlib import metadata
from pathlib import Path

from elastic_worker import torchcompat

MIN_PYTHON = (3, 10)
MIN_TORCH = tuple(int(x) for x in torchcompat.READ_FROM[0].split(".")[:2])

_VERSION = re.compile(r"(\d+)\.(\d+)")
_VERSION_PY = re.compile(r"""^__version__\s*=\s*['"]([^'"]+)['"]""", re.MULTILINE)


def torch_dir() -> Path | None:
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def torch_version(root: Path) -> str | None:
    """The installed torch's version string (`2.9.0a0+145a3a7.nv25.10` in NGC images)."""
    try:
        return metadata.version("torch")
    except metadata.PackageNotFoundError:
        pass
    try:
        found = _VERSION_PY.search((root / "version.py").read_text())
    except OSError:
        return None
    return found.group(1) if found else None


def _floor(version: tuple[int, ...]) -> str:
    return ".".join(str(x) for x in version)


def problem() -> str | None:
    """One line naming what this image lacks to run the worker, or None."""
    if sys.version_info[:2] < MIN_PYTHON:
        return (
            f"{sys.executable} is Python {sys.version.split()[0]}: the worker needs Python >= "
            f"{_floor(MIN_PYTHON)}"
        )
    root = torch_dir()
    if root is None:
        return (
            f"torch is not installed for {sys.executable}: use an image with torch >= "
            f"{_floor(MIN_TORCH)} (a PyTorch image), or install it"
        )
    version = torch_version(root)
    found = _VERSION.match(version or "")
    if found is None:
        return (
            f"cannot tell the version of torch at {root}: the worker needs torch >= "
            f"{_floor(MIN_TORCH)}"
        )
    if (int(found.group(1)), int(found.group(2))) < MIN_TORCH:
        return (
            f"torch {version} at {root} is too old: the worker needs torch >= "
            f"{_floor(MIN_TORCH)} (torchrun's elastic rendezvous as the worker drives it)"
        )
    if not (root / "distributed" / "run.py").is_file():
        return f"torch {version} at {root} has no torch.distributed.run (torchrun)"
    return None


def distributed_problem() -> str | None:
    """One line when this torch was built without torch.distributed (imports torch)."""
    import torch.distributed  # noqa: PLC0415 - where torchrun imports it anyway

    if torch.distributed.is_available():
        return None
    import torch  # noqa: PLC0415

    return (
        f"torch {torch.__version__} at {Path(torch.__file__).parent} was built without "
        "torch.distributed (USE_DISTRIBUTED=0): the worker needs a build with it"
    )
