"""Node fixtures (fixtures/*.json, shaped like `kubectl get node -o json`) and the named
profiles of them a run or a test starts a cluster with."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

JsonObject = dict[str, Any]

NODES_DIR = Path(__file__).resolve().parent / "fixtures"

#: Named sets of fixtures (file stems in NODES_DIR) for `load_nodes`.
NODE_PROFILES: dict[str, tuple[str, ...]] = {
    # One node of each kind init-topology must recognise.
    "cloud": (
        "gke-a3-h100-spot",
        "eks-p5-efa-karpenter-spot",
        "aks-nd-h100-v5-infiniband",
        "onprem-gfd-a100-roce",
        "aks-nd-h100-v5-hostdev",
        "gke-a3-ultra-h200-rdma",
        "oke-bm-gpu-h100-rdma",
        "coreweave-h100-infiniband-labels",
        "cpu-bare",
    ),
    # A small CPU cluster for the local runner: workers on spot and on-demand capacity in
    # two zones, and an on-demand system node for etcd.
    "local": (
        "local-spot-0",
        "local-spot-1",
        "local-ondemand-0",
        "local-ondemand-1",
        "local-system-0",
    ),
    # Nodes of two kinds for one job (topology.mismatch): an A100 node beside two H100
    # nodes (GPU feature discovery's labels; the local pods request no GPU), and the
    # system node for etcd, which avoids GPU nodes. Three workers land one per GPU node.
    "mixed": (
        "local-gpu-a100-0",
        "local-gpu-h100-0",
        "local-gpu-h100-1",
        "local-system-0",
    ),
}
NODE_PROFILES["all"] = NODE_PROFILES["cloud"] + NODE_PROFILES["local"]


def load_node(stem: str) -> JsonObject:
    """One fixture by file stem (e.g. "eks-p5-efa-karpenter-spot")."""
    path = NODES_DIR / f"{stem}.json"
    node: JsonObject = json.loads(path.read_text(encoding="utf-8"))
    return node


def load_nodes(profile: str | Iterable[str] = "all") -> dict[str, JsonObject]:
    """Fixtures keyed by node name (metadata.name): a profile of NODE_PROFILES or file stems."""
    stems = NODE_PROFILES[profile] if isinstance(profile, str) else tuple(profile)
    nodes: dict[str, JsonObject] = {}
    for stem in stems:
        node = load_node(stem)
        nodes[node["metadata"]["name"]] = node
    return nodes


def internal_ip(node: JsonObject) -> str:
    """The node's InternalIP address ("" when the fixture has none)."""
    for a in (node.get("status") or {}).get("addresses") or []:
        if a.get("type") == "InternalIP":
            return str(a.get("address", ""))
    return ""


def allocatable(node: JsonObject) -> dict[str, str]:
    return dict((node.get("status") or {}).get("allocatable") or {})
