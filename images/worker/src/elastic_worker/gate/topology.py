"""The job's kind of node: GPU model, GPU count and fabric (init-topology's NODE_GPU_MODEL,
NODE_GPU_COUNT, NODE_FABRIC), checked at the gate (ELASTIC_TOPOLOGY_MISMATCH).

NCCL runs a group of mixed nodes at its slowest GPU and link, or fails in ways that name
neither (an ethernet node in an InfiniBand group, an A100 among H100s). So the first
ELASTIC_MIN_NODES registered pods of one kind make it the job's: the first of them to pass
writes <prefix>/topology (create-only, with the members' TTL, refreshed by every pod of
that kind while it runs), and from then on a pod of another kind is refused: it waits at
the gate with one line naming both sides (`refuse`), or says so and joins (`warn`). When
no pod of the job's kind is left, the key lapses and the next kind to gather its minimum
is the job's.

A value unknown on either side (init-topology could not read the Node: no node reader; a
node without GPU labels has no model) is not compared: only what both sides know can
differ.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from elastic_worker.gate.wait import CheckResult
from elastic_worker.keystore import interface as kvstore
from elastic_worker.settings.config import Config

logger = logging.getLogger(__name__)

UNKNOWN = ("", "unknown")
FIELDS = ("gpu_model", "gpu_count", "fabric")


@dataclass(frozen=True)
class Kind:
    """A node's GPU model, GPU count and fabric ("" or "unknown": not known)."""

    gpu_model: str = ""
    gpu_count: str = ""
    fabric: str = ""

    @classmethod
    def of(cls, config: Config) -> Kind:
        return cls(*config.node_kind)

    @classmethod
    def from_dict(cls, raw: dict[str, object]) -> Kind:
        return cls(*(str(raw.get(f) or "") for f in FIELDS))

    def as_dict(self) -> dict[str, str]:
        return {f: getattr(self, f) for f in FIELDS}

    def known(self) -> bool:
        return any(getattr(self, f) not in UNKNOWN for f in FIELDS)

    def differences(self, other: Kind) -> list[str]:
        """The fields both know and that differ."""
        return [
            f
            for f in FIELDS
            if getattr(self, f) not in UNKNOWN
            and getattr(other, f) not in UNKNOWN
            and getattr(self, f) != getattr(other, f)
        ]

    def matches(self, other: Kind) -> bool:
        return not self.differences(other)

    def describe(self) -> str:
        """`NVIDIA-H100-80GB-HBM3 x8, infiniband`: what is known of it."""
        if self.gpu_count == "0" and self.gpu_model in UNKNOWN:
            gpus = "no GPU"
        else:
            model = self.gpu_model if self.gpu_model not in UNKNOWN else "GPUs"
            gpus = model + (f" x{self.gpu_count}" if self.gpu_count not in UNKNOWN else "")
        fabric = self.fabric if self.fabric not in UNKNOWN else ""
        return ", ".join(part for part in (gpus, fabric) if part)


@dataclass(frozen=True)
class JobKind:
    """The job's kind as <prefix>/topology holds it, with the pod and node that set it."""

    kind: Kind
    pod: str
    node: str

    def encode(self) -> str:
        return json.dumps(
            {**self.kind.as_dict(), "pod": self.pod, "node": self.node}, sort_keys=True
        )

    @classmethod
    def decode(cls, value: str) -> JobKind | None:
        try:
            raw = json.loads(value)
        except ValueError:
            return None
        if not isinstance(raw, dict):
            return None
        return cls(Kind.from_dict(raw), str(raw.get("pod", "")), str(raw.get("node", "")))


def key(config: Config) -> str:
    return f"{config.key_prefix}/topology"


class Gate:
    """The gate's check of this pod's kind against the job's, and the key's refresh.

    `members` gives the registered members' kinds (members.Registration.kinds)."""

    def __init__(
        self,
        client: kvstore.KeyStore,
        config: Config,
        members: Callable[[], Iterable[Kind]],
        ttl: int,
    ) -> None:
        self.client = client
        self.config = config
        self.mode = config.topology_mismatch
        self.mine = Kind.of(config)
        self.members = members
        self.ttl = ttl
        self.held: str | None = None  # the key's value this pod refreshes (its kind's)
        self._said: str = ""

    @property
    def active(self) -> bool:
        """Whether there is anything to check: a mode other than off, a kind known."""
        return self.mode != "off" and self.mine.known()

    def probe(self) -> CheckResult:
        """Done when this pod may join: its kind is the job's (or, with `warn`, said to
        differ); else why it waits."""
        if not self.active:
            return True, ""
        try:
            return self._probe()
        except kvstore.EtcdError as exc:
            return False, str(exc)

    def _probe(self) -> CheckResult:
        value = self.client.get_value(key(self.config))
        job = JobKind.decode(value) if value is not None else None
        if job is None:
            same = sum(1 for k in self.members() if k.matches(self.mine))
            if same < self.config.min_nodes:
                return False, (
                    f"{same} of {self.config.min_nodes} registered pods on nodes of this "
                    f"kind ({self.mine.describe()}) before the job's kind is set"
                )
            mine = JobKind(self.mine, self.config.pod_name, self.config.node_name)
            try:
                self.client.set(key(self.config), mine.encode(), ttl=self.ttl, prev_exist=False)
            except kvstore.NodeExists:
                return self._probe()  # another pod set it first: compare with theirs
            self.held = mine.encode()
            logger.info("the job's kind of node is this one's: %s", self.mine.describe())
            return True, ""
        differs = self.mine.differences(job.kind)
        if not differs:
            self.held = value
            return True, ""
        line = self.refusal(job, differs)
        if self.mode == "warn":
            logger.warning("%s; joining anyway (topology.mismatch=warn)", line)
            return True, ""
        if line != self._said:
            logger.warning("%s", line)
            self._said = line
        return False, line

    def refusal(self, job: JobKind, differs: list[str]) -> str:
        """One line naming both sides and what to change."""
        what = ", ".join(d.replace("_", " ") for d in differs)
        return (
            f"refused: this pod's node {self.config.node_name or '(unknown)'} "
            f"({self.mine.describe()}) differs in {what} "
            f"from the job's nodes ({job.kind.describe()}, as on {job.node or job.pod}): "
            "NCCL would run the group at its slowest; place the pods on one kind of node "
            "(nodeSelector, affinity), or set topology.mismatch=warn to train on mixed nodes"
        )

    def refresh(self) -> None:
        """Keep the job's kind while a pod of it runs (the members' refresh calls this)."""
        if self.held is None:
            return
        try:
            self.client.set(key(self.config), self.held, ttl=self.ttl, prev_value=self.held)
        except kvstore.KeyNotFound:
            # Lapsed (etcd lost its data, or every pod of the kind was away): set it again.
            try:
                self.client.set(key(self.config), self.held, ttl=self.ttl, prev_exist=False)
            except kvstore.EtcdError as exc:
                logger.debug("could not set %s again: %s", key(self.config), exc)
        except kvstore.EtcdError as exc:
            logger.debug("could not refresh %s: %s", key(self.config), exc)
