"""Pure mapping: a Node (the API's JSON as a dict) -> the ordered variables to write.

No I/O here: each function takes plain data and returns plain data, so every rule is tested
on fixtures without a cluster. The fabric rule is fabric.py; quantities, quantity.py.

Conventions: variables with a closed set of values (NODE_CAPACITY_TYPE, NODE_FABRIC) say
`unknown` when the Node does not tell; free-text variables are empty then.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from typing import Any

from init_topology.config import Config
from init_topology.envfile import check_value
from init_topology.fabric import UNKNOWN, fabric
from init_topology.quantity import whole

log = logging.getLogger(__name__)

Variables = dict[str, str]
Node = Mapping[str, Any]

SPOT = "spot"
ON_DEMAND = "on-demand"
FABRICS = ("infiniband", "efa", "roce", "ethernet")

# Well-known label keys.
REGION = ("topology.kubernetes.io/region", "failure-domain.beta.kubernetes.io/region")
ZONE = ("topology.kubernetes.io/zone", "failure-domain.beta.kubernetes.io/zone")
INSTANCE_TYPE = ("node.kubernetes.io/instance-type", "beta.kubernetes.io/instance-type")
GPU_MODEL = (
    "nvidia.com/gpu.product",  # NVIDIA GPU feature discovery (GPU Operator)
    "cloud.google.com/gke-accelerator",  # GKE
    "karpenter.k8s.aws/instance-gpu-name",  # Karpenter on AWS
    "k8s.amazonaws.com/accelerator",  # EKS GPU AMIs / eksctl
    "gpu.nvidia.com/class",  # CoreWeave: H100_NVLINK_80GB, A100_NVLINK_80GB, ...
)
GPU_COUNT = ("nvidia.com/gpu.count", "karpenter.k8s.aws/instance-gpu-count")
GPU_RESOURCE = "nvidia.com/gpu"

#: A GCE zone, `<region>-<zone letter>` (us-central1-a, europe-west4-b).
_GCE_ZONE = re.compile(r"(?P<region>[a-z]+-[a-z]+[0-9]+)-[a-z0-9]+")

GKE_NODEPOOL = "cloud.google.com/gke-nodepool"
AKS_AGENTPOOL = "kubernetes.azure.com/agentpool"

# EC2 families whose EFA supports RDMA read/write (FI_EFA_USE_DEVICE_RDMA=1 is valid there;
# on other EFA instances libfabric refuses to start with it).
EFA_RDMA_FAMILIES = frozenset(
    {"p4d", "p4de", "p5", "p5e", "p5en", "p6-b200", "p6e-gb200", "trn1", "trn1n", "trn2"}
)

_PROVIDER_SCHEME = re.compile(r"^([a-z][a-z0-9+.-]*)://")
OCI_INSTANCE_OCID_PREFIX = "ocid1.instance."


def _mapping(value: Any) -> Mapping[str, Any]:
    """`value` if it is a JSON object, else empty: a Node whose spec, status, metadata,
    labels or allocatable is null or of another type reads as one without them."""
    return value if isinstance(value, Mapping) else {}


def labels_of(node: Node) -> Mapping[str, str]:
    """The Node's labels; entries that are not string -> string are left out."""
    labels = _mapping(_mapping(node.get("metadata")).get("labels"))
    return {k: v for k, v in labels.items() if isinstance(k, str) and isinstance(v, str)}


def allocatable_of(node: Node) -> Mapping[str, str]:
    """status.allocatable; a quantity written as a JSON number is read as its text."""
    alloc = _mapping(_mapping(node.get("status")).get("allocatable"))
    return {
        k: v if isinstance(v, str) else str(v)
        for k, v in alloc.items()
        if isinstance(k, str) and isinstance(v, (str, int)) and not isinstance(v, bool)
    }


def first_label(labels: Mapping[str, str], keys: tuple[str, ...]) -> str | None:
    for key in keys:
        if key in labels:
            return labels[key]
    return None


def provider(node: Node) -> str:
    """The scheme of spec.providerID: gce, aws, azure, kind, openstack, ...; "" if none.

    OKE writes a bare instance OCID (`ocid1.instance.oc1....`) by default: that is `oci`.
    """
    provider_id = _mapping(node.get("spec")).get("providerID")
    if not isinstance(provider_id, str):
        return ""
    match = _PROVIDER_SCHEME.match(provider_id)
    if match:
        return match.group(1)
    return "oci" if provider_id.startswith(OCI_INSTANCE_OCID_PREFIX) else ""


def provider_zone(node: Node) -> str:
    """The zone spec.providerID names, for a Node whose labels name none: GCE writes
    `gce://<project>/<zone>/<instance>`; "" for any other provider or shape."""
    provider_id = _mapping(node.get("spec")).get("providerID")
    if not isinstance(provider_id, str) or not provider_id.startswith("gce://"):
        return ""
    parts = provider_id.removeprefix("gce://").split("/")
    if len(parts) == 3 and _GCE_ZONE.fullmatch(parts[1]):
        return parts[1]
    return ""


def zone_region(zone: str) -> str:
    """The region of a GCE zone (us-central1-a -> us-central1); "" for anything else."""
    match = _GCE_ZONE.fullmatch(zone)
    return match["region"] if match else ""


def capacity_type(labels: Mapping[str, str]) -> str:
    """spot, on-demand or unknown, from the labels each provisioner sets.

    Preemptible (GKE) and Azure spot priority count as spot. Reserved capacity and AWS
    capacity blocks count as on-demand: no spot reclaim. A node of a GKE or AKS node pool
    without their spot labels is on-demand (those platforms label only spot nodes).
    """
    value = labels.get("karpenter.sh/capacity-type", "").lower()  # Karpenter (AWS, Azure)
    if value:
        return (
            SPOT
            if value == "spot"
            else ON_DEMAND
            if value in ("on-demand", "reserved")
            else UNKNOWN
        )
    value = labels.get("eks.amazonaws.com/capacityType", "").upper()  # EKS managed node groups
    if value:
        return (
            SPOT
            if value == "SPOT"
            else ON_DEMAND
            if value in ("ON_DEMAND", "CAPACITY_BLOCK")
            else UNKNOWN
        )
    if "true" in (
        labels.get("cloud.google.com/gke-spot", "").lower(),
        labels.get("cloud.google.com/gke-preemptible", "").lower(),
    ):
        return SPOT
    value = labels.get("cloud.google.com/gke-provisioning", "").lower()
    if value in ("spot", "preemptible"):
        return SPOT
    if value or GKE_NODEPOOL in labels:
        return ON_DEMAND
    value = labels.get("kubernetes.azure.com/scalesetpriority", "").lower()  # AKS
    if value:
        return SPOT if value == "spot" else ON_DEMAND
    if AKS_AGENTPOOL in labels:
        return ON_DEMAND
    for key in ("node.kubernetes.io/lifecycle", "spotinst.io/node-lifecycle", "lifecycle"):
        value = labels.get(key, "").lower()  # kops, Spot Ocean, eksctl/self-managed groups
        if value in ("spot", "ec2spot", "preemptible"):
            return SPOT
        if value in ("on-demand", "ondemand", "od", "normal", "regular"):
            return ON_DEMAND
    return UNKNOWN


def gpus(labels: Mapping[str, str], allocatable: Mapping[str, str]) -> tuple[str, str]:
    """(model, count) of NVIDIA GPUs. The count is what pods can be given (allocatable),
    else what discovery labels report; the model is the source label's own spelling."""
    model = first_label(labels, GPU_MODEL) or ""
    count: int | None = None
    if GPU_RESOURCE in allocatable:
        count = whole(allocatable[GPU_RESOURCE])
    if count is None:
        count = whole(first_label(labels, GPU_COUNT) or "")
    return model, str(count or 0)


def node_variables(node_name: str, node: Node | None) -> Variables:
    """NODE_* in their fixed order. Without a Node: the name, and unknown where defined."""
    if node is None:
        return {
            "NODE_NAME": node_name,
            "NODE_CAPACITY_TYPE": UNKNOWN,
            "NODE_FABRIC": UNKNOWN,
            "NODE_TOPOLOGY_SOURCE": "downward-api",
        }
    labels = labels_of(node)
    allocatable = allocatable_of(node)
    node_provider = provider(node)
    model, count = gpus(labels, allocatable)
    instance_type = first_label(labels, INSTANCE_TYPE) or ""
    # Labels first; a Node without topology labels may still name its zone in providerID.
    zone = first_label(labels, ZONE)
    region = first_label(labels, REGION)
    if zone is None:
        zone = provider_zone(node)
        region = region if region is not None else zone_region(zone)
    variables = {
        "NODE_NAME": node_name,
        "NODE_PROVIDER": node_provider,
        "NODE_REGION": region or "",
        "NODE_ZONE": zone,
        "NODE_INSTANCE_TYPE": instance_type,
        "NODE_GPU_MODEL": model,
        "NODE_GPU_COUNT": count,
        "NODE_CAPACITY_TYPE": capacity_type(labels),
        "NODE_FABRIC": fabric(labels, allocatable, node_provider, instance_type),
        "NODE_TOPOLOGY_SOURCE": "api",
    }
    return {key: _writable(key, value) for key, value in variables.items()}


def mapped_variables(
    labels: Mapping[str, str], label_map: tuple[tuple[str, tuple[str, ...]], ...]
) -> Variables:
    """The user's label map: for each variable, the first of its label keys present."""
    out: Variables = {}
    for name, keys in label_map:
        value = first_label(labels, keys)
        if value is None:
            continue
        try:
            check_value(value)
        except ValueError as exc:
            log.warning("not writing %s: the value of the label it maps %s", name, exc)
            continue
        out[name] = value
    return out


def nccl_defaults(node_fabric: str, instance_type: str) -> Variables:
    """Conservative NCCL/libfabric settings for a fabric; nothing for an unknown one.

    - efa: FI_PROVIDER=efa so the aws-ofi-nccl plugin picks EFA, and
      FI_EFA_USE_DEVICE_RDMA=1 only on instance families whose EFA does RDMA.
      NCCL_PROTO is left alone (AWS no longer recommends forcing Simple).
    - infiniband, roce: NCCL_IB_DISABLE=0, undoing an image that disabled IB. NCCL picks
      the HCAs and (2.21+) the RoCEv2 GID itself, so no NCCL_IB_HCA or NCCL_IB_GID_INDEX.
    - ethernet: NCCL_IB_DISABLE=1, so NCCL does not probe for IB devices that are absent.
    """
    if node_fabric == "efa":
        out = {"FI_PROVIDER": "efa"}
        if instance_type.split(".", maxsplit=1)[0] in EFA_RDMA_FAMILIES:
            out["FI_EFA_USE_DEVICE_RDMA"] = "1"
        return out
    if node_fabric in ("infiniband", "roce"):
        return {"NCCL_IB_DISABLE": "0"}
    if node_fabric == "ethernet":
        return {"NCCL_IB_DISABLE": "1"}
    return {}


def build_variables(config: Config, node: Node | None) -> Variables:
    """Everything written, in order: NODE_*, then the user's label map (which may override a
    NODE_* value in place), then NCCL defaults for the resulting NODE_FABRIC, except those
    the user set on the worker container (TOPOLOGY_USER_ENV) or mapped from a label."""
    variables = node_variables(config.node_name, node)
    if node is not None:
        variables.update(mapped_variables(labels_of(node), config.label_map))
    for key, value in nccl_defaults(
        variables.get("NODE_FABRIC", UNKNOWN), variables.get("NODE_INSTANCE_TYPE", "")
    ).items():
        if key not in config.user_env and key not in variables:
            variables[key] = value
    return variables


def _writable(key: str, value: str) -> str:
    """`value`, or "" if no env file can hold it (NUL, lone surrogates: never from a real
    API server, whose validation and JSON rule them out)."""
    try:
        check_value(value)
    except ValueError as exc:
        log.warning("writing %s empty: the value on the Node %s", key, exc)
        return ""
    return value
