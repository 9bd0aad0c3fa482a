"""A small cert-manager controller: each cert-manager.io Certificate becomes the Secret its
`spec.secretName` names (type kubernetes.io/tls: tls.crt, tls.key, ca.crt), signed by a CA
made per run with the openssl CLI, as a CA issuer would. The certificate carries the
Certificate's commonName, dnsNames and ipAddresses as SANs and its usages as extended key
usages; the issuerRef is not looked at (every Certificate has the run's CA)."""

from __future__ import annotations

import base64
import ipaddress
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

Obj = dict[str, Any]

GROUP = "cert-manager.io"
_EKU = {"server auth": "serverAuth", "client auth": "clientAuth"}


class CertificateError(Exception):
    pass


def is_certificate(obj: Obj) -> bool:
    api = str(obj.get("apiVersion", ""))
    return obj.get("kind") == "Certificate" and api.partition("/")[0] == GROUP


def _openssl(cwd: Path, *args: str) -> None:
    try:
        subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)
    except FileNotFoundError:
        raise CertificateError("openssl is not installed: it issues the TLS Secrets") from None
    except subprocess.CalledProcessError as exc:
        err = exc.stderr.decode(errors="replace").strip()
        raise CertificateError(f"openssl {args[0]} failed: {err}") from None


_EC = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")


@dataclass(frozen=True)
class KeyPair:
    crt: Path
    key: Path


class CertificateAuthority:
    """The run's CA (ca.crt, ca.key under `directory`), made once."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self.dir.mkdir(parents=True, exist_ok=True)
        self.crt = self.dir / "ca.crt"
        subj = "/CN=elastic-local run CA"
        _openssl(self.dir, "req", "-x509", *_EC, "-keyout", "ca.key", "-out", "ca.crt",
                 "-days", "2", "-subj", subj)  # fmt: skip

    def sign(self, name: str, common_name: str, sans: list[str], usages: list[str]) -> KeyPair:
        """A key and a certificate `name`.crt/.key signed by the CA."""
        ext = ["basicConstraints=CA:FALSE"]
        if sans:
            ext.append("subjectAltName=" + ",".join(sans))
        eku = [_EKU[u] for u in usages if u in _EKU]
        if eku:
            ext.append("extendedKeyUsage=" + ",".join(eku))
        (self.dir / f"{name}.ext").write_text("\n".join(ext) + "\n")
        cn = "/CN=" + (common_name or name).replace("/", "\\/")
        _openssl(self.dir, "req", "-new", *_EC, "-keyout", f"{name}.key", "-out", f"{name}.csr",
                 "-subj", cn)  # fmt: skip
        _openssl(self.dir, "x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey",
                 "ca.key", "-CAcreateserial", "-days", "2", "-extfile", f"{name}.ext",
                 "-out", f"{name}.crt")  # fmt: skip
        return KeyPair(self.dir / f"{name}.crt", self.dir / f"{name}.key")


def _sans(cert: Obj) -> list[str]:
    spec = cert.get("spec") or {}
    out = [f"DNS:{d}" for d in spec.get("dnsNames") or []]
    for ip in spec.get("ipAddresses") or []:
        try:
            ipaddress.ip_address(ip)
        except ValueError:
            name = cert.get("metadata", {}).get("name", "")
            raise CertificateError(
                f"Certificate {name!r}: ipAddresses entry {ip!r} is not an IP address"
            ) from None
        out.append(f"IP:{ip}")
    return out


def issue(ca: CertificateAuthority, cert: Obj) -> Obj:
    """The Secret cert-manager would write for one Certificate."""
    meta = cert.get("metadata") or {}
    spec = cert.get("spec") or {}
    name, secret = meta.get("name", ""), spec.get("secretName", "")
    if not secret:
        raise CertificateError(f"Certificate {name!r} has no spec.secretName")
    usages = spec.get("usages") or []
    pair = ca.sign(f"cert-{name}", spec.get("commonName", ""), _sans(cert), usages)
    files = {"tls.crt": pair.crt, "tls.key": pair.key, "ca.crt": ca.crt}
    data = {k: base64.b64encode(p.read_bytes()).decode() for k, p in files.items()}
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "kubernetes.io/tls",
        "metadata": {"name": secret, "namespace": meta.get("namespace", "")},
        "data": data,
    }


def issue_all(ca: CertificateAuthority, certificates: list[Obj]) -> dict[str, Obj]:
    """Secrets by name, one per Certificate."""
    out: dict[str, Obj] = {}
    for cert in certificates:
        s = issue(ca, cert)
        out[s["metadata"]["name"]] = s
    return out
