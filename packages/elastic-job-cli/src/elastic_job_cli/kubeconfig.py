"""kubeconfig files read as kubectl reads them (client-go's clientcmd loading rules), and
merged into the one dict the official client loads:

- `--kubeconfig FILE`: that file alone; it must exist.
- else `KUBECONFIG`, a list of paths (`:`-separated; `;` on Windows): paths that do not
  exist are skipped, a path given twice is read once, and the files are merged: the first
  file to name a cluster, user or context wins and keeps it whole (a later file's entry of
  the same name is ignored, not merged into it); `current-context` comes from the first
  file that sets one.
- else `~/.kube/config` when it exists.
- else no kubeconfig (the caller tries the in-cluster config).

A file reference in an entry (a cluster's `certificate-authority`, a user's
`client-certificate`, `client-key` or `tokenFile`, an exec plugin's command that holds a
slash) is relative to the file that holds the entry, as kubectl resolves it.

A file that is not YAML, or not shaped as a kubeconfig, is a KubeconfigError that names
the file and the entry (the command says it in one line, exit 2).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

Obj = dict[str, Any]

#: The named lists a kubeconfig holds, and the key of each entry's body.
SECTIONS = {"clusters": "cluster", "users": "user", "contexts": "context"}
#: File references relative to the kubeconfig that holds them (clientcmd ResolvePaths).
_FILE_KEYS = {
    "cluster": ("certificate-authority",),
    "user": ("client-certificate", "client-key", "tokenFile"),
}


class KubeconfigError(Exception):
    """A kubeconfig that cannot be used; the message names the file and what is wrong."""


@dataclass(frozen=True)
class Kubeconfig:
    """The merged configuration, the files it came from, and how the user named them."""

    config: Obj
    files: tuple[Path, ...]
    source: str  # for messages: "--kubeconfig F", "KUBECONFIG=a:b", "~/.kube/config"

    def context(self, name: str) -> Obj | None:
        """The body of context `name`, None if no file names it."""
        for entry in self.config["contexts"]:
            if entry["name"] == name:
                body: Obj = entry.get("context") or {}
                return body
        return None

    @property
    def context_names(self) -> list[str]:
        return [str(e["name"]) for e in self.config["contexts"]]


def find(explicit: str | None, env: str | None, home: Path) -> tuple[list[Path], str]:
    """The files to read, by kubectl's precedence, and how to name them in a message."""
    if explicit:
        path = Path(explicit).expanduser()
        if not path.is_file():
            raise KubeconfigError(f"--kubeconfig {explicit}: no such file")
        return [path], f"--kubeconfig {explicit}"
    if env:
        seen: list[Path] = []
        for part in filter(None, env.split(os.pathsep)):
            path = Path(part).expanduser()
            if path not in seen and path.is_file():
                seen.append(path)
        return seen, f"KUBECONFIG={env}"
    default = home / ".kube" / "config"
    return ([default] if default.is_file() else []), "~/.kube/config"


def _yaml(path: Path) -> Any:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise KubeconfigError(f"kubeconfig {path}: cannot read it ({exc})") from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        where = ""
        mark = getattr(exc, "problem_mark", None)
        if mark is not None:
            where = f" at line {mark.line + 1}, column {mark.column + 1}"
        problem = getattr(exc, "problem", None) or type(exc).__name__
        raise KubeconfigError(f"kubeconfig {path}: not valid YAML{where}: {problem}") from None


def read(path: Path) -> Obj:
    """One file, checked for the shape the merge and the client rely on; an empty file
    is an empty configuration (as kubectl takes it)."""
    data = _yaml(path)
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise KubeconfigError(
            f"kubeconfig {path}: a kubeconfig is a mapping (apiVersion, clusters, users, "
            f"contexts), not a {type(data).__name__}"
        )
    for section, body_key in SECTIONS.items():
        entries = data.get(section)
        if entries is None:
            continue
        if not isinstance(entries, list):
            raise KubeconfigError(f"kubeconfig {path}: {section} must be a list of entries")
        for i, entry in enumerate(entries):
            name = entry.get("name") if isinstance(entry, dict) else None
            if not isinstance(name, str) or not name:
                raise KubeconfigError(f"kubeconfig {path}: {section}[{i}] has no name")
            body = entry.get(body_key)
            if body is not None and not isinstance(body, dict):
                raise KubeconfigError(
                    f"kubeconfig {path}: {section}[{i}] ({name}): {body_key} must be a mapping"
                )
    current = data.get("current-context")
    if current is not None and not isinstance(current, str):
        raise KubeconfigError(f"kubeconfig {path}: current-context must be a context's name")
    return data


def _absolute(entry: Obj, body_key: str, base: Path) -> Obj:
    """The entry with its file references made absolute against `base` (its file's dir)."""
    body = dict(entry.get(body_key) or {})
    for key in _FILE_KEYS.get(body_key, ()):
        value = body.get(key)
        if isinstance(value, str) and value and not os.path.isabs(value):
            body[key] = str(base / value)
    exec_ = body.get("exec")
    if isinstance(exec_, dict):
        command = exec_.get("command")
        if isinstance(command, str) and "/" in command and not os.path.isabs(command):
            body["exec"] = {**exec_, "command": str(base / command)}
    return {**entry, body_key: body}


def merge(files: list[tuple[Path, Obj]]) -> Obj:
    """kubectl's merge: the first file to name an entry wins; the first current-context."""
    merged: Obj = {"apiVersion": "v1", "kind": "Config", "preferences": {}}
    for section in SECTIONS:
        merged[section] = []
    names: dict[str, set[str]] = {section: set() for section in SECTIONS}
    for path, data in files:
        for section, body_key in SECTIONS.items():
            for entry in data.get(section) or []:
                if entry["name"] in names[section]:
                    continue
                names[section].add(entry["name"])
                merged[section].append(_absolute(entry, body_key, path.parent.resolve()))
        if data.get("current-context") and "current-context" not in merged:
            merged["current-context"] = data["current-context"]
    return merged


def load(explicit: str | None, env: str | None, home: Path) -> Kubeconfig | None:
    """The merged kubeconfig, or None when there is no file to read."""
    paths, source = find(explicit, env, home)
    if not paths:
        return None
    return Kubeconfig(merge([(p, read(p)) for p in paths]), tuple(paths), source)
