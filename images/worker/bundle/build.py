"""Build the injected worker's bundle (elastic_worker/bundle.py describes it) into DEST:

    python images/worker/bundle/build.py DEST          # from the repository root, any cwd

elastic_worker and the packages of packages/ it depends on are built from this checkout into
lib/, its other dependencies at the pins of images/worker/pyproject.toml into deps/ (pip
--target, --no-deps: the pins are the whole set, all pure Python), bin/ and the examples
are copied, bundle.json records the versions and what the bundle needs. No bytecode: the
image's own python (whatever its version) writes it at the first import, which the chart
lets it do (the files are group-writable, the pod's fsGroup owns the volume).

The init-topology image's build runs this (its Dockerfile); localrun and the tests run it
through `cached()`, keyed by the inputs' content. pip and setuptools come from the
interpreter that runs it (`--no-build-isolation`: python-etcd is an sdist).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import tomllib

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
WORKER = ROOT / "images" / "worker"
PACKAGES = ROOT / "packages"
EXAMPLES = WORKER / "examples"

#: The import packages lib/ may hold: ours, named so that no user's package is shadowed.
_NAME = re.compile(r"[-_.]+")


def _norm(name: str) -> str:
    return _NAME.sub("-", name).lower()


def _project(path: Path) -> dict[str, object]:
    data: dict[str, object] = tomllib.loads((path / "pyproject.toml").read_text())["project"]
    return data


def local_packages() -> dict[str, Path]:
    """Distribution name -> source directory of the packages this checkout builds."""
    found = {_norm(str(_project(WORKER)["name"])): WORKER}
    for pyproject in sorted(PACKAGES.glob("*/pyproject.toml")):
        found[_norm(str(_project(pyproject.parent)["name"]))] = pyproject.parent
    return found


def split_requirements() -> tuple[list[Path], list[str]]:
    """(sources built into lib/: the worker and the local packages it pins; the pins of the
    others, for deps/)."""
    local = local_packages()
    sources, pins = [WORKER], []
    dependencies = _project(WORKER).get("dependencies", [])
    assert isinstance(dependencies, list), "pyproject.toml: [project] dependencies is a list"
    for req in dependencies:
        name = _norm(re.split(r"[<>=!~;\[ ]", str(req), maxsplit=1)[0])
        if name in local:
            sources.append(local[name])
        else:
            pins.append(str(req))
    # torch-etcd-v3 is the etcd-v3 backend torchrun loads by entry point, whether or not the
    # worker's pyproject names it (the worker image installs it beside the worker).
    v3 = local.get("torch-etcd-v3")
    if v3 is not None and v3 not in sources:
        sources.append(v3)
    return sources, pins


def inputs_digest() -> str:
    """A digest of everything the bundle is made from (for `cached()`)."""
    h = hashlib.sha256()
    sources, pins = split_requirements()
    files = [HERE / "build.py", *sorted((HERE / "bin").iterdir())]
    for src in sources:
        files += sorted(p for p in src.rglob("*") if p.is_file() and _kept(p))
    files += sorted(p for p in EXAMPLES.rglob("*") if p.is_file() and _kept(p))
    for path in files:
        h.update(str(path.relative_to(ROOT)).encode() + b"\0" + path.read_bytes() + b"\0")
    h.update("\n".join(pins).encode())
    return h.hexdigest()[:16]


def _kept(path: Path) -> bool:
    return not any(
        part in ("__pycache__", "build") or part.endswith(".egg-info") for part in path.parts
    )


def _pip(python: str, *args: str) -> None:
    argv = [python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
            "--no-deps", "--no-compile", "--no-build-isolation", *args]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        sys.exit(f"build-bundle: {' '.join(argv)} failed:\n{done.stdout}{done.stderr}")


def _copy_source(src: Path, into: Path) -> Path:
    """A copy of a package's source without build leftovers (pip builds in the tree)."""
    dest = into / src.name
    shutil.copytree(
        src, dest, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info", "build", "*.pyc")
    )
    return dest


def _versions(site: Path) -> dict[str, str]:
    out = {}
    for info in sorted(site.glob("*.dist-info")):
        meta = (info / "METADATA").read_text(errors="replace")
        fields = dict(line.split(": ", 1) for line in meta.splitlines()[:10] if ": " in line)
        out[fields.get("Name", info.name)] = fields.get("Version", "")
    return out


def _requires_python(sources: list[Path]) -> str:
    floors = {str(_project(s).get("requires-python", "")) for s in sources} - {""}
    return " ".join(sorted(floors))


def build(dest: Path, python: str = sys.executable) -> Path:
    """The bundle, made in a temporary directory beside `dest` and renamed into place."""
    sources, pins = split_requirements()
    dest = dest.resolve()
    dest.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{dest.name}-", dir=dest.parent))
    try:
        out = work / "bundle"
        copies = work / "src"
        copies.mkdir()
        built = [str(_copy_source(s, copies)) for s in sources]
        _pip(python, "--target", str(out / "lib"), built[0])
        _pip(python, "--target", str(out / "deps"), *built[1:], *pins)
        for site in ("lib", "deps"):
            shutil.rmtree(out / site / "bin", ignore_errors=True)  # console scripts of `python`
        shutil.copytree(HERE / "bin", out / "bin")
        shutil.copytree(EXAMPLES, out / "examples", ignore=shutil.ignore_patterns("__pycache__"))
        manifest = {
            "requires": {
                **_needs(python, out / "lib"),
                "python_requires": _requires_python(sources),
            },
            "lib": _versions(out / "lib"),
            "deps": _versions(out / "deps"),
        }
        (out / "bundle.json").write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
        _group_writable(out)
        if dest.exists():
            shutil.rmtree(dest)
        out.rename(dest)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return dest


def _needs(python: str, lib: Path) -> dict[str, object]:
    """What the bundle's own elastic_worker says it needs of an image (elastic_worker.image),
    read in a separate interpreter: this one may have imported the checkout's."""
    code = (
        "import json, sys; sys.path.insert(0, sys.argv[1]); "
        "from elastic_worker import exits, image; "
        "print(json.dumps({'python': '>=%d.%d' % image.MIN_PYTHON, "
        "'torch': '>=%d.%d' % image.MIN_TORCH, 'exit_code': exits.IMAGE}))"
    )
    done = subprocess.run(
        [python, "-I", "-c", code, str(lib)], capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        sys.exit(f"build-bundle: the bundle's elastic_worker does not import:\n{done.stderr}")
    needs: dict[str, object] = json.loads(done.stdout)
    return needs


def _group_writable(root: Path) -> None:
    """Directories 0775, files 0664 (bin/elastic-worker 0775): the worker's user, a member
    of the pod's fsGroup, writes the bytecode beside the sources. No bytecode is kept."""
    for cache in list(root.rglob("__pycache__")):
        shutil.rmtree(cache)
    for dirpath, _dirnames, filenames in os.walk(root):
        os.chmod(dirpath, 0o775)
        for name in filenames:
            path = os.path.join(dirpath, name)
            os.chmod(path, 0o775 if os.access(path, os.X_OK) else 0o664)


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "elastic-job" / "worker-bundle"


def cached(python: str = sys.executable) -> Path:
    """The bundle of this checkout, built once per content (under the user's cache)."""
    dest = cache_dir() / inputs_digest()
    if not (dest / "bundle.json").is_file():
        build(dest, python)
    return dest


def size(root: Path) -> tuple[int, int]:
    """(files, bytes) of a bundle: what the init container copies."""
    files = [p for p in root.rglob("*") if p.is_file()]
    return len(files), sum(p.stat().st_size for p in files)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="build.py", description=__doc__.split("\n\n")[0])
    p.add_argument("dest", type=Path, help="the bundle's directory (replaced)")
    args = p.parse_args(argv)
    out = build(args.dest)
    files, nbytes = size(out)
    print(f"build-bundle: {out}: {files} files, {nbytes / 1e6:.1f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
