"""The /etc/inject/env file: one `KEY='value'` per line, written atomically.

Contract (docs/contracts.md): KEY matches `[A-Z_][A-Z0-9_]*`, the value
is single-quoted with each `'` written as `'\\''`, nothing else is in the file. Inside single
quotes POSIX `sh` expands nothing (no `$( )`, backticks, `$VAR` or backslash escapes), and a
newline is an ordinary character, so sourcing the file gives back exactly the bytes written.

Any Python str round-trips except one holding NUL (no C string, hence no environment
variable, can hold it) or a lone surrogate (not encodable as UTF-8): both are refused with
ValueError. Kubernetes itself never produces either in a label value.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import tempfile
from collections.abc import Mapping
from pathlib import Path

log = logging.getLogger(__name__)

KEY_PATTERN = re.compile(r"[A-Z_][A-Z0-9_]*\Z")
#: Mode of the written file: the worker container may run as another user than init.
FILE_MODE = 0o644


def valid_key(key: str) -> bool:
    return KEY_PATTERN.match(key) is not None


def check_value(value: str) -> None:
    """Raise ValueError unless `value` can be written and read back unchanged."""
    if "\x00" in value:
        raise ValueError("contains NUL, which no environment variable can hold")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(f"is not valid Unicode text ({exc.reason})") from None


def quote(value: str) -> str:
    """`value` as one POSIX sh single-quoted word."""
    check_value(value)
    return "'" + value.replace("'", "'\\''") + "'"


def render(variables: Mapping[str, str]) -> bytes:
    """The file's bytes; ValueError naming the key if a key or value cannot be written."""
    lines = []
    for key, value in variables.items():
        if not valid_key(key):
            raise ValueError(f"{key!r} is not a valid variable name ([A-Z_][A-Z0-9_]*)")
        try:
            lines.append(f"{key}={quote(value)}\n")
        except ValueError as exc:
            raise ValueError(f"the value of {key} {exc}") from None
    return "".join(lines).encode("utf-8")


def write_env_file(path: Path, variables: Mapping[str, str]) -> None:
    """Write `variables` to `path` atomically: temp file in the same dir, fsync, rename.

    Readers see the old file or the complete new one, never a part. On any failure the temp
    file is removed and `path` is left as it was.
    """
    data = render(variables)  # fails before anything touches the disk
    directory = path.parent
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=directory)
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        tmp.chmod(FILE_MODE)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        raise
    _fsync_dir(directory)


def _fsync_dir(directory: Path) -> None:
    """Make the rename durable; some filesystems cannot fsync a directory, which is fine."""
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError as exc:
        log.debug("fsync of %s: %s", directory, exc)
    finally:
        os.close(fd)
