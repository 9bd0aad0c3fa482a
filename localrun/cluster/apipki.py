"""The fake API server's files: its certificate chain, made with the `openssl` CLI (a
cluster CA, `ca.crt` as the kubelet mounts it, and a serving certificate whose SANs hold
the listen IP, 127.0.0.1, the extra IPs and the `kubernetes.default.svc` names), and the
service-account directory a pod mounts (token, ca.crt, namespace)."""

from __future__ import annotations

import ipaddress
import secrets
import shutil
import subprocess
from collections.abc import Iterable
from pathlib import Path


def make_certificates(pki: Path, host: str, extra_ips: Iterable[str]) -> None:
    """ca.crt/ca.key and apiserver.crt/apiserver.key in `pki`."""
    pki.mkdir(parents=True, exist_ok=True)
    ips = {"127.0.0.1", *extra_ips}
    if host not in ("0.0.0.0", "::"):
        ips.add(host)
    dns = ["kubernetes", "kubernetes.default", "kubernetes.default.svc"]
    dns += ["kubernetes.default.svc.cluster.local", "localhost"]
    sans = [f"DNS:{d}" for d in dns] + [f"IP:{ipaddress.ip_address(i)}" for i in sorted(ips)]
    (pki / "apiserver.ext").write_text(
        "basicConstraints=critical,CA:FALSE\n"
        "keyUsage=critical,digitalSignature,keyEncipherment\n"
        "extendedKeyUsage=serverAuth\n"
        f"subjectAltName={','.join(sans)}\n",
        encoding="utf-8",
    )
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    steps = [
        ["req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.crt", "-days", "3650",
         "-subj", "/CN=kubernetes", "-addext", "basicConstraints=critical,CA:TRUE",
         "-addext", "keyUsage=critical,digitalSignature,keyCertSign,cRLSign"],
        ["req", "-new", *ec, "-keyout", "apiserver.key", "-out", "apiserver.csr",
         "-subj", "/CN=kube-apiserver"],
        ["x509", "-req", "-in", "apiserver.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
         "-set_serial", str(int.from_bytes(secrets.token_bytes(8), "big")), "-days", "365",
         "-extfile", "apiserver.ext", "-out", "apiserver.crt"],
    ]  # fmt: skip
    for step in steps:
        done = subprocess.run(
            ["openssl", *step], cwd=pki, capture_output=True, text=True, check=False
        )
        if done.returncode != 0:
            raise RuntimeError(f"openssl {step[0]} failed: {done.stderr.strip()}")


def write_serviceaccount(directory: Path, ca: Path, token: str, namespace: str) -> None:
    """token, ca.crt and namespace as the kubelet writes them into a pod."""
    directory.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(ca, directory / "ca.crt")
    # The kubelet writes both without a trailing newline.
    (directory / "token").write_text(token, encoding="utf-8")
    (directory / "namespace").write_text(namespace, encoding="utf-8")
    for item in directory.iterdir():
        item.chmod(0o644)
