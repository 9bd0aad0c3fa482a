"""Configuration: the container's environment, read once into a frozen Config.

Every setting comes from the environment the chart gives the init container
(docs/contracts.md, "the init container `init-topology`"). Bad values raise ConfigError with
one line that names the variable and says how to fix it; main turns it into exit code 2.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

#: Where the kubelet mounts the pod's service-account token, CA and namespace.
SERVICEACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
DEFAULT_OUTPUT = Path("/etc/inject/env")
DEFAULT_TIMEOUT_SECONDS = 10.0
MAX_TIMEOUT_SECONDS = 600.0

# Which variables a label map may write (TOPOLOGY_LABEL_MAP, values: topology.labelMap): a
# rule, not a list, since the names that change a shell's, an interpreter's or the loader's
# behaviour (BASH_ENV, PYTHONSTARTUP, LD_*, ...) cannot be listed exhaustively. The chart's
# values.schema.json states the same rule; a test checks they agree.
#: Whole-name syntax.
LABEL_MAP_NAME_PATTERN = r"^[A-Z][A-Z0-9_]*$"
#: A name starts with one of these: the families a node's fabric is tuned by.
LABEL_MAP_PREFIXES = ("NODE_", "NCCL_", "GLOO_", "FI_", "UCX_")
#: ... and contains none of these anywhere: they load code or change where it is loaded from
#: (NCCL_NET_PLUGIN, FI_PROVIDER_PATH, UCX_MODULE_DIR, NCCL_LIBDIR), or name a file that can
#: set such a variable in turn (NCCL_CONF_FILE) or that gets written (NCCL_DEBUG_FILE).
LABEL_MAP_FORBIDDEN_WORDS = ("PLUGIN", "PATH", "LIB", "PRELOAD", "DIR", "FILE", "CONF", "MODULE")
LABEL_MAP_RULE = (
    f"a variable name must match {LABEL_MAP_NAME_PATTERN}, start with "
    f"{', '.join(LABEL_MAP_PREFIXES[:-1])} or {LABEL_MAP_PREFIXES[-1]}, and not contain "
    f"{', '.join(LABEL_MAP_FORBIDDEN_WORDS[:-1])} or {LABEL_MAP_FORBIDDEN_WORDS[-1]}"
)
_LABEL_MAP_NAME = re.compile(LABEL_MAP_NAME_PATTERN.removesuffix("$") + r"\Z")


def label_map_name_allowed(name: str) -> bool:
    """Whether a label map may write the variable `name` (the rule above)."""
    return (
        _LABEL_MAP_NAME.match(name) is not None
        and name.startswith(LABEL_MAP_PREFIXES)
        and not any(word in name for word in LABEL_MAP_FORBIDDEN_WORDS)
    )


#: A Node's name is a DNS subdomain (RFC 1123), as the API server validates it.
_NODE_NAME = re.compile(
    r"(?=.{1,253}\Z)[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*\Z"
)

LabelMap = tuple[tuple[str, tuple[str, ...]], ...]


class ConfigError(Exception):
    """A setting the user controls is wrong; the message is one line saying what and how."""


@dataclass(frozen=True)
class Config:
    node_name: str
    output: Path
    #: variable name -> label keys, first present wins; in the order the user gave them.
    label_map: LabelMap
    strict: bool
    #: Total budget for all attempts to read the Node, backoff included.
    timeout_seconds: float
    #: Variables the user set on the worker container: no default is written for those.
    user_env: frozenset[str]
    serviceaccount_dir: Path
    #: KUBERNETES_SERVICE_HOST / _PORT; None when unset (not in a pod).
    api_host: str | None
    api_port: str | None


def load_config(environ: Mapping[str, str]) -> Config:
    node_name = environ.get("NODE_NAME", "").strip()
    if not node_name:
        raise ConfigError(
            "NODE_NAME is not set: give the container NODE_NAME from the downward API "
            "(valueFrom.fieldRef.fieldPath: spec.nodeName), as the elastic-job chart does"
        )
    if not _NODE_NAME.match(node_name):
        raise ConfigError(
            f"NODE_NAME {node_name!r} is not a Kubernetes node name (a DNS subdomain: "
            "lower-case letters, digits, '-' and '.', at most 253 characters): set it from "
            "the downward API (valueFrom.fieldRef.fieldPath: spec.nodeName), as the "
            "elastic-job chart does"
        )
    output = environ.get("TOPOLOGY_OUTPUT", "") or str(DEFAULT_OUTPUT)
    return Config(
        node_name=node_name,
        output=Path(output),
        label_map=parse_label_map(environ.get("TOPOLOGY_LABEL_MAP", "")),
        strict=_parse_bool("TOPOLOGY_STRICT", environ.get("TOPOLOGY_STRICT", "")),
        timeout_seconds=_parse_timeout(environ.get("TOPOLOGY_TIMEOUT_SECONDS", "")),
        user_env=frozenset(
            name.strip() for name in environ.get("TOPOLOGY_USER_ENV", "").split(",") if name.strip()
        ),
        # Not part of the chart's contract: lets tests and local runs point elsewhere.
        serviceaccount_dir=Path(
            environ.get("TOPOLOGY_SERVICEACCOUNT_DIR", "") or str(SERVICEACCOUNT_DIR)
        ),
        api_host=environ.get("KUBERNETES_SERVICE_HOST") or None,
        api_port=environ.get("KUBERNETES_SERVICE_PORT") or None,
    )


def parse_label_map(text: str) -> LabelMap:
    """TOPOLOGY_LABEL_MAP: a JSON object, variable name -> ordered list of label keys."""
    where = "TOPOLOGY_LABEL_MAP (values: topology.labelMap)"
    if not text.strip():
        return ()
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise ConfigError(f"{where} is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(
            f"{where} must be a JSON object of variable name -> list of label keys, "
            f"not {type(data).__name__}"
        )
    entries = []
    for name, keys in data.items():
        if not label_map_name_allowed(name):
            raise ConfigError(
                f"{where}: {_shown(name)} is not allowed: {LABEL_MAP_RULE}; "
                "rename it, e.g. NODE_RACK"
            )
        if (
            not isinstance(keys, list)
            or not keys
            or not all(isinstance(k, str) and k for k in keys)
        ):
            raise ConfigError(
                f"{where}: {name} must map to a non-empty list of label keys, e.g. "
                f'{{"{name}": ["example.com/label"]}}, not {json.dumps(keys)}'
            )
        entries.append((name, tuple(keys)))
    return tuple(entries)


def _shown(name: str) -> str:
    """A variable name as the user wrote it; quoted when it holds more than A-Z0-9_."""
    return name if re.fullmatch(r"[A-Za-z0-9_]+", name) else json.dumps(name)


def _parse_bool(name: str, text: str) -> bool:
    value = text.strip().lower()
    if value in ("", "false"):
        return False
    if value == "true":
        return True
    raise ConfigError(f'{name} must be "true" or "false", not {text!r}')


def _parse_timeout(text: str) -> float:
    name = "TOPOLOGY_TIMEOUT_SECONDS (values: topology.timeoutSeconds)"
    if not text.strip():
        return DEFAULT_TIMEOUT_SECONDS
    try:
        value = float(text)
    except ValueError:
        raise ConfigError(f"{name} must be a number of seconds, not {text!r}") from None
    if not math.isfinite(value) or value <= 0 or value > MAX_TIMEOUT_SECONDS:
        raise ConfigError(f"{name} must be > 0 and <= {MAX_TIMEOUT_SECONDS:g}, not {text!r}")
    return value
