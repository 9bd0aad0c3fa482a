"""A real etcd serving HTTPS (server TLS, or mutual TLS), with a CA made per test session
by the openssl CLI, and the worker settings the chart renders for it."""

from __future__ import annotations

import shutil
import ssl
import subprocess
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest
from testlib import EtcdServer, etcd_binary, etcd_command, free_port


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def _key_and_csr(cwd: Path, name: str, cn: str) -> None:
    _openssl(
        "req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
        "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={cn}",
        cwd=cwd,
    )  # fmt: skip


def _sign(cwd: Path, name: str, ca: str, extensions: str) -> None:
    (cwd / f"{name}.ext").write_text(extensions)
    _openssl(
        "x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.crt", "-CAkey", f"{ca}.key",
        "-CAcreateserial", "-days", "2", "-extfile", f"{name}.ext", "-out", f"{name}.crt",
        cwd=cwd,
    )  # fmt: skip


def _ca(cwd: Path, name: str) -> None:
    _openssl(
        "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
        "-keyout", f"{name}.key", "-out", f"{name}.crt", "-days", "2", "-subj", f"/CN={name}",
        cwd=cwd,
    )  # fmt: skip


@dataclass(frozen=True)
class Pki:
    """Files of a CA, etcd's server certificate, a client certificate it signed, one it
    signed for server authentication only (`server-usage-client`), and a second CA
    (`rogue`) with a client certificate of its own."""

    dir: Path

    def path(self, name: str) -> str:
        return str(self.dir / name)

    def mount(self, dest: Path, *, ca: str, client: str | None) -> None:
        """Lay out files as the chart's Secret volumes hold them: ca.crt; tls.crt, tls.key."""
        dest.mkdir(parents=True, exist_ok=True)
        shutil.copy(self.dir / f"{ca}.crt", dest / "ca.crt")
        if client is not None:
            shutil.copy(self.dir / f"{client}.crt", dest / "tls.crt")
            shutil.copy(self.dir / f"{client}.key", dest / "tls.key")


def make_pki(cwd: Path) -> Pki:
    cwd.mkdir(parents=True, exist_ok=True)
    _ca(cwd, "ca")
    _ca(cwd, "rogue")
    _key_and_csr(cwd, "server", "etcd")
    _sign(
        cwd,
        "server",
        "ca",
        "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n",
    )
    for name, ca in (("client", "ca"), ("rogue-client", "rogue")):
        _key_and_csr(cwd, name, "elastic-worker")
        _sign(cwd, name, ca, "extendedKeyUsage=clientAuth\n")
    # Signed by the right CA, but for servers only: etcd refuses it ("certificate
    # specifies an incompatible key usage" in its log).
    _key_and_csr(cwd, "server-usage-client", "elastic-worker")
    _sign(cwd, "server-usage-client", "ca", "extendedKeyUsage=serverAuth\n")
    return Pki(cwd)


# Where charts/etcd-rendezvous mounts its Secret -> the file of this PKI.
_CHART_TLS_FILES = {
    "/etc/etcd/tls/tls.crt": "server.crt",
    "/etc/etcd/tls/tls.key": "server.key",
    "/etc/etcd/tls/ca.crt": "ca.crt",
}


def tls_flags(rendered: list[str], pki: Pki) -> list[str]:
    """The TLS flags of a rendered etcd command, pointed at this PKI's files."""
    out = []
    for flag in rendered:
        name, _, value = flag.partition("=")
        if name not in {"--cert-file", "--key-file", "--trusted-ca-file", "--client-cert-auth"}:
            continue
        file = _CHART_TLS_FILES.get(value)
        out.append(f"{name}={pki.path(file)}" if file else flag)
    return out


def start_tls_etcd(data_dir: Path, pki: Pki, flags: list[str], version: str = "3.4") -> EtcdServer:
    """etcd serving HTTPS only on its client port, with the TLS `flags` (tls_flags); its
    log is `<data_dir>.log`."""
    etcd = etcd_binary(version)
    client, peer = free_port(), free_port()
    cmd = etcd_command(etcd, data_dir, "127.0.0.1", client, peer, v2=True, scheme="https")
    cmd += flags
    log = open(data_dir.parent / f"{data_dir.name}.log", "wb")  # noqa: SIM115 - outlives this call
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    server = EtcdServer(f"127.0.0.1:{client}", data_dir, proc, v2=True)
    context = ssl.create_default_context(cafile=pki.path("ca.crt"))
    context.load_cert_chain(pki.path("client.crt"), pki.path("client.key"))
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"etcd exited with {proc.returncode}; see {log.name}")
        try:
            url = f"https://{server.endpoint}/health"
            with urllib.request.urlopen(url, timeout=1, context=context) as resp:
                if resp.status == 200:
                    return server
        except OSError:
            time.sleep(0.1)
    server.stop()
    pytest.fail("etcd (TLS) did not answer /health within 20 s")
