"""A training image the project did not build, as this machine stands in for it: a venv of
its own (tests/e2e/user_image/requirements.txt: its own torch, numpy and a urllib3 other
than the worker's), with none of the project's packages. The local run maps an image name
to it (`elastic-local run --image NAME=VENV`).

Made once per requirements under the user's cache (~40 s and 1.4 GB the first time), so a
fresh clone in CI reuses the one an earlier run made on the same machine."""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
from pathlib import Path

import usercache

ROOT = Path(__file__).resolve().parents[1]
REQUIREMENTS = ROOT / "tests" / "e2e" / "user_image" / "requirements.txt"
#: The image reference the values name; `--image` maps it to the venv.
IMAGE = "registry.example.com/team/trainer"
#: The urllib3 the image pins (and the worker's bundle does not).
URLLIB3 = next(
    line.split("==")[1].strip()
    for line in REQUIREMENTS.read_text().splitlines()
    if line.startswith("urllib3==")
)


def venv() -> Path:
    """The image's venv, made when missing (one maker at a time; the others wait); the
    venvs of other requirements pruned (tests/usercache.py)."""
    key = hashlib.sha256(REQUIREMENTS.read_bytes() + sys.version.encode()).hexdigest()[:12]
    return usercache.entry("user-images", f"trainer-{key}", _make, moved=_relocate)


def _make(work: Path) -> None:
    # The system's python3, as an image has its own: not the project's venv.
    base = shutil.which("python3", path="/usr/local/bin:/usr/bin:/bin") or sys.executable
    subprocess.run([base, "-m", "venv", str(work)], check=True)
    subprocess.run(
        [str(work / "bin" / "pip"), "install", "--quiet", "--disable-pip-version-check",
         "-r", str(REQUIREMENTS)],
        check=True,
    )  # fmt: skip


def _relocate(old: Path, new: Path) -> None:
    """The venv's own files that name its directory (pyvenv.cfg, bin/ scripts) name the new
    one: a venv is made in place, not moved."""
    for path in [new / "pyvenv.cfg", *(new / "bin").iterdir()]:
        if path.is_symlink() or not path.is_file():
            continue
        data = path.read_bytes()
        if str(old).encode() in data:
            path.write_bytes(data.replace(str(old).encode(), str(new).encode()))


if __name__ == "__main__":
    print(venv())
