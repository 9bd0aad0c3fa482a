"""The extended key usages of the worker's own client certificate, read from its PEM file.

etcd refuses a client certificate whose chain names extended key usages without client
authentication ("certificate specifies an incompatible key usage" in its log) with the same
TLS alert as several other causes (bad_certificate), so the worker reads its certificate to
name that cause. The standard library parses no certificate extensions: this is a minimal
DER reader for exactly that one (RFC 5280, 4.2.1.12).
"""

from __future__ import annotations

import re
import ssl
from pathlib import Path

CLIENT_AUTH = "1.3.6.1.5.5.7.3.2"
ANY_USAGE = "2.5.29.37.0"
_EXT_KEY_USAGE = "2.5.29.37"
#: Names of the usages a certificate is likely to hold, as openssl and cert-manager say them.
NAMES = {
    "1.3.6.1.5.5.7.3.1": "serverAuth",
    CLIENT_AUTH: "clientAuth",
    "1.3.6.1.5.5.7.3.3": "codeSigning",
    "1.3.6.1.5.5.7.3.4": "emailProtection",
    "1.3.6.1.5.5.7.3.8": "timeStamping",
    "1.3.6.1.5.5.7.3.9": "OCSPSigning",
    ANY_USAGE: "anyExtendedKeyUsage",
}
_PEM = re.compile(r"-----BEGIN CERTIFICATE-----.+?-----END CERTIFICATE-----", re.DOTALL)
_SEQUENCE, _OID, _OCTETS, _EXTENSIONS = 0x30, 0x06, 0x04, 0xA3


def _element(der: bytes, pos: int) -> tuple[int, int, int]:
    """(tag, start, end) of the DER element at `pos`; ValueError when it does not fit."""
    if pos + 2 > len(der):
        raise ValueError("truncated DER")
    tag, length, pos = der[pos], der[pos + 1], pos + 2
    if length & 0x80:
        size = length & 0x7F
        if not 0 < size <= 4:
            raise ValueError("unsupported DER length")
        length, pos = int.from_bytes(der[pos : pos + size], "big"), pos + size
    if pos + length > len(der):
        raise ValueError("truncated DER")
    return tag, pos, pos + length


def _children(der: bytes, start: int, end: int) -> list[tuple[int, int, int]]:
    out = []
    while start < end:
        tag, body, start = _element(der, start)
        out.append((tag, body, start))
    return out


def _oid(body: bytes) -> str:
    parts, value = [], 0
    for byte in body:
        value = (value << 7) | (byte & 0x7F)
        if not byte & 0x80:
            parts.append(value)
            value = 0
    first = min(parts[0] // 40, 2)
    return ".".join(str(p) for p in (first, parts[0] - 40 * first, *parts[1:]))


def extended_key_usages(der: bytes) -> tuple[str, ...] | None:
    """The certificate's extended key usages as dotted OIDs; None without the extension
    (the certificate may then be used for anything)."""
    tag, start, end = _element(der, 0)
    tbs = _children(der, start, end)[0]
    if tag != _SEQUENCE or tbs[0] != _SEQUENCE:
        raise ValueError("not a certificate")
    for tag, field_start, field_end in _children(der, tbs[1], tbs[2]):
        if tag != _EXTENSIONS:
            continue
        (_, start, end), *_ = _children(der, field_start, field_end)
        for _, ext_start, ext_end in _children(der, start, end):
            fields = _children(der, ext_start, ext_end)
            if fields[0][0] != _OID or _oid(der[fields[0][1] : fields[0][2]]) != _EXT_KEY_USAGE:
                continue
            value_start = fields[-1][1]  # the OCTET STRING, after the optional `critical`
            _, seq_start, seq_end = _element(der, value_start)
            usages = _children(der, seq_start, seq_end)
            return tuple(_oid(der[s:e]) for t, s, e in usages if t == _OID)
    return None


def refused_usages(path: Path) -> tuple[int, tuple[str, ...]] | None:
    """The first certificate of the PEM file at `path` (0: the leaf, then its
    intermediates) whose extended key usages exclude client authentication, with them;
    None when every one allows it. OSError or ValueError when the file cannot be read."""
    blocks = _PEM.findall(path.read_text())
    if not blocks:
        raise ValueError(f"{path} holds no PEM certificate")
    for index, block in enumerate(blocks):
        usages = extended_key_usages(ssl.PEM_cert_to_DER_cert(block))
        if usages is not None and not {CLIENT_AUTH, ANY_USAGE} & set(usages):
            return index, usages
    return None


def describe(usages: tuple[str, ...]) -> str:
    return ", ".join(NAMES.get(u, u) for u in usages) or "none"
