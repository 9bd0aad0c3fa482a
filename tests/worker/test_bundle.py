"""The injected worker (elastic_worker/bundle.py, images/worker/bundle/): the bundle as the
init-topology image's build makes it, run by another Python environment than the project's
(a venv of the system's python3 with a urllib3 of its own and no package of ours), as the
chart's `worker.entrypoint: injected` runs it: who sees which libraries, and the one line
an image that cannot run it gets."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import tomllib
from elastic_worker import bundle, exits, image, torchcompat
from elastic_worker.warm import child
from testlib import ROOT

BUILDER = ROOT / "images" / "worker" / "bundle" / "build.py"
SYSTEM_PATH = "/usr/local/bin:/usr/bin:/bin"
#: The image's own urllib3 (a stand-in package): the worker's bundle pins another.
USER_URLLIB3 = "1.26.0+image"


def _builder():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("bundle_build", BUILDER)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def built() -> Path:
    path: Path = _builder().cached(sys.executable)
    return path


@pytest.fixture(scope="module")
def image_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An image's Python: the system's python3 in a venv of its own, with its own urllib3
    (a package of that name and version) and none of the project's packages."""
    venv = tmp_path_factory.mktemp("image") / "venv"
    base = shutil.which("python3", path=SYSTEM_PATH)
    assert base is not None
    subprocess.run([base, "-m", "venv", "--without-pip", str(venv)], check=True)
    (site,) = venv.glob("lib/python3*/site-packages")
    (site / "urllib3").mkdir()
    (site / "urllib3" / "__init__.py").write_text(f"__version__ = {USER_URLLIB3!r}\n")
    return venv


@pytest.fixture()
def pod(built: Path, tmp_path: Path) -> Path:
    """The pod's copy, as the inject-worker init container makes it (bin/inject)."""
    dest = tmp_path / "opt-elastic-worker"
    dest.mkdir()
    dest.chmod(0o777)  # as the kubelet makes an emptyDir
    done = subprocess.run(
        ["sh", str(built / "bin" / "inject"), str(dest)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert re.fullmatch(
        r"inject-worker: elastic-worker copied into \S+ \(\d+ files, \d+ KiB\)\n", done.stdout
    )
    return dest


PROBE = """
import importlib.util, json, os, sys
from importlib import metadata
import urllib3
print(json.dumps({
    "urllib3": urllib3.__version__,
    "etcd": importlib.util.find_spec("etcd") is not None,
    "torch_etcd_v3": importlib.util.find_spec("torch_etcd_v3") is not None,
    "handlers": sorted(e.name for e in metadata.entry_points(group="torchrun.handlers")),
    "bundle_on_path": [p for p in sys.path if "opt-elastic-worker" in p],
    "elastic_worker": [sorted(m for m in sys.modules if m.split(".")[0] == "elastic_worker"),
                       importlib.util.find_spec("elastic_worker") is not None],
    "PYTHONPATH": os.environ.get("PYTHONPATH"),
}))
"""


def _run(argv: list[str], venv: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        argv,
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": f"{venv}/bin:{SYSTEM_PATH}", "HOME": "/tmp", **env},
    )


def _seen(done: subprocess.CompletedProcess[str]) -> dict[str, object]:
    assert done.returncode == 0, done.stderr
    seen: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return seen


# -- what the bundle holds ---------------------------------------------------------------


def test_the_bundle_holds_the_worker_and_its_pins_and_no_bytecode(built: Path) -> None:
    manifest = json.loads((built / "bundle.json").read_text())
    worker = tomllib.loads((ROOT / "images/worker/pyproject.toml").read_text())["project"]
    pins = dict(re.split(r"==", d) for d in worker["dependencies"])
    held = {**manifest["lib"], **manifest["deps"]}
    for name, version in pins.items():
        key = next(k for k in held if k.replace("_", "-").lower() == name)
        assert held[key] == version, (name, held)
    assert sorted(p.name for p in (built / "lib").iterdir()) == [
        "elastic_worker",
        f"elastic_worker-{manifest['lib']['elastic-worker']}.dist-info",
    ]
    entry_points = next((built / "deps").glob("torch_etcd_v3-*.dist-info")) / "entry_points.txt"
    assert "[torchrun.handlers]" in entry_points.read_text()
    assert not list(built.rglob("__pycache__")) and not list(built.rglob("*.pyc"))
    assert (built / "examples" / "train.py").is_file()
    # What it needs, as elastic_worker says it: the sh entrypoint's numbers are the same.
    floor = {
        k: ">=" + ".".join(map(str, v))
        for k, v in (("py", image.MIN_PYTHON), ("torch", image.MIN_TORCH))
    }
    assert manifest["requires"]["python"] == floor["py"]
    assert manifest["requires"]["torch"] == floor["torch"]
    assert tuple(int(x) for x in torchcompat.READ_FROM[0].split(".")[:2]) == image.MIN_TORCH
    assert manifest["requires"]["python_requires"] == floor["py"]
    sh = (built / "bin" / "elastic-worker").read_text()
    assert f"MIN_PYTHON={'.'.join(map(str, image.MIN_PYTHON))}\n" in sh
    assert f"IMAGE_EXIT={exits.IMAGE}\n" in sh


def test_the_copy_is_group_writable_so_the_images_python_writes_its_bytecode(pod: Path) -> None:
    for path in [pod, *pod.rglob("*")]:
        assert path.stat().st_mode & 0o020, path


# -- who sees what -----------------------------------------------------------------------


def test_the_workers_own_processes_see_the_bundles_libraries_ahead_of_the_images(
    pod: Path, image_venv: Path, tmp_path: Path
) -> None:
    """torchrun and elastic-worker (role worker): python-etcd, the bundle's urllib3 (not the
    image's) and the etcd-v3 handler's entry point."""
    (tmp_path / "probe.py").write_text(PROBE)
    seen = _seen(
        _run(
            ["python3", str(pod / "bin/boot.py"), "worker", "probe"],
            image_venv,
            PYTHONPATH=str(tmp_path),
        )
    )
    manifest = json.loads((pod / "bundle.json").read_text())
    assert seen["urllib3"] == manifest["deps"]["urllib3"] != USER_URLLIB3
    assert seen["etcd"] is True and seen["torch_etcd_v3"] is True
    assert seen["handlers"] == ["etcd-lease", "etcd-v3"]


def test_the_warm_server_sees_none_of_the_bundles_libraries(
    pod: Path, image_venv: Path, tmp_path: Path
) -> None:
    """Role warm: elastic_worker alone; its preloads would import any `torchrun.handlers`
    entry point in reach (torch's registry does), and its children are the user's."""
    (tmp_path / "probe.py").write_text(PROBE)
    seen = _seen(
        _run(
            ["python3", str(pod / "bin/boot.py"), "warm", "probe"],
            image_venv,
            PYTHONPATH=str(tmp_path),
        )
    )
    assert seen["urllib3"] == USER_URLLIB3
    assert (seen["etcd"], seen["torch_etcd_v3"], seen["handlers"]) == (False, False, [])


@pytest.fixture()
def warm_server(pod: Path, image_venv: Path, tmp_path: Path) -> Iterator[str]:
    socket_path = str(tmp_path / "socket")
    server = subprocess.Popen(
        [
            "python3",
            str(pod / "bin/boot.py"),
            "warm",
            "elastic_worker.warm.server",
            socket_path,
            "",
        ],
        env={"PATH": f"{image_venv}/bin:{SYSTEM_PATH}"},
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        for _ in range(500):
            if os.path.exists(socket_path) or server.poll() is not None:
                break
            subprocess.run(["sleep", "0.02"], check=True)
        assert os.path.exists(socket_path), server.stderr.read() if server.stderr else ""
        yield socket_path
    finally:
        server.terminate()
        server.wait(10)


@pytest.mark.parametrize("start", ["warm", "cold"])
def test_the_users_script_sees_the_images_libraries_only(
    start: str, pod: Path, image_venv: Path, tmp_path: Path, warm_server: str
) -> None:
    """The training process as torchrun starts it through the attempt shim: forked from the
    warm server, or cold (no server: the client execs the image's python), it imports the
    image's urllib3 and finds nothing of the worker's (not even the warm server's own
    elastic_worker, loaded in the process it was forked from), nor PYTHONPATH set."""
    script = tmp_path / "train.py"
    script.write_text(PROBE)
    socket_path = warm_server if start == "warm" else str(tmp_path / "no-server")
    done = _run(
        [
            "python3",
            str(pod / "bin/boot.py"),
            "warm",
            "elastic_worker.warm.client",
            socket_path,
            "-u",
            str(script),
        ],
        image_venv,
    )
    seen = _seen(done)
    assert ("starting cold" in done.stderr) is (start == "cold"), done.stderr
    assert seen == {
        "urllib3": USER_URLLIB3,
        "etcd": False,
        "torch_etcd_v3": False,
        "handlers": [],
        "bundle_on_path": [],
        "elastic_worker": [[], False],
        "PYTHONPATH": None,
    }


def test_a_warm_child_of_ours_gets_the_bundles_libraries_and_the_users_program_does_not(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """child._libraries: the lifelines' helper (`-m elastic_worker...`, forked from the warm
    server) needs python-etcd; the user's program gets the image's path alone."""
    fake = bundle.Bundle("/b")
    monkeypatch.setattr(bundle, "BUNDLE", fake)
    # Not here: it drops this process's elastic_worker modules and loggers, and the tests
    # that run after this one in the same process would hold stale ones.
    monkeypatch.setattr(child, "_forget_the_server", lambda: None)
    monkeypatch.setattr(sys, "path", ["/cwd", "/b/lib", "/image/site-packages"])
    child._libraries(["-m", "elastic_worker.recovery.lifelines.helper", "ops", "id"])
    assert sys.path == ["/b/lib", "/b/deps", "/cwd", "/image/site-packages"]
    monkeypatch.setattr(sys, "path", ["/script", "/b/lib", "/image/site-packages"])
    child._libraries(["/script/train.py"])
    assert sys.path == ["/script", "/image/site-packages"]
    # A cold start of ours goes through boot.py with the worker's libraries, the user's not.
    assert bundle.python_argv("/py", ["-m", "elastic_worker.x", "a"]) == [
        "/py",
        "/b/bin/boot.py",
        "worker",
        "elastic_worker.x",
        "a",
    ]
    assert bundle.python_argv("/py", ["-u", "train.py"]) == ["/py", "-u", "train.py"]


def test_without_a_bundle_every_module_runs_with_python_m() -> None:
    """The worker image (and this venv): elastic_worker is installed, nothing is injected."""
    assert bundle.BUNDLE is None
    assert bundle.module_argv("/py", "torch.distributed.run") == [
        "/py",
        "-m",
        "torch.distributed.run",
    ]
    assert bundle.python_argv("/py", ["-m", "elastic_worker.x"]) == [
        "/py",
        "-m",
        "elastic_worker.x",
    ]


# -- an image that cannot run it ---------------------------------------------------------


def test_no_python_on_path_is_one_line_and_exit_5(pod: Path) -> None:
    done = subprocess.run(
        ["/bin/sh", str(pod / "bin/elastic-worker"), "python", "train.py"],
        check=False,
        capture_output=True,
        text=True,
        env={"PATH": "/nonexistent"},
    )
    assert done.returncode == exits.IMAGE == 5
    assert done.stderr.startswith(
        "elastic-worker: no python3 or python on PATH (/nonexistent): the image must have "
        "Python >= 3.10 with torch (docs/own-image.md)"
    )
    assert len(done.stderr.splitlines()) == 1, done.stderr


def test_a_python_older_than_the_floor_is_named_with_its_version(pod: Path, tmp_path: Path) -> None:
    """An image whose python3 is 3.8 (a stand-in: the sh entrypoint runs two one-liners that
    any Python runs, and this answers them as Python 3.8.10 would)."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    old = bindir / "python3"
    old.write_text(
        '#!/bin/sh\ncase "$2" in *version_info\\[:2\\]*) exit 1;; *) echo 3.8.10;; esac\n'
    )
    old.chmod(0o755)
    done = subprocess.run(
        ["/bin/sh", str(pod / "bin/elastic-worker"), "python", "train.py"],
        check=False,
        capture_output=True,
        text=True,
        env={"PATH": f"{bindir}:/bin"},
    )
    assert done.returncode == exits.IMAGE
    assert done.stderr == (
        f"elastic-worker: {old} is Python 3.8.10: the injected worker needs Python >= 3.10 "
        "(with torch); use an image with a newer Python, or the worker image "
        "(worker.entrypoint=image)\n"
    )


WORKER_ENV = {
    "ELASTIC_JOB_ID": "bundle-test",
    "ELASTIC_RDZV_ENDPOINT": "127.0.0.1:1",
    "ELASTIC_MIN_NODES": "1",
    "ELASTIC_MAX_NODES": "1",
    "ELASTIC_INJECT_ENV": "/dev/null",
    "POD_NAME": "bundle-test-0",
}


@pytest.mark.parametrize(
    ("torch_files", "said"),
    [
        ({}, "torch is not installed for {python}: use an image with torch >= 2.1"),
        (
            {"__init__.py": "", "version.py": "__version__ = '2.0.1+cu118'\n"},
            "torch 2.0.1+cu118 at {site}/torch is too old: the worker needs torch >= 2.1",
        ),
        (
            {"__init__.py": "", "version.py": "__version__ = '2.9.0a0+145a3a7.nv25.10'\n"},
            "torch 2.9.0a0+145a3a7.nv25.10 at {site}/torch has no torch.distributed.run (torchrun)",
        ),
    ],
    ids=["no-torch", "torch-2.0", "no-torchrun"],
)
def test_an_image_without_a_usable_torch_is_one_line_and_exit_5(
    pod: Path, tmp_path: Path, torch_files: dict[str, str], said: str
) -> None:
    """Read without importing torch: its version from torch/version.py (an NGC build's
    string included), its torchrun from the file."""
    venv = tmp_path / "venv"
    subprocess.run(
        [
            shutil.which("python3", path=SYSTEM_PATH) or "python3",
            "-m",
            "venv",
            "--without-pip",
            str(venv),
        ],
        check=True,
    )
    (site,) = venv.glob("lib/python3*/site-packages")
    for name, text in torch_files.items():
        (site / "torch").mkdir(exist_ok=True)
        (site / "torch" / name).write_text(text)
    done = _run(
        ["/bin/sh", str(pod / "bin/elastic-worker"), "python", "train.py"], venv, **WORKER_ENV
    )
    assert done.returncode == exits.IMAGE, done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    python = venv / "bin" / "python3"
    assert lines[0].startswith("elastic-worker: " + said.format(python=python, site=site)), lines
