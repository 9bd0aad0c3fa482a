"""Read /etc/inject/env without executing it.

The contract (docs/contracts.md): one `KEY='value'` per line, KEY matching
`[A-Z_][A-Z0-9_]*`, the value single-quoted with `'` written as `'\\''`; nothing else.
A value may hold any byte but NUL, newlines included (inside the quotes), so the file
is scanned as a stream of quoted segments, the way POSIX `sh` reads it, not split on
lines. Anything outside the contract is an error naming the line; nothing is evaluated.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping, MutableMapping
from pathlib import Path

logger = logging.getLogger(__name__)

_KEY = re.compile(r"[A-Z_][A-Z0-9_]*")


class EnvFileError(ValueError):
    """The file breaks the KEY='value' contract."""


def parse(text: str, source: str = "env file") -> dict[str, str]:
    """Parse the contract's text into a dict; a later key overrides an earlier one."""
    values: dict[str, str] = {}
    pos, line = 0, 1
    end = len(text)
    while pos < end:
        if text[pos] == "\n":
            pos, line = pos + 1, line + 1
            continue
        match = _KEY.match(text, pos)
        if match is None or match.end() >= end or text[match.end()] != "=":
            snippet = text[pos : text.find("\n", pos) if "\n" in text[pos:] else end][:40]
            raise EnvFileError(f"{source}:{line}: expected KEY='value', found {snippet!r}")
        key, start_line = match.group(), line
        pos = match.end() + 1
        parts: list[str] = []
        while pos < end and text[pos] != "\n":
            if text[pos] == "'":
                close = text.find("'", pos + 1)
                if close < 0:
                    raise EnvFileError(f"{source}:{start_line}: {key}: unterminated quote")
                segment = text[pos + 1 : close]
                line += segment.count("\n")
                parts.append(segment)
                pos = close + 1
            elif text.startswith("\\'", pos):
                parts.append("'")
                pos += 2
            else:
                raise EnvFileError(
                    f"{source}:{line}: {key}: unexpected {text[pos]!r} outside quotes "
                    "(values must be single-quoted)"
                )
        if not parts:
            raise EnvFileError(f"{source}:{start_line}: {key}: value must be single-quoted")
        value = "".join(parts)
        if "\0" in value:
            raise EnvFileError(f"{source}:{start_line}: {key}: value holds a NUL byte")
        values[key] = value
    return values


def read(path: Path) -> dict[str, str]:
    """Parse the file at `path`; a missing file is an empty mapping (logged once)."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        logger.info("%s does not exist: no injected topology variables", path)
        return {}
    # surrogateescape keeps arbitrary label bytes round-trippable into os.environ.
    return parse(raw.decode("utf-8", errors="surrogateescape"), source=str(path))


def merge(values: Mapping[str, str], environ: MutableMapping[str, str]) -> list[str]:
    """Set each key absent from `environ`; a variable already set always wins.

    Returns the keys that were set.
    """
    applied = []
    for key, value in values.items():
        if key not in environ:
            environ[key] = value
            applied.append(key)
    return applied
