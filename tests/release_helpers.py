"""Real parts a release needs, made here for one test: a throwaway GnuPG signing key (the
release's Helm provenance), a local OCI registry (Debian's docker-registry, the CNCF
distribution registry) on a free loopback port, a loopback web server for a published file,
and scripts/release-sigstore as a module."""

from __future__ import annotations

import functools
import hashlib
import http.server
import importlib.machinery
import importlib.util
import os
import shutil
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import usercache
from testlib import ROOT, free_port

SIGNER = "elastic-job release test <release-test@example.invalid>"
SIGNER_EMAIL = "release-test@example.invalid"
REGISTRY_BINARY = "docker-registry"


@dataclass(frozen=True)
class SigningKey:
    name: str  # what `helm package --key` takes
    secring: Path  # legacy secret keyring (Helm reads no keybox)
    pubring: Path  # what `helm verify --keyring` takes
    passphrase_file: Path
    fingerprint: str
    armored: str  # the secret key as the release workflow's HELM_SIGNING_KEY secret holds it


def make_signing_key(workdir: Path) -> SigningKey:
    """An RSA key with a passphrase, in its own GNUPGHOME (Helm's OpenPGP library reads RSA,
    not ed25519); the keyrings are written outside that home."""
    if shutil.which("gpg") is None:
        pytest.fail("gpg is missing: apt-get install gnupg (scripts/bootstrap installs it)")
    home = workdir / "gnupg"
    home.mkdir(mode=0o700, parents=True)
    passfile = workdir / "passphrase"
    passfile.write_text("release-test-passphrase\n")
    env = {**os.environ, "GNUPGHOME": str(home)}

    def gpg(*args: str) -> bytes:
        return subprocess.run(
            ["gpg", "--batch", "--pinentry-mode", "loopback", "--passphrase-file", str(passfile),
             *args],
            env=env, capture_output=True, check=True, timeout=120,
        ).stdout  # fmt: skip

    gpg("--quick-gen-key", SIGNER, "rsa2048", "sign", "never")
    secring, pubring = workdir / "secring.gpg", workdir / "pubring.gpg"
    secring.write_bytes(gpg("--export-secret-keys", SIGNER_EMAIL))
    pubring.write_bytes(gpg("--export", SIGNER_EMAIL))
    listing = gpg("--with-colons", "--fingerprint", SIGNER_EMAIL).decode()
    fingerprint = next(ln.split(":")[9] for ln in listing.splitlines() if ln.startswith("fpr:"))
    armored = gpg("--armor", "--export-secret-keys", SIGNER_EMAIL).decode()
    subprocess.run(["gpgconf", "--kill", "gpg-agent"], env=env, check=False)
    return SigningKey(SIGNER_EMAIL, secring, pubring, passfile, fingerprint, armored)


@dataclass(frozen=True)
class Registry:
    host: str  # 127.0.0.1:PORT, plain HTTP
    storage: Path


@contextmanager
def local_registry(workdir: Path) -> Iterator[Registry]:
    """Debian's docker-registry serving on a free loopback port until the block ends."""
    binary = shutil.which(REGISTRY_BINARY)
    if binary is None:
        pytest.fail("docker-registry is missing: apt-get install docker-registry")
    workdir.mkdir(parents=True, exist_ok=True)
    host = f"127.0.0.1:{free_port()}"
    config = workdir / "registry.yml"
    config.write_text(
        "version: 0.1\nlog:\n  level: warn\n"
        f"storage:\n  filesystem:\n    rootdirectory: {workdir / 'data'}\n"
        f"http:\n  addr: {host}\n"
    )
    log = (workdir / "registry.log").open("wb")
    proc = subprocess.Popen([binary, "serve", str(config)], stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                with urllib.request.urlopen(f"http://{host}/v2/", timeout=1):
                    break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"docker-registry did not serve on {host}: see {log.name}")
                time.sleep(0.1)
        yield Registry(host, workdir / "data")
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
        log.close()


def manifest_digest(registry: Registry, repository: str, tag: str) -> str:
    """The digest the registry serves for repository:tag (its Docker-Content-Digest)."""
    request = urllib.request.Request(
        f"http://{registry.host}/v2/{repository}/manifests/{tag}", method="HEAD",
        headers={"Accept": "application/vnd.oci.image.manifest.v1+json, "
                 "application/vnd.oci.image.index.v1+json, "
                 "application/vnd.docker.distribution.manifest.v2+json"},
    )  # fmt: skip
    with urllib.request.urlopen(request, timeout=10) as resp:
        return str(resp.headers["Docker-Content-Digest"])


@contextmanager
def serve_directory(root: Path) -> Iterator[str]:
    """`root` over HTTP on a free loopback port (a published key, as a web server has it):
    its base URL until the block ends."""
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(root))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def release_sigstore() -> Any:
    """scripts/release-sigstore, imported (it is a script without the .py ending)."""
    path = ROOT / "scripts" / "release-sigstore"
    loader = importlib.machinery.SourceFileLoader("release_sigstore", str(path))
    spec = importlib.util.spec_from_loader("release_sigstore", loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


#: What the release's jobs pip-install (syft, build, setuptools, twine, their dependencies),
#: every file pinned by hash.
RELEASE_TOOLS = ROOT / "requirements" / "release.txt"


def release_wheels() -> Path:
    """requirements/release.txt's wheels (syft's holds its binary), downloaded once per pin
    into the user's cache (tests/usercache.py): a job's own `pip install --require-hashes`
    takes them from there (PIP_FIND_LINKS, PIP_NO_INDEX), checking the same hashes, instead
    of from PyPI on every run."""
    key = "release-" + hashlib.sha256(RELEASE_TOOLS.read_bytes()).hexdigest()[:12]

    def download(work: Path) -> None:
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check",
             "--require-hashes", "--no-deps", "--only-binary=:all:", "-d", str(work),
             "-r", str(RELEASE_TOOLS)],
            check=True, timeout=600,
        )  # fmt: skip

    return usercache.entry("wheels", key, download)
