"""The workflows' image steps, run here as written (tests/workflow_runner.py) with podman as
`docker` (no docker engine here): the users' chart workflow builds both images with their
real contexts (the worker's is the repository root: `docker build images/worker` failed on
its first COPY); the release workflow builds them FROM bases pulled by digest from a local
registry, pushes them there, reads their digests back with skopeo, writes an SPDX SBOM of each
digest with syft and its SLSA provenance; cosign's keyless steps are named as not run (GitHub's
OIDC token, Sigstore's Fulcio and Rekor; tests/release/test_sigstore.py). Needs podman and the
stand-in bases: scripts/test-images makes them; skipped otherwise, as tests/images is."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from release_helpers import local_registry, manifest_digest, release_sigstore
from release_helpers import release_wheels as release_wheels_dir
from testlib import ROOT, runner_python
from workflow_runner import Skip, clean_copy, run_job

INIT_BASE = os.environ.get("ELASTIC_INIT_BASE", "")
WORKER_BASE = os.environ.get("ELASTIC_WORKER_BASE", "")
PODMAN = ["podman", "--runtime", "runc", "--cgroup-manager=cgroupfs"]
VERSION = (ROOT / "VERSION").read_text().strip()
CHARTS_WORKFLOW = ROOT / "ci" / "workflows" / "charts.yaml"
RELEASE_WORKFLOW = ROOT / ".github" / "workflows" / "release.yaml"
NOT_HERE = {
    "kind": Skip("no kind cluster can run here (no kube-apiserver binary installs)"),
    "ct": Skip("ct (chart-testing) is a Go binary with no package here"),
    "download": Skip("downloads from get.helm.sh, unreachable here"),
    "disk": Skip("frees the GitHub runner's preinstalled SDKs; there are none here"),
    "login": Skip("the local registry takes no login (GITHUB_TOKEN is GitHub's)"),
    "cosign": Skip("cosign is a Go binary with no package here (Debian bookworm, PyPI, npm)"),
    "keyless": Skip(
        "keyless signing, attestations and their verification need GitHub's OIDC token and "
        "Sigstore's Fulcio and Rekor: the digests, SBOMs and provenance they take are checked"
    ),
}

#: What GitHub sets in a release run, as the provenance step reads it.
PROVENANCE_ENV = {
    "GITHUB_REPOSITORY": "elastic-job/elastic-job",
    "GITHUB_REF": f"refs/tags/v{VERSION}",
    "GITHUB_SHA": "0" * 40,
    "GITHUB_WORKFLOW_REF": "elastic-job/elastic-job/.github/workflows/release.yaml"
    f"@refs/tags/v{VERSION}",
    "GITHUB_RUN_ID": "1",
}

pytestmark = pytest.mark.skipif(
    not (INIT_BASE and WORKER_BASE),
    reason="builds the images: scripts/test-images (podman, stand-in bases)",
)


def runner_tools(tmp: Path, venv_bin: Path | None = None) -> Path:
    """`docker` is podman (as Debian's podman-docker makes it), `python` this Python."""
    bin_dir = tmp / "tools"
    bin_dir.mkdir(parents=True, exist_ok=True)
    docker = bin_dir / "docker"
    docker.write_text(f'#!/bin/sh\nexec {" ".join(PODMAN)} "$@"\n')
    docker.chmod(0o755)
    if venv_bin is None:
        (bin_dir / "python").symlink_to(sys.executable)
    return bin_dir


def podman(*args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*PODMAN, *args], capture_output=True, text=True, timeout=timeout, check=False
    )


def test_the_charts_workflow_builds_both_images_with_their_contexts(tmp_path: Path) -> None:
    """The install job's build step, with the stand-in bases as its repository variables;
    the worker image holds both of its packages, taken from the repository root."""
    checkout = clean_copy(ROOT, tmp_path / "checkout")
    run = run_job(
        CHARTS_WORKFLOW, "install", checkout,
        skip={
            "Install helm (sha256-verified)": NOT_HERE["download"],
            "helm/chart-testing-action": NOT_HERE["ct"],
            "Changed charts": Skip("ct lists the changed charts: take them as changed",
                                   {"changed": "true"}),
            "helm/kind-action": NOT_HERE["kind"],
            "Free disk space (the worker image's PyTorch base is large)": NOT_HERE["disk"],
            "Load the images into kind": NOT_HERE["kind"],
            "Install Volcano v1.15.1 (for ci/gang-values.yaml; manifest sha256-verified)":
                NOT_HERE["kind"],
            "Install the prometheus-operator CRDs (for ci/monitoring-values.yaml; "
            "sha256-verified)": NOT_HERE["kind"],
            "ct install (install, helm test, upgrade)": NOT_HERE["kind"],
        },
        path=[runner_tools(tmp_path)],
        vars_={"WORKER_BASE_IMAGE": WORKER_BASE, "INIT_BASE_IMAGE": INIT_BASE},
        timeout=2400,
    )  # fmt: skip
    assert not run.failed, run.failed[0].name + "\n" + run.failed[0].output[-6000:]
    assert [s.name for s in run.steps if s.ran] == ["Build the images"]
    worker = f"ghcr.io/elastic-job/worker:{VERSION}"
    assert podman("image", "exists", f"ghcr.io/elastic-job/init-topology:{VERSION}").returncode == 0
    inside = podman(
        "run", "--rm", "--entrypoint", "python", worker, "-c",
        "import elastic_worker, torch_etcd_v3, etcd, urllib3; print(urllib3.__version__)",
    )  # fmt: skip
    assert inside.returncode == 0, inside.stderr
    assert inside.stdout.strip() == "2.8.0"


@pytest.fixture(scope="module")
def setup_python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """actions/setup-python's part: a clean Python first on PATH (a fresh venv)."""
    return runner_python(tmp_path_factory.mktemp("setup-python") / "venv")


@pytest.fixture(scope="session")
def release_wheels() -> Path:
    return release_wheels_dir()


def test_the_release_builds_from_digests_pushes_and_writes_sboms(
    setup_python: Path, release_wheels: Path, tmp_path: Path
) -> None:

    with local_registry(tmp_path / "registry") as registry:
        conf = tmp_path / "registries.conf"
        conf.write_text(f'[[registry]]\nlocation = "{registry.host}"\ninsecure = true\n')
        os.environ["CONTAINERS_REGISTRIES_CONF"] = str(conf)  # podman below and in the job
        try:
            bases = {}
            for name, local in (("init-base", INIT_BASE), ("worker-base", WORKER_BASE)):
                remote = f"{registry.host}/standin/{name}:1"
                digest_file = tmp_path / f"{name}.digest"
                pushed = podman("push", "--digestfile", str(digest_file), local, remote)
                assert pushed.returncode == 0, pushed.stderr
                bases[name] = f"{remote}@{digest_file.read_text().strip()}"
            checkout = clean_copy(ROOT, tmp_path / "checkout")
            run = run_job(
                RELEASE_WORKFLOW, "images", checkout,
                skip={
                    "Free disk space (the worker image's PyTorch base is large)": NOT_HERE["disk"],
                    "Log in to the registry": NOT_HERE["login"],
                    "sigstore/cosign-installer": NOT_HERE["cosign"],
                    "Sign the images and attest their SBOM and provenance (keyless, by digest)":
                        NOT_HERE["keyless"],
                    "Verify the images as users do": NOT_HERE["keyless"],
                },
                path=[runner_tools(tmp_path, setup_python), setup_python],
                inputs={**bases, "registry": f"{registry.host}/elastic-job", "plain-http": "true"},
                github={"ref_type": "tag", "ref_name": f"v{VERSION}"},
                env={
                    **PROVENANCE_ENV,
                    "CONTAINERS_REGISTRIES_CONF": str(conf),
                    # The SBOM step's pip: the cached wheels, offline (release_wheels).
                    "PIP_FIND_LINKS": str(release_wheels),
                    "PIP_NO_INDEX": "1",
                },
                timeout=2400,
            )  # fmt: skip
        finally:
            os.environ.pop("CONTAINERS_REGISTRIES_CONF", None)
        assert not run.failed, run.failed[0].name + "\n" + run.failed[0].output[-6000:]
        build = run.step("Build both images FROM the bases by digest")
        assert bases["worker-base"] in build.output and bases["init-base"] in build.output
        assert [s.name for s in run.steps if s.ran] == [
            "Build both images FROM the bases by digest",
            "Push both images",
            "Digests of the pushed images",
            "SBOM of each pushed image (SPDX, syft)",
            "Build provenance of each image (SLSA v1)",
        ]
        refs = dict(release_sigstore().read_refs(checkout / "sigstore" / "images.refs"))
        assert sorted(refs) == ["init-topology", "worker"]
        for image, ref in refs.items():
            # What cosign signs and attests: the digest the registry serves for the tag.
            digest = manifest_digest(registry, f"elastic-job/{image}", VERSION)
            assert ref == f"{registry.host}/elastic-job/{image}@{digest}"
            sbom = json.loads((checkout / "sigstore" / f"{image}.spdx.json").read_text())
            assert sbom["spdxVersion"].startswith("SPDX-")
            names = {(p["name"], p.get("versionInfo")) for p in sbom["packages"]}
            want = ("init-topology", VERSION) if image == "init-topology" else ("urllib3", "2.8.0")
            assert want in names, sorted(names)[:50]
            provenance = json.loads(
                (checkout / "sigstore" / f"{image}.provenance.json").read_text()
            )
            base = bases["init-base" if image == "init-topology" else "worker-base"]
            assert provenance["buildDefinition"]["resolvedDependencies"][1] == {
                "uri": "docker://" + base.split("@")[0],
                "digest": {"sha256": base.split("@sha256:")[1]},
            }
