"""scripts/release-sigstore, what the release's keyless steps run: the cosign commands it
builds from the digests the workflow recorded (run here against a stand-in `cosign` that
records its arguments: cosign has no package here, and keyless signing needs GitHub's OIDC
token and Sigstore's services), the SLSA provenance it writes, and the verify commands the
docs give users, with the one repository identity they name."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from release_helpers import release_sigstore
from testlib import ROOT

SCRIPT = ROOT / "scripts" / "release-sigstore"
RS = release_sigstore()
VERSION = (ROOT / "VERSION").read_text().strip()
D1, D2 = "sha256:" + "1" * 64, "sha256:" + "2" * 64
GITHUB_ENV = {
    "GITHUB_SERVER_URL": "https://github.com",
    "GITHUB_REPOSITORY": RS.REPOSITORY,
    "GITHUB_REF": f"refs/tags/v{VERSION}",
    "GITHUB_SHA": "a" * 40,
    "GITHUB_WORKFLOW_REF": f"{RS.REPOSITORY}/{RS.WORKFLOW}@refs/tags/v{VERSION}",
    "GITHUB_RUN_ID": "123",
    "GITHUB_RUN_ATTEMPT": "2",
    "GITHUB_EVENT_NAME": "workflow_dispatch",
    "GITHUB_REPOSITORY_ID": "42",
    "GITHUB_REPOSITORY_OWNER_ID": "7",
    "RUNNER_ENVIRONMENT": "github-hosted",
}


def script(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=60,
        check=False, env={**os.environ, **(env or {})},
    )  # fmt: skip


@pytest.fixture
def recording_cosign(tmp_path: Path) -> tuple[dict[str, str], Path]:
    """A `cosign` first on PATH that appends its arguments (JSON) to a log and succeeds."""
    bin_dir, log = tmp_path / "bin", tmp_path / "cosign.log"
    bin_dir.mkdir()
    cosign = bin_dir / "cosign"
    cosign.write_text(
        f"#!{sys.executable}\nimport json, sys\n"
        f"open({str(log)!r}, 'a').write(json.dumps(sys.argv[1:]) + '\\n')\n"
    )
    cosign.chmod(0o755)
    return {"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}, log


def logged(log: Path) -> list[list[str]]:
    return [json.loads(line) for line in log.read_text().splitlines()]


def test_refs_names_each_pushed_digest(tmp_path: Path) -> None:
    done = script("refs", "registry.test/ns", f"worker={D1}", f"init-topology={D2}")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        f"worker registry.test/ns/worker@{D1}",
        f"init-topology registry.test/ns/init-topology@{D2}",
    ]
    refs = tmp_path / "refs"
    refs.write_text(done.stdout)
    assert RS.read_refs(refs) == [
        ("worker", f"registry.test/ns/worker@{D1}"),
        ("init-topology", f"registry.test/ns/init-topology@{D2}"),
    ]


@pytest.mark.parametrize("bad", ["worker=", "worker=latest", "worker=sha256:abc"])
def test_refs_refuses_what_is_not_a_digest(bad: str) -> None:
    """An empty digest (a push whose output changed) must stop the release, not sign a tag."""
    done = script("refs", "registry.test/ns", bad)
    assert done.returncode == 2
    assert done.stderr.strip() == f"release-sigstore: {bad}: not NAME=sha256:<64 hex>"


def test_sign_signs_each_digest_keyless(
    tmp_path: Path, recording_cosign: tuple[dict[str, str], Path]
) -> None:
    env, log = recording_cosign
    refs = tmp_path / "refs"
    refs.write_text(f"a r.test/a@{D1}\nb r.test/b@{D2}\n")
    done = script("sign", str(refs), env=env)
    assert done.returncode == 0, done.stderr
    assert logged(log) == [["sign", "--yes", f"r.test/a@{D1}"], ["sign", "--yes", f"r.test/b@{D2}"]]


def test_attest_attaches_the_sbom_and_the_provenance_of_each_image(
    tmp_path: Path, recording_cosign: tuple[dict[str, str], Path]
) -> None:
    env, log = recording_cosign
    refs = tmp_path / "refs"
    refs.write_text(f"worker r.test/worker@{D1}\n")
    predicates = tmp_path / "sigstore"
    predicates.mkdir()
    done = script("attest", str(refs), "--predicates", str(predicates), env=env)
    assert done.returncode == 2
    assert done.stderr.strip() == (
        f"release-sigstore: no {predicates}/worker.spdx.json for r.test/worker@{D1}"
    )
    (predicates / "worker.spdx.json").write_text("{}")
    (predicates / "worker.provenance.json").write_text("{}")
    done = script("attest", str(refs), "--predicates", str(predicates), env=env)
    assert done.returncode == 0, done.stderr
    ref = f"r.test/worker@{D1}"
    assert logged(log) == [
        ["attest", "--yes", "--type", "spdxjson", "--predicate",
         str(predicates / "worker.spdx.json"), ref],
        ["attest", "--yes", "--type", "slsaprovenance1", "--predicate",
         str(predicates / "worker.provenance.json"), ref],
    ]  # fmt: skip


def test_verify_checks_the_release_workflows_identity(
    tmp_path: Path, recording_cosign: tuple[dict[str, str], Path]
) -> None:
    env, log = recording_cosign
    refs = tmp_path / "refs"
    refs.write_text(f"worker r.test/worker@{D1}\n")
    assert script("verify", str(refs), "--attestations", env=env).returncode == 0
    identity = (
        f"https://github.com/{RS.REPOSITORY}/.github/workflows/release.yaml@refs/tags/v{VERSION}"
    )
    common = ["--certificate-identity", identity,
              "--certificate-oidc-issuer", "https://token.actions.githubusercontent.com",
              f"r.test/worker@{D1}"]  # fmt: skip
    assert logged(log) == [
        ["verify", *common],
        ["verify-attestation", "--type", "spdxjson", *common],
        ["verify-attestation", "--type", "slsaprovenance1", *common],
    ]


def test_a_failed_cosign_fails_the_step(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "cosign").write_text("#!/bin/sh\necho 'error: no token' >&2\nexit 1\n")
    (bin_dir / "cosign").chmod(0o755)
    refs = tmp_path / "refs"
    refs.write_text(f"a r.test/a@{D1}\nb r.test/b@{D2}\n")
    done = script("sign", str(refs), env={"PATH": f"{bin_dir}:{os.environ['PATH']}"})
    assert done.returncode == 1
    assert "error: no token" in done.stderr and done.stdout.count("+ cosign") == 1


def test_provenance_is_slsa_v1_of_this_run_with_its_bases() -> None:
    base = f"python:3.11.16-slim-bookworm@{D2}"
    done = script("provenance", "--subject", f"r.test/init-topology@{D1}", "--base", base,
                  env=GITHUB_ENV)  # fmt: skip
    assert done.returncode == 0, done.stderr
    predicate = json.loads(done.stdout)
    build = predicate["buildDefinition"]
    assert build["buildType"] == "https://actions.github.io/buildtypes/workflow/v1"
    assert build["externalParameters"]["workflow"] == {
        "ref": f"refs/tags/v{VERSION}",
        "repository": f"https://github.com/{RS.REPOSITORY}",
        "path": ".github/workflows/release.yaml",
    }
    assert build["resolvedDependencies"] == [
        {"uri": f"git+https://github.com/{RS.REPOSITORY}@refs/tags/v{VERSION}",
         "digest": {"gitCommit": "a" * 40}},
        {"uri": "docker://python:3.11.16-slim-bookworm", "digest": {"sha256": "2" * 64}},
    ]  # fmt: skip
    assert predicate["runDetails"] == {
        "builder": {"id": f"https://github.com/{RS.REPOSITORY}/{RS.WORKFLOW}@refs/tags/v{VERSION}"},
        "metadata": {"invocationId": f"https://github.com/{RS.REPOSITORY}/actions/runs/123/attempts/2"},
    }  # fmt: skip


def test_provenance_refuses_a_base_without_a_digest() -> None:
    done = script("provenance", "--subject", f"r.test/a@{D1}", "--base", "python:3.11",
                  env=GITHUB_ENV)  # fmt: skip
    assert done.returncode == 2
    assert "give the base by digest" in done.stderr


# -- what users are told ---------------------------------------------------------------------


#: What each doc gives, whole, for this VERSION (`scripts/release-sigstore commands` prints
#: the rest; after a VERSION bump, paste its lines again).
DOCS = {
    "README.md": ["image worker", "image worker sbom", "image worker provenance",
                  "chart elastic-job"],
    "charts/elastic-job/README.md": ["chart elastic-job", "image worker", "image init-topology"],
}  # fmt: skip


@pytest.mark.parametrize("doc", sorted(DOCS))
def test_the_docs_give_the_verify_commands(doc: str) -> None:
    commands = {key: RS.shell(argv) for key, argv in RS.commands().items()}
    printed = script("commands").stdout.splitlines()
    assert printed == list(commands.values())
    assert len(printed) == 3 * len(RS.IMAGES) + len(RS.CHARTS)
    text = (ROOT / doc).read_text()
    missing = [commands[key] for key in DOCS[doc] if commands[key] not in text.splitlines()]
    assert not missing, f"{doc} lacks: {missing}"
    assert "scripts/release-sigstore commands" in text


def test_one_repository_identity() -> None:
    """The repository the signatures name is the one the charts, the images' labels, the
    packages and the registry defaults name."""
    url = f"https://github.com/{RS.REPOSITORY}"
    for chart_yaml in ROOT.glob("charts/*/Chart.yaml"):
        links = yaml.safe_load(yaml.safe_load(chart_yaml.read_text())["annotations"]
                               ["artifacthub.io/links"])  # fmt: skip
        ours = [
            li["url"] for li in links if "github.com/" in li["url"] and "etcd-io" not in li["url"]
        ]
        assert ours and all(u.startswith(url + "/") for u in ours), chart_yaml
    for dockerfile in ROOT.glob("images/*/Dockerfile"):
        assert f'org.opencontainers.image.source="{url}"' in dockerfile.read_text(), dockerfile
    for pyproject in ROOT.glob("packages/*/pyproject.toml"):
        found = set(re.findall(r'"(https://github\.com/[^/"]+/[^/"]+)', pyproject.read_text()))
        assert found == {url}, pyproject
    assert f'REGISTRY = "{RS.REGISTRY}"' in (ROOT / "scripts/build-images").read_text()
    release = yaml.safe_load((ROOT / RS.WORKFLOW).read_text())
    assert release[True]["workflow_dispatch"]["inputs"]["registry"]["default"] == RS.REGISTRY
