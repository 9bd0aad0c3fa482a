"""Mountpoints on the host: the directories the containers' volumes are mounted onto."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from collections.abc import Callable
from pathlib import Path

from localrun.host.network import STATE_DIR


class Mountpoints:
    """Directories on the host to mount onto, shared with concurrent runs and other tools.

    A mountpoint like /etc/inject must exist on the host for a bind mount in a private
    mount namespace, and must stay there while any pod uses it: removing it on the host
    (as another tool cleaning up its own would) detaches the mounts in every namespace. So
    each run keeps a file `.elastic-local-keep-<pid>` in each mountpoint it created or found
    empty (hidden under the bind mount, it makes rmdir fail), and the runs note in
    /run/elastic-local which directories a run created. The last run to leave removes them."""

    KEEP = ".elastic-local-keep-"

    def __init__(self) -> None:
        self.held: list[str] = []

    def _update(self, fn: Callable[[dict[str, list[str]]], None]) -> None:
        STATE_DIR.mkdir(parents=True, exist_ok=True)
        with open(STATE_DIR / "mountpoints.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            path = STATE_DIR / "mountpoints.json"
            try:
                state = json.loads(path.read_text())
            except (OSError, ValueError):
                state = {}
            fn(state)
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps(state))
            tmp.replace(path)

    def ensure(self, target: str) -> None:
        keeper = Path(target) / f"{self.KEEP}{os.getpid()}"
        if target in self.held and keeper.exists():
            return

        def add(state: dict[str, list[str]]) -> None:
            created = []
            p = Path(target)
            while not p.exists():
                created.append(str(p))
                p = p.parent
            Path(target).mkdir(parents=True, exist_ok=True)
            if created:
                state[target] = sorted(set(state.get(target, [])) | set(created), key=len)[::-1]
            if target in state or not any(Path(target).iterdir()):
                keeper.touch()

        self._update(add)
        if target not in self.held:
            self.held.append(target)

    def release_all(self) -> None:
        if not self.held:
            return

        def drop(state: dict[str, list[str]]) -> None:
            for target in self.held:
                with contextlib.suppress(OSError):
                    (Path(target) / f"{self.KEEP}{os.getpid()}").unlink()
                d = Path(target)
                others = []
                with contextlib.suppress(OSError):
                    for f in d.iterdir():
                        if f.name.startswith(self.KEEP):
                            pid = f.name[len(self.KEEP) :]
                            if pid.isdigit() and _alive(int(pid)):
                                others.append(f)
                            else:
                                f.unlink(missing_ok=True)  # left by a run that was killed
                if others or target not in state:
                    continue
                for created in state.pop(target):  # deepest first
                    with contextlib.suppress(OSError):
                        os.rmdir(created)

        self._update(drop)
        self.held.clear()


def _alive(pid: object) -> bool:
    if not isinstance(pid, int):
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
