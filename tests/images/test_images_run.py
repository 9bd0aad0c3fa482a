"""The two images, built by scripts/build-images and run as the chart runs them: init-topology
against the fake API server writes /etc/inject/env; the worker trains a one-node job
against a real etcd. Needs podman and stand-in bases (no registry can be pulled here):
scripts/test-images makes them and runs this module; the default test command skips it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from testlib import ROOT, start_etcd

from localrun.cluster.apiserver import FakeApiServer
from localrun.cluster.nodes import load_nodes

INIT_BASE = os.environ.get("ELASTIC_INIT_BASE", "")
WORKER_BASE = os.environ.get("ELASTIC_WORKER_BASE", "")
TAG = "images-test"
PODMAN = ["podman", "--runtime", "runc", "--cgroup-manager=cgroupfs"]

pytestmark = pytest.mark.skipif(
    not (INIT_BASE and WORKER_BASE),
    reason="builds and runs the images: scripts/test-images (podman, stand-in bases)",
)


def build(image: str, base_flag: str, base: str) -> str:
    """scripts/build-images for one image; the tests take it from the fixtures below, which
    build each image once per session (a second build of the same sources is podman's
    layer cache, still ~10 s of context and steps on this machine)."""
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "build-images"), "--engine", "podman",
         "--only", image, base_flag, base, "--tag", TAG],
        capture_output=True, text=True, timeout=1200, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    return f"ghcr.io/elastic-job/{image}:{TAG}"


@pytest.fixture(scope="session")
def init_image() -> str:
    return build("init-topology", "--init-base", INIT_BASE)


@pytest.fixture(scope="session")
def worker_image() -> str:
    return build("worker", "--worker-base", WORKER_BASE)


def run(
    image: str,
    *args: str,
    env: dict[str, str],
    mounts: list[str],
    entrypoint: str | None = None,
    timeout: float = 300,
) -> subprocess.CompletedProcess[str]:
    """As the chart's securityContext runs it: its own uid, no capabilities, no privilege
    escalation, read-only root; the host network stands in for the pod network."""
    argv = [*PODMAN, "run", "--rm", "--network=host", "--read-only", "--cap-drop=ALL",
            "--security-opt=no-new-privileges", "--tmpfs=/tmp"]  # fmt: skip
    for key, value in env.items():
        argv += ["-e", f"{key}={value}"]
    for mount in mounts:
        argv += ["-v", mount]
    if entrypoint:
        argv += ["--entrypoint", entrypoint]
    return subprocess.run(
        [*argv, image, *args], capture_output=True, text=True, timeout=timeout, check=False
    )


def labels(image: str) -> dict[str, str]:
    out = subprocess.run(
        [*PODMAN, "image", "inspect", image], capture_output=True, text=True, check=True
    ).stdout
    return dict(json.loads(out)[0]["Labels"] or {})


def test_init_topology_ships_no_pip(init_image: str) -> None:
    """Nothing installs at run time: the base's pip (and setuptools) leave the image after
    the build, so a scanner finds no pip to flag (requirements/advisories.toml)."""
    done = run(init_image, "-c", "import importlib.util as u; print(u.find_spec('pip'), "
               "u.find_spec('setuptools'))", env={}, mounts=[], entrypoint="python")  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["None", "None"]


def test_init_topology_writes_the_nodes_topology_from_the_api(
    init_image: str, tmp_path: Path
) -> None:
    image = init_image
    assert (
        labels(image)["org.opencontainers.image.version"] == (ROOT / "VERSION").read_text().strip()
    )
    out = tmp_path / "inject"
    out.mkdir()
    out.chmod(0o777)  # the container's uid 65532 writes here, as into the emptyDir
    nodes = load_nodes("all")
    node = next(name for name in nodes if "spot" in name and "gke" in name)
    with FakeApiServer(nodes, workdir=tmp_path / "api") as api:
        sa = api.serviceaccount_dir
        for path in (sa, *sa.iterdir()):
            path.chmod(0o755 if path.is_dir() else 0o644)
        done = run(
            image,
            env={**api.env(), "NODE_NAME": node},
            mounts=[f"{sa}:/var/run/secrets/kubernetes.io/serviceaccount:ro", f"{out}:/etc/inject"],
        )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "warn" not in done.stderr.lower(), done.stderr  # it read its Node over HTTPS
    env = (out / "env").read_text()
    assert "NODE_CAPACITY_TYPE='spot'" in env, env
    assert "NODE_GPU_MODEL='" in env and "NODE_TOPOLOGY_SOURCE='api'" in env, env


def test_the_worker_image_trains_a_one_node_job_and_has_the_v3_backend(
    worker_image: str, tmp_path: Path
) -> None:
    image = worker_image
    etcd = start_etcd(tmp_path / "etcd")
    try:
        done = run(
            image,
            "python", "/opt/elastic-worker/examples/train.py", "--steps", "3",
            "--checkpoint-dir", "/tmp/ckpt",
            env={
                "ELASTIC_JOB_ID": "image-test",
                "ELASTIC_RDZV_ENDPOINT": etcd.endpoint,
                "ELASTIC_MIN_NODES": "1",
                "ELASTIC_MAX_NODES": "1",
                "ELASTIC_INJECT_ENV": "/nonexistent/inject/env",
                "ELASTIC_LOCAL_ADDR": "127.0.0.1",
                "GLOO_SOCKET_IFNAME": "lo",
                "POD_NAME": "image-test-0",
            },
            mounts=[],
        )  # fmt: skip
    finally:
        etcd.stop()
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    assert "[train] done" in done.stdout + done.stderr
    handlers = run(
        image, "-c",
        "from importlib.metadata import entry_points; "
        "print(sorted(e.name for e in entry_points(group='torchrun.handlers')))",
        env={}, mounts=[], entrypoint="python",
    )  # fmt: skip
    assert handlers.returncode == 0, handlers.stderr
    assert "etcd-v3" in handlers.stdout, handlers.stdout


def test_the_injected_worker_trains_in_an_image_we_did_not_build(
    init_image: str, tmp_path: Path
) -> None:
    """worker.entrypoint=injected, as the chart runs it: init-topology's image copies the
    bundle into an emptyDir (inject-worker, uid 65532, the pod's fsGroup), then a plain
    Python + torch image (the worker's stand-in base: nothing of ours in it) runs
    `/bin/sh /opt/elastic-worker/bin/elastic-worker python .../train.py` as another uid in
    that group, against a real etcd; and that image without torch's Python exits 5 in one line."""
    init = init_image
    pod = tmp_path / "elastic-worker"
    pod.mkdir()
    os.chown(pod, 0, 65532)
    pod.chmod(0o2775)  # an emptyDir with fsGroup 65532: group-owned, setgid
    done = run(
        init, "/opt/elastic-worker", env={}, mounts=[f"{pod}:/opt/elastic-worker"],
        entrypoint="/opt/elastic-worker-bundle/bin/inject",
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "inject-worker: elastic-worker copied into /opt/elastic-worker" in done.stdout
    etcd = start_etcd(tmp_path / "etcd")
    try:
        trained = subprocess.run(
            [*PODMAN, "run", "--rm", "--network=host", "--read-only", "--cap-drop=ALL",
             "--security-opt=no-new-privileges", "--tmpfs=/tmp", "--user=10001:10001",
             "--group-add=65532", "-v", f"{pod}:/opt/elastic-worker",
             "-e", "ELASTIC_JOB_ID=inject-test", "-e", f"ELASTIC_RDZV_ENDPOINT={etcd.endpoint}",
             "-e", "ELASTIC_MIN_NODES=1", "-e", "ELASTIC_MAX_NODES=1",
             "-e", "ELASTIC_INJECT_ENV=/dev/null", "-e", "ELASTIC_LOCAL_ADDR=127.0.0.1",
             "-e", "GLOO_SOCKET_IFNAME=lo", "-e", "POD_NAME=inject-test-0", "-e", "HOME=/tmp",
             "--entrypoint", "/bin/sh", WORKER_BASE, "/opt/elastic-worker/bin/elastic-worker",
             "python", "/opt/elastic-worker/examples/train.py", "--steps", "3",
             "--checkpoint-dir", "/tmp/ckpt"],
            capture_output=True, text=True, timeout=300, check=False,
        )  # fmt: skip
    finally:
        etcd.stop()
    out = trained.stdout + trained.stderr
    assert trained.returncode == 0, out[-4000:]
    assert "[train] done" in out
    assert "/opt/elastic-worker/bin/boot.py worker elastic_worker.launch.torchrun" in out
    # The image's python wrote the bundle's bytecode (the group lets it): later starts skip it.
    assert list(pod.rglob("__pycache__/*.pyc")), "no bytecode written"
    # The init-topology image's own python has no torch: one line, exit 5.
    no_torch = run(
        init, "/opt/elastic-worker/bin/elastic-worker", "python", "x.py",
        env={"ELASTIC_JOB_ID": "x", "ELASTIC_RDZV_ENDPOINT": "127.0.0.1:1",
             "ELASTIC_MIN_NODES": "1", "ELASTIC_MAX_NODES": "1",
             "ELASTIC_INJECT_ENV": "/dev/null", "POD_NAME": "x-0"},
        mounts=[f"{pod}:/opt/elastic-worker:ro"], entrypoint="/bin/sh",
    )  # fmt: skip
    assert no_torch.returncode == 5, no_torch.stderr
    assert no_torch.stderr.count("\n") == 1 and "torch is not installed for" in no_torch.stderr
