"""The /etc/inject/env contract: what POSIX sh reads back is exactly what was written,
nothing in a value is ever executed, and the file is replaced atomically.

Which values: any Python str without NUL (no environment variable or sh word can hold it)
and without lone surrogates (not UTF-8; the API server's JSON never carries them). Real
label values are far tamer (63 characters of [A-Za-z0-9._-]), but the file must not depend
on the API server's validation: labels come from many hands and the label map takes any key.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from init_topology import envfile
from init_topology.config import load_config
from init_topology.envfile import quote, render, write_env_file
from init_topology.mapping import build_variables
from topology_helpers import SH, read_env_file, source_env_file

LINE = re.compile(rb"[A-Z_][A-Z0-9_]*='([^']|'\\'')*'\n", re.DOTALL)

# Payloads a hostile or careless label could hold; {marker} is a file that must never appear.
PAYLOADS = [
    "$(touch {marker})",
    "`touch {marker}`",
    "'; touch {marker}; '",
    "'$(touch {marker})'",
    "\\'; touch {marker} #",
    "\n touch {marker}\n",
    "${{x:=$(touch {marker})}}",
    "$((1+1))$HOME$1$@$*$$!",
    "\\\\'\\\\\"\\n",
    "' && touch {marker} && echo '",
]

values = st.text(
    alphabet=st.characters(codec="utf-8", exclude_characters="\x00"),
    max_size=200,
)
label_like = st.text(
    alphabet=st.sampled_from("abcXYZ019-_.'\"$`\\() \n\t;|&<>*?~#!{}[]é✓𝄞"),
    min_size=0,
    max_size=63,
)


def names(n: int) -> list[str]:
    return [f"V{i}" for i in range(n)]


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    raw=st.lists(st.one_of(values, label_like, st.sampled_from(PAYLOADS)), min_size=1, max_size=8)
)
@example(raw=["a" * 63, "", "'", "''''", "\n", "\n\n", "é" * 63, "-" * 63])
@example(raw=["\r\n", "\\", "\\\\'", "$", "'\\''", " leading and trailing ", "\t"])
def test_values_round_trip_through_the_file_and_sh_and_nothing_executes(
    raw: list[str], tmp_path: Path
) -> None:
    marker = tmp_path / "executed"
    vals = [v.replace("{marker}", str(marker)) for v in raw]
    variables = dict(zip(names(len(vals)), vals, strict=True))
    path = tmp_path / "env"
    write_env_file(path, variables)
    data = path.read_bytes()
    # Nothing but KEY='value' lines.
    assert LINE.sub(b"", data) == b""
    assert source_env_file(path, list(variables)) == variables
    assert not marker.exists()


def test_single_quote_is_written_as_quote_backslash_quote_quote() -> None:
    assert quote("it's") == "'it'\\''s'"
    assert render({"A": "x", "B_2": "it's"}) == b"A='x'\nB_2='it'\\''s'\n"


@pytest.mark.parametrize("key", ["lower", "1ABC", "A-B", "A.B", "", "Ä", "A B", "A\nB"])
def test_invalid_keys_are_refused_before_anything_is_written(key: str, tmp_path: Path) -> None:
    path = tmp_path / "env"
    with pytest.raises(ValueError, match="not a valid variable name"):
        write_env_file(path, {"OK": "1", key: "x"})
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("value", ["a\x00b", "\ud800"])
def test_values_no_shell_can_hold_are_refused(value: str, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="the value of BAD"):
        write_env_file(tmp_path / "env", {"BAD": value})
    assert list(tmp_path.iterdir()) == []


def test_the_file_is_readable_by_the_worker_user(tmp_path: Path) -> None:
    path = tmp_path / "env"
    write_env_file(path, {"A": "1"})
    assert path.stat().st_mode & 0o777 == 0o644


@pytest.mark.parametrize("failing", ["fsync", "replace", "write"])
def test_a_failed_write_leaves_the_old_file_and_no_temp_file(
    failing: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "env"
    write_env_file(path, {"OLD": "1"})
    before = path.read_bytes()

    def boom(*args: object, **kwargs: object) -> None:
        raise OSError(28, "No space left on device")

    if failing == "write":
        real_fdopen = os.fdopen

        class Half:
            def __init__(self, fd: int, mode: str) -> None:
                self.fh = real_fdopen(fd, mode)

            def __enter__(self) -> Half:
                return self

            def __exit__(self, *exc: object) -> None:
                self.fh.close()

            def write(self, data: bytes) -> None:
                self.fh.write(data[: len(data) // 2])
                self.fh.flush()
                raise OSError(28, "No space left on device")

        monkeypatch.setattr(envfile.os, "fdopen", Half)
    else:
        monkeypatch.setattr(envfile.os, failing, boom)
    with pytest.raises(OSError, match="No space left"):
        write_env_file(path, {"NEW": "2" * 10_000})
    monkeypatch.undo()
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["env"]


def test_readers_never_see_a_partial_file(tmp_path: Path) -> None:
    """A reader racing many rewrites sees either the old or the new file, whole."""
    path = tmp_path / "env"
    small = {"A": "x"}
    big = {f"K{i}": "y" * 500 for i in range(200)}
    write_env_file(path, small)
    reader = subprocess.Popen(
        [
            SH,
            "-c",
            'i=0; while [ $i -lt 300 ]; do cat "$1"; printf "\\0"; i=$((i+1)); done',
            "sh",
            str(path),
        ],
        stdout=subprocess.PIPE,
    )
    for i in range(200):
        write_env_file(path, big if i % 2 else small)
    out, _ = reader.communicate(timeout=60)
    whole = {render(small), render(big)}
    assert {chunk for chunk in out.split(b"\0")[:-1]} <= whole


def test_read_env_file_helper_reads_every_key(tmp_path: Path) -> None:
    path = tmp_path / "env"
    write_env_file(path, {"A": "1", "B_C": "two\nlines"})
    assert read_env_file(path) == {"A": "1", "B_C": "two\nlines"}


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(value=st.one_of(values, label_like, st.sampled_from(PAYLOADS)))
def test_label_values_round_trip_through_the_label_map_and_the_file(
    value: str, tmp_path: Path
) -> None:
    marker = tmp_path / "executed"
    value = value.replace("{marker}", str(marker))
    node = {"metadata": {"labels": {"example.com/v": value}}, "spec": {}, "status": {}}
    config = load_config({"NODE_NAME": "n", "TOPOLOGY_LABEL_MAP": '{"NODE_V": ["example.com/v"]}'})
    variables = build_variables(config, node)
    path = tmp_path / "env"
    write_env_file(path, variables)
    assert read_env_file(path) == variables
    assert variables["NODE_V"] == value
    assert not marker.exists()
