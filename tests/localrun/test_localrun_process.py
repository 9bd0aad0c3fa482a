"""The container launch command: namespaces, bind mounts, exit codes."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from localrun import process
from localrun.process import BindMount, container_argv, exit_code, launch_script


def test_script_mounts_each_volume_then_execs_the_command() -> None:
    script = launch_script(
        [
            BindMount("/tmp/pod/inject", "/etc/inject", read_only=True),
            BindMount("", "/dev/shm", tmpfs_size="67108864"),
        ],
        "demo-w-0",
        "",
    )
    lines = script.splitlines()
    assert lines[0] == "set -e"
    assert "mount --bind /tmp/pod/inject /etc/inject" in lines
    assert "mount -o remount,bind,ro /etc/inject" in lines
    assert "mount -t tmpfs -o size=67108864 tmpfs /dev/shm" in lines
    assert "hostname demo-w-0" in lines
    assert lines[-2:] == ["cd /", 'exec "$@"']


def test_argv_wraps_in_netns_and_private_namespaces() -> None:
    argv = container_argv(["ip", "netns", "exec", "ns1"], [], "p", "/w", ["etcd", "--name=a b"])
    assert argv[:4] == ["ip", "netns", "exec", "ns1"]
    for flag in ("--mount", "--pid", "--fork", "--kill-child", "--uts", "--mount-proc"):
        assert flag in argv
    assert argv[argv.index("--propagation") + 1] == "private"
    assert argv[-3:] == ["sh", "etcd", "--name=a b"]  # "$0" then the command, unquoted


def test_without_namespaces_the_command_runs_as_it_is() -> None:
    assert container_argv([], [BindMount("/a", "/b")], "p", "", ["x", "y"]) == ["x", "y"]


def test_script_keeps_arguments_intact_through_sh() -> None:
    script = launch_script([], "", "/tmp")
    out = subprocess.run(
        ["sh", "-c", script, "sh", "printf", "%s|", "a b", "$HOME", "'q'"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout == "a b|$HOME|'q'|"


def test_exit_codes_as_kubernetes_reports_them() -> None:
    assert exit_code(0) == 0
    assert exit_code(3) == 3
    assert exit_code(-9) == 137
    assert exit_code(-15) == 143


def test_mountpoints_are_kept_while_used_and_removed_by_the_last_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(process, "STATE_DIR", tmp_path / "state")
    target = tmp_path / "etc" / "inject"
    mp = process.Mountpoints()
    mp.ensure(str(target))
    assert target.is_dir()
    # another tool removing "its" directory cannot: the keeper file holds it
    with pytest.raises(OSError):
        target.rmdir()
    mp.release_all()
    assert not target.exists()
    assert not (tmp_path / "etc").exists()  # every directory the run created is gone


def test_existing_mountpoints_are_left_in_place(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(process, "STATE_DIR", tmp_path / "state")
    target = tmp_path / "shm"
    target.mkdir()
    (target / "data").write_text("x")
    mp = process.Mountpoints()
    mp.ensure(str(target))
    mp.release_all()
    assert (target / "data").read_text() == "x"
    assert [p.name for p in target.iterdir()] == ["data"]
