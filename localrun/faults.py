"""Faults on demand: parsing `--kill POD@SECONDS` and friends into a typed schedule."""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import Enum


class FaultKind(str, Enum):
    KILL = "kill"  # SIGKILL every process of the pod's running container
    PREEMPT = "preempt"  # delete the pod: SIGTERM, SIGKILL after the grace period
    PARTITION = "partition"  # pod link down (for DURATION seconds, or until the end)
    SCALE = "scale"  # set a worker StatefulSet's replicas
    RESTART_RENDEZVOUS = "restart-rendezvous"  # delete the etcd pod; the StatefulSet recreates it


@dataclass(frozen=True)
class Fault:
    kind: FaultKind
    at: float  # seconds after the run started
    target: str = ""  # pod name, or worker group / StatefulSet name for SCALE
    duration: float | None = None  # PARTITION only: None keeps the link down
    replicas: int | None = None  # SCALE only
    at_step: int | None = None  # fire when training reaches this step instead (`@step=N`)

    def when(self) -> str:
        return f"step {self.at_step}" if self.at_step is not None else f"{self.at:g}s"

    def describe(self) -> str:
        if self.kind is FaultKind.SCALE:
            return f"scale {self.target}={self.replicas}"
        if self.kind is FaultKind.RESTART_RENDEZVOUS:
            return "restart-rendezvous"
        if self.kind is FaultKind.PARTITION and self.duration is not None:
            return f"partition {self.target} for {self.duration:g}s"
        return f"{self.kind.value} {self.target}"


class FaultSyntaxError(ValueError):
    """A fault argument that does not parse; the message says the expected form."""


_SECONDS = r"(\d+(?:\.\d+)?)"
_WHEN = r"(\d+(?:\.\d+)?|step=\d+)"
_NAME = r"([a-z0-9]([-a-z0-9.]*[a-z0-9])?)"
_POD_AT = re.compile(rf"^{_NAME}@{_WHEN}$")
_PARTITION = re.compile(rf"^{_NAME}@{_WHEN}(?::{_SECONDS})?$")
_SCALE = re.compile(rf"^{_NAME}=(\d+)@{_WHEN}$")
_AT = re.compile(rf"^@?{_WHEN}$")


def _when(text: str) -> dict[str, float | int | None]:
    """`12.5` (seconds after the start) or `step=N` (when training reaches step N)."""
    if text.startswith("step="):
        return {"at": 0.0, "at_step": int(text[5:])}
    return {"at": float(text), "at_step": None}


def parse_pod_fault(kind: FaultKind, text: str) -> Fault:
    """`POD@SECONDS` for --kill and --preempt."""
    m = _POD_AT.match(text.strip())
    if not m:
        raise FaultSyntaxError(f"--{kind.value} {text!r}: expected POD@SECONDS, e.g. demo-w-1@40")
    return Fault(kind, target=m.group(1), **_when(m.group(3)))  # type: ignore[arg-type]


def parse_partition(text: str) -> Fault:
    """`POD@SECONDS[:DURATION]`."""
    m = _PARTITION.match(text.strip())
    if not m:
        raise FaultSyntaxError(
            f"--partition {text!r}: expected POD@SECONDS[:DURATION], e.g. demo-w-1@40:20"
        )
    duration = float(m.group(4)) if m.group(4) is not None else None
    return Fault(FaultKind.PARTITION, target=m.group(1), duration=duration, **_when(m.group(3)))  # type: ignore[arg-type]


def parse_scale(text: str) -> Fault:
    """`GROUP=N@SECONDS`; GROUP is a worker group name or a StatefulSet name."""
    m = _SCALE.match(text.strip())
    if not m:
        raise FaultSyntaxError(f"--scale {text!r}: expected GROUP=N@SECONDS, e.g. workers=3@30")
    return Fault(FaultKind.SCALE, target=m.group(1), replicas=int(m.group(3)), **_when(m.group(4)))  # type: ignore[arg-type]


def parse_restart_rendezvous(text: str) -> Fault:
    """`SECONDS` (also accepted with a leading `@`)."""
    m = _AT.match(text.strip())
    if not m:
        raise FaultSyntaxError(f"--restart-rendezvous {text!r}: expected @SECONDS, e.g. @45")
    return Fault(FaultKind.RESTART_RENDEZVOUS, **_when(m.group(1)))  # type: ignore[arg-type]


def normalize_argv(argv: list[str]) -> list[str]:
    """Split `--restart-rendezvous@45` into `--restart-rendezvous 45` for argparse."""
    out: list[str] = []
    for arg in argv:
        if arg.startswith("--restart-rendezvous@"):
            out += ["--restart-rendezvous", arg.split("@", 1)[1]]
        else:
            out.append(arg)
    return out


def schedule(faults: list[Fault]) -> list[Fault]:
    """Faults in the order they fire (stable for equal times); step-triggered ones last."""
    return sorted(faults, key=lambda f: (f.at_step is not None, f.at_step or 0, f.at))
