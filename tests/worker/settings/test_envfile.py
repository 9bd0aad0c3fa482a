"""/etc/inject/env is read as data, never executed; the environment always wins.

The file's writer is init-topology (another image, so no module can be shared): these tests
write with its envfile module, the one the init container runs."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from elastic_worker.settings import envfile
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from init_topology import envfile as writer


def test_parse_reads_each_contract_line() -> None:
    text = "ZONE='europe-west4-a'\nNCCL_IB_HCA='mlx5_0,mlx5_1'\nEMPTY=''\n"
    assert envfile.parse(text) == {
        "ZONE": "europe-west4-a",
        "NCCL_IB_HCA": "mlx5_0,mlx5_1",
        "EMPTY": "",
    }


def test_parse_undoes_the_quote_escape_and_keeps_newlines_inside_quotes() -> None:
    value = "it's\na 'quoted'\n\nvalue"
    text = writer.render({"A": value, "B": "x"}).decode()
    assert envfile.parse(text) == {"A": value, "B": "x"}


def test_parse_never_expands_or_executes(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    text = f"X='$(touch {marker})'\nY='`id`'\nZ='${{HOME}}'\n"
    assert envfile.parse(text) == {"X": f"$(touch {marker})", "Y": "`id`", "Z": "${HOME}"}
    assert not marker.exists()


def test_a_later_key_overrides_an_earlier_one() -> None:
    assert envfile.parse("A='1'\nA='2'\n") == {"A": "2"}


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("A=1\n", "single-quoted"),
        ("export A='1'\n", "expected KEY='value'"),
        ("a='1'\n", "expected KEY='value'"),
        ("A='1' # comment\n", "outside quotes"),
        ("A='1'; rm -rf /\n", "outside quotes"),
        ("A='unterminated\n", "unterminated quote"),
        ('A="1"\n', "outside quotes"),
        ("A='1'\n$(id)\n", ":2:"),
        ("A='x\0y'\n", "NUL"),
        ("=x\n", "expected KEY='value'"),
    ],
)
def test_parse_rejects_what_the_contract_does_not_allow(text: str, needle: str) -> None:
    with pytest.raises(envfile.EnvFileError, match=None) as info:
        envfile.parse(text, source="env")
    assert needle in str(info.value)


def test_merge_never_overrides_a_variable_already_set() -> None:
    environ = {"ZONE": "from-pod-spec"}
    applied = envfile.merge({"ZONE": "from-file", "REGION": "eu"}, environ)
    assert environ == {"ZONE": "from-pod-spec", "REGION": "eu"}
    assert applied == ["REGION"]


def test_a_missing_file_is_empty(tmp_path: Path) -> None:
    assert envfile.read(tmp_path / "absent") == {}


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(value=st.binary(max_size=40).filter(lambda b: b"\0" not in b))
def test_parse_agrees_with_posix_sh_for_any_bytes(tmp_path: Path, value: bytes) -> None:
    """The contract's test: sourcing the file with sh gives back the bytes written."""
    path = tmp_path / "env"
    path.write_bytes(b"V='" + value.replace(b"'", b"'\\''") + b"'\nW='end'\n")
    from_sh = subprocess.run(
        ["sh", "-c", '. "$1"; printf %s "$V"', "sh", str(path)],
        capture_output=True,
        check=True,
        env={},
    ).stdout
    parsed = envfile.read(path)
    assert parsed["V"].encode("utf-8", "surrogateescape") == from_sh == value
    assert parsed["W"] == "end"


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    variables=st.dictionaries(
        st.from_regex(r"[A-Z_][A-Z0-9_]{0,20}", fullmatch=True),
        st.text(alphabet=st.characters(codec="utf-8", exclude_characters="\x00"), max_size=80),
        max_size=6,
    )
)
@example(variables={"A": "'", "B": "''''", "C": "\n", "D": "\\'", "E": "'\\''", "F": "\r\n"})
def test_the_worker_reads_back_exactly_what_init_topology_writes(
    tmp_path: Path, variables: dict[str, str]
) -> None:
    """The two halves of the /etc/inject/env contract, each image's own code."""
    path = tmp_path / "env"
    writer.write_env_file(path, variables)
    assert envfile.read(path) == variables
