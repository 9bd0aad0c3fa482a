"""The release workflow (.github/workflows/release.yaml) run here, act-style: the check job
refuses a branch or a base without a digest; the charts job checks the published public key
(served on loopback) is the signing key, packages and signs every chart with a throwaway
GnuPG key given as its secret, with artifacthub.io/signKey, and pushes them with their
provenance to a local OCI registry (Debian's docker-registry, plain HTTP), from which
`helm pull --verify` takes them back; the digests it records for cosign are the registry's.
cosign's keyless steps need GitHub's OIDC token and Sigstore's Fulcio and Rekor: they are
named as not run, and the commands they would run are checked (tests/release/test_sigstore.py).
The images job runs in tests/images (podman as docker), the packages job in
tests/release/test_python_packages.py."""

from __future__ import annotations

import re
import subprocess
import tarfile
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml
from release_helpers import (
    SigningKey,
    local_registry,
    make_signing_key,
    manifest_digest,
    release_sigstore,
    serve_directory,
)
from testlib import HELMS, ROOT
from workflow_runner import Skip, clean_copy, run_job

WORKFLOW = ROOT / ".github" / "workflows" / "release.yaml"
VERSION = (ROOT / "VERSION").read_text().strip()
CHARTS = sorted(p.parent.name for p in ROOT.glob("charts/*/Chart.yaml"))
DIGEST = "@sha256:" + "0123456789abcdef" * 4
TAG = {"ref_type": "tag", "ref_name": f"v{VERSION}"}
BASES = {"worker-base": f"nvcr.io/nvidia/pytorch:25.10-py3{DIGEST}",
         "init-base": f"python:3.11.16-slim-bookworm{DIGEST}"}  # fmt: skip
DOWNLOAD = Skip("downloads helm from get.helm.sh, unreachable here: .tools/helm3 is `helm`")
NO_LOGIN = Skip("the local registry takes no login (GITHUB_TOKEN is GitHub's)")
NO_COSIGN = Skip("cosign is a Go binary with no package here (Debian bookworm, PyPI, npm)")
KEYLESS = Skip(
    "keyless signing and its verification need GitHub's OIDC token and Sigstore's Fulcio and "
    "Rekor, which this machine cannot reach: the refs it reads are checked against the registry"
)
CHART_SIGSTORE = {
    "sigstore/cosign-installer": NO_COSIGN,
    "Sign the charts (keyless, by digest)": KEYLESS,
    "Verify the charts as users do": KEYLESS,
}


def helm_on_path(tmp: Path) -> Path:
    bin_dir = tmp / "tools"
    bin_dir.mkdir(parents=True, exist_ok=True)
    (bin_dir / "helm").symlink_to(HELMS["helm3"])
    return bin_dir


def test_the_helm_it_signs_with_is_the_one_bootstrap_installs() -> None:
    """HELM3_VERSION and HELM3_SHA256 are scripts/bootstrap's, the one place the Helm
    release is chosen (its safe minimum in requirements/advisories.toml; the charts
    workflow is held to it by tests/ci)."""
    bootstrap = (ROOT / "scripts" / "bootstrap").read_text()
    env = yaml.safe_load(WORKFLOW.read_text())["env"]
    pinned = {k: v for k, v in env.items() if k.startswith("HELM")}
    assert set(pinned) == {"HELM3_VERSION", "HELM3_SHA256"}, sorted(pinned)
    for key, value in pinned.items():
        want = re.search(rf"^{key}=(\S+)$", bootstrap, re.MULTILINE)
        assert want and value == want[1], (
            f"release.yaml {key}={value}; bootstrap: {want and want[0]}"
        )


def check(tmp: Path, github: dict[str, str], inputs: dict[str, str]) -> str | None:
    """The check job's error line, or None when it passes."""
    run = run_job(WORKFLOW, "check", clean_copy(ROOT, tmp / "checkout"), skip={}, path=[],
                  github=github, inputs=inputs)  # fmt: skip
    step = run.step("The tag is v<VERSION> and the bases are pinned by digest")
    assert step.ran
    return None if step.returncode == 0 else step.output.strip()


@contextmanager
def short_runner_dir() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="wf-") as tmp:
        try:
            yield Path(tmp)
        finally:
            gnupg = Path(tmp) / "temp" / "gnupg"
            if gnupg.is_dir():
                subprocess.run(["gpgconf", "--homedir", gnupg, "--kill", "gpg-agent"], check=False)


def test_every_action_is_pinned_by_commit_with_its_tag() -> None:
    uses = [ln.strip() for ln in WORKFLOW.read_text().splitlines() if "uses:" in ln]
    assert uses
    for line in uses:
        assert line.split("@")[1][:40].isalnum() and len(line.split("@")[1].split()[0]) == 40
        assert "# v" in line, line


def test_the_workflow_is_valid_for_github_actions() -> None:
    proc = subprocess.run(
        [ROOT / ".venv/bin/check-jsonschema", "--builtin-schema", "vendor.github-workflows",
         WORKFLOW], capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_the_bases_are_required_inputs() -> None:
    inputs = yaml.safe_load(WORKFLOW.read_text())[True]["workflow_dispatch"]["inputs"]
    assert inputs["worker-base"]["required"] and inputs["init-base"]["required"]


def test_the_check_job_passes_on_the_version_tag_with_digests(tmp_path: Path) -> None:
    assert check(tmp_path, TAG, BASES) is None


def test_the_check_job_refuses_a_branch(tmp_path: Path) -> None:
    error = check(tmp_path, {"ref_type": "branch", "ref_name": "main"}, BASES)
    assert (
        error
        == f"release: dispatch this workflow on the tag v{VERSION} (VERSION), not branch 'main'"
    )


def test_the_check_job_refuses_a_base_given_by_tag_alone(tmp_path: Path) -> None:
    error = check(tmp_path, TAG, {**BASES, "worker-base": "nvcr.io/nvidia/pytorch:25.10-py3"})
    assert error == (
        "release: base image 'nvcr.io/nvidia/pytorch:25.10-py3' has no digest: give it as "
        "NAME:TAG@sha256:<64 hex>"
    )


@pytest.fixture(scope="module")
def signing_key(tmp_path_factory: pytest.TempPathFactory) -> SigningKey:
    return make_signing_key(tmp_path_factory.mktemp("gpg"))


def _charts_job(
    tmp_path: Path, signing_key: SigningKey, registry_host: str, key_url: str, runner: Path
) -> tuple[Path, Any]:
    checkout = clean_copy(ROOT, tmp_path / "checkout")
    run = run_job(
        WORKFLOW, "charts", checkout,
        skip={"Install helm (sha256-verified)": DOWNLOAD, "Log in to the registry": NO_LOGIN,
              **CHART_SIGSTORE},
        path=[helm_on_path(tmp_path)],
        inputs={**BASES, "registry": f"{registry_host}/elastic-job", "plain-http": "true"},
        secrets={"HELM_SIGNING_KEY": signing_key.armored,
                 "HELM_SIGNING_PASSPHRASE": signing_key.passphrase_file.read_text().strip()},
        vars_={"HELM_SIGNING_KEY_URL": key_url},
        github=TAG, runner_dir=runner,
    )  # fmt: skip
    return checkout, run


@pytest.mark.slow
def test_the_charts_job_signs_and_pushes_every_chart_with_its_provenance(
    signing_key: SigningKey, tmp_path: Path
) -> None:
    published = tmp_path / "web"
    published.mkdir()
    (published / "signing-key.gpg").write_bytes(signing_key.pubring.read_bytes())
    # gpg-agent's socket must fit a Unix socket path: RUNNER_TEMP is short, as on GitHub.
    with (
        local_registry(tmp_path / "registry") as registry,
        serve_directory(published) as web,
        short_runner_dir() as runner,
    ):
        key_url = f"{web}/signing-key.gpg"
        checkout, run = _charts_job(tmp_path, signing_key, registry.host, key_url, runner)
        assert not run.failed, run.failed[0].name + "\n" + run.failed[0].output[-4000:]
        ran = [s.name for s in run.steps if s.ran]
        assert ran == [
            "Import the signing key",
            "The published public key is the signing key",
            "Package and sign every chart",
            "Push the charts with their provenance",
        ]
        assert run.step("Package and sign every chart").output.count(
            signing_key.fingerprint
        ) >= len(CHARTS)
        assert not (runner / "temp" / "secring.gpg").exists()
        # What cosign signs: each chart by the digest the registry serves for its version.
        refs = release_sigstore().read_refs(checkout / "sigstore" / "charts.refs")
        assert [name for name, _ in refs] == CHARTS
        for name, ref in refs:
            repository = f"elastic-job/charts/{name}"
            assert ref == f"{registry.host}/{repository}@" + manifest_digest(
                registry, repository, VERSION
            )
        for chart in CHARTS:
            dest = tmp_path / "pulled" / chart
            dest.mkdir(parents=True)
            pulled = subprocess.run(
                [HELMS["helm3"], "pull", f"oci://{registry.host}/elastic-job/charts/{chart}",
                 "--version", VERSION, "--plain-http", "--verify", "--keyring",
                 signing_key.pubring, "-d", dest],
                capture_output=True, text=True, check=False, timeout=120,
                env={"HOME": str(tmp_path / "home"), "PATH": "/usr/bin:/bin"},
            )  # fmt: skip
            assert pulled.returncode == 0, pulled.stderr
            assert signing_key.fingerprint in pulled.stdout + pulled.stderr
            assert (dest / f"{chart}-{VERSION}.tgz.prov").is_file()
            # Artifact Hub's signKey: the key that signed, and where its public part is.
            with tarfile.open(dest / f"{chart}-{VERSION}.tgz") as tgz:
                member = tgz.extractfile(f"{chart}/Chart.yaml")
                assert member is not None
                annotations = yaml.safe_load(member.read())["annotations"]
            assert yaml.safe_load(annotations["artifacthub.io/signKey"]) == {
                "fingerprint": signing_key.fingerprint,
                "url": key_url,
            }
        # The checkout's Chart.yaml files are left as they are.
        for chart in CHARTS:
            kept = yaml.safe_load((checkout / "charts" / chart / "Chart.yaml").read_text())
            assert "artifacthub.io/signKey" not in kept["annotations"]


@pytest.mark.slow
def test_the_charts_job_refuses_a_published_key_that_is_not_the_signing_key(
    signing_key: SigningKey, tmp_path: Path
) -> None:
    """Artifact Hub would send helm verify users to a key that did not sign: stop first."""
    other = make_signing_key(tmp_path / "other")
    published = tmp_path / "web"
    published.mkdir()
    (published / "signing-key.gpg").write_bytes(other.pubring.read_bytes())
    with (
        local_registry(tmp_path / "registry") as registry,
        serve_directory(published) as web,
        short_runner_dir() as runner,
    ):
        key_url = f"{web}/signing-key.gpg"
        _, run = _charts_job(tmp_path, signing_key, registry.host, key_url, runner)
    (failed,) = run.failed
    assert failed.name == "The published public key is the signing key"
    assert failed.output.strip() == (
        f"release: {key_url} holds key {other.fingerprint}, not the signing key "
        f"{signing_key.fingerprint}: publish the signing key's public key there"
    )
