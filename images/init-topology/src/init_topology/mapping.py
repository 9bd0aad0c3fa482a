"""Pure mapping: a Node (the API's JSON as a dict) -> the ordered variables to write.

No I/O here: each function takes plain data and returns plain data, so every rule is tested
on fixtures without a cluster.

Conventions: variables with a closed set of values (NODE_CAPACITY_TYPE, NODE_FABRIC) say
`unknown` when the Node does not tell; free-text variables are empty then.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from decimal import Context, Decimal
from typing import Any

from init_topology.config import Config
from init_topology.envfile import check_value

log = logging.getLogger(__name__)

Variables = dict[str, str]
Node = Mapping[str, Any]

UNKNOWN = "unknown"
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
EFA_RESOURCE = "vpc.amazonaws.com/efa"

# Fabric evidence (see `fabric`).
#: Device-plugin domains whose resources are RDMA devices: the RDMA shared device plugin
#: (k8s-rdma-shared-dev-plugin, the NVIDIA Network Operator's rdmaSharedDevicePlugin:
#: rdma/rdma_shared_device_a, rdma/hca_shared_devices_a, rdma/ib, ...).
RDMA_RESOURCE_DOMAINS = frozenset({"rdma"})
#: Name tokens that make any resource an RDMA device (nvidia.com/rdma_sriov on OKE,
#: networking.gke.io.networks/rdma-0 on GKE, nvidia.com/sriov_roce, .../mlnx_ib_sriov).
RDMA_TOKENS = frozenset({"rdma", "ib", "infiniband", "roce", "hca"})
#: The NVIDIA Network Operator's own resource domains: its host-device resource
#: (nvidia.com/hostdev: whole Mellanox NICs, selected with isRdma) is an RDMA device.
NETWORK_OPERATOR_DOMAINS = frozenset({"nvidia.com", "mellanox.com"})
#: SR-IOV device plugin domains (the SR-IOV Network Operator's openshift.io, the plugin's
#: default intel.com, the Network Operator's nvidia.com): their NICs (nvidia.com/mlnxnics,
#: openshift.io/mlxnics) may be RDMA VFs or not. GPU resources in them are not NICs.
SRIOV_RESOURCE_DOMAINS = frozenset({"openshift.io", "intel.com", "nvidia.com", "mellanox.com"})
GPU_RESOURCE_NAMES = ("gpu", "mig-", "vgpu", "pgpu")
#: Name tokens of a NIC resource that may do RDMA, in any domain.
NIC_TOKENS = frozenset({"sriov", "vf", "vfs", "mlnx", "mellanox", "connectx"})
#: NFD's labels for an RDMA-capable adapter (a Mellanox PCI device) and for loaded RDMA
#: modules, in both spellings NFD has used, and its Mellanox PCI vendor label.
NFD_RDMA_LABELS = (
    "feature.node.kubernetes.io/rdma.capable",
    "feature.node.kubernetes.io/rdma.available",
    "feature.node.kubernetes.io/custom-rdma.capable",
    "feature.node.kubernetes.io/custom-rdma.available",
    "feature.node.kubernetes.io/pci-15b3.present",
)
#: The Network Operator labels the nodes where it manages the Mellanox driver.
NETWORK_OPERATOR_LABELS = ("network.nvidia.com/operator.mofed.wait",)
#: The one RDMA link layer a provider offers (Azure: InfiniBand; GCE, OCI: RoCE v2).
PROVIDER_RDMA_LINK = {"azure": "infiniband", "gce": "roce", "oci": "roce"}
#: GCE machine types with RoCE NICs (GPUDirect RDMA): A3 Ultra, A4, A4X, A4X Max.
GCE_ROCE_MACHINE_PREFIXES = ("a3-ultragpu-", "a4-highgpu-", "a4x-highgpu-", "a4x-maxgpu-")
#: GCE machine types with RDMA that is neither InfiniBand nor RoCE (H4D: Cloud RDMA).
GCE_OTHER_RDMA_MACHINE_PREFIXES = ("h4d-",)
#: An Azure VM size: Standard_<family><vCPUs>[-<constrained vCPUs>]<additive features>_...
_AZURE_SIZE = re.compile(r"(?i:standard)_[A-Z]+\d+(?:-\d+)?(?P<features>[a-z]*)(?:_|$)")

#: CoreWeave's fabric labels: backend.coreweave.cloud/flavor names the backend fabric
#: (infiniband, roce); the ib.coreweave.cloud/ labels (fabric, leafgroup, speed, superpod,
#: ...) are put on InfiniBand nodes only.
COREWEAVE_FLAVOR = "backend.coreweave.cloud/flavor"
COREWEAVE_IB_PREFIX = "ib.coreweave.cloud/"

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
_TOKEN = re.compile(r"[^a-z0-9]+")


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
        count = _int(allocatable[GPU_RESOURCE])
    if count is None:
        count = _int(first_label(labels, GPU_COUNT) or "")
    return model, str(count or 0)


def fabric(
    labels: Mapping[str, str],
    allocatable: Mapping[str, str],
    node_provider: str,
    instance_type: str = "",
) -> str:
    """infiniband, efa, roce, ethernet or unknown: what the Node shows of its fast fabric.

    Writing `ethernet` makes NCCL_IB_DISABLE=1, which breaks training on a node that does
    have InfiniBand or RoCE; `infiniband`/`roce` only write NCCL's own default. So
    `ethernet` needs positive knowledge (the provider's instance type, below) and no RDMA
    device advertised; anything weaker that hints at RDMA gives `unknown`, and nothing is
    written. In order:

    1. allocatable vpc.amazonaws.com/efa > 0: efa.
    2. The provider's own fabric labels (`labelled_fabric`: CoreWeave's): what they say.
    3. An RDMA device resource whose name tells its link layer (`ib`, `infiniband` ->
       infiniband; `roce`, `eth`, `ethernet` -> roce): that.
    4. The provider's instance type (`provider_fabric`): infiniband or roce as it says;
       ethernet as it says unless a device resource that is or may be RDMA is advertised
       (NFD's host hints do not count there: Azure's accelerated networking is a Mellanox
       VF, EFA loads ib_uverbs).
    5. Any RDMA evidence (resource or NFD label): the provider's only RDMA link (Azure
       InfiniBand, GCE and OCI RoCE), else unknown.
    6. Nothing known: unknown.
    """
    if _positive(allocatable.get(EFA_RESOURCE)):
        return "efa"
    labelled = labelled_fabric(labels)
    if labelled:
        return labelled
    rdma, maybe, link = _rdma_resources(allocatable)
    if link:
        return link
    view = provider_fabric(node_provider, instance_type)
    if view in ("infiniband", "roce"):
        return view
    if view == "ethernet":
        return UNKNOWN if rdma or maybe else "ethernet"
    if rdma or maybe or _rdma_labels(labels):
        return PROVIDER_RDMA_LINK.get(node_provider, UNKNOWN)
    return UNKNOWN


def labelled_fabric(labels: Mapping[str, str]) -> str | None:
    """The fabric a provider's own labels name; None where they name none.

    CoreWeave: `backend.coreweave.cloud/flavor` is `infiniband` or `roce`; without it (older
    nodes), any `ib.coreweave.cloud/` label marks an InfiniBand node.
    """
    flavor = labels.get(COREWEAVE_FLAVOR, "").strip().lower()
    if flavor in ("infiniband", "roce"):
        return flavor
    if any(key.startswith(COREWEAVE_IB_PREFIX) for key in labels):
        return "infiniband"
    return None


def provider_fabric(node_provider: str, instance_type: str) -> str | None:
    """What a cloud's instance type says of its fabric; None where it says nothing.

    - aws: EC2 has no InfiniBand or RoCE; its RDMA is EFA (counted by its resource), which
      NCCL reaches through the aws-ofi-nccl plugin, not its IB transport: ethernet.
    - azure: RDMA-capable sizes carry `r` among the additive features after the vCPU count
      (Standard_ND96isr_H100_v5, Standard_HB120rs_v3) and their RDMA is InfiniBand; a size
      without it has none: ethernet.
    - gce: RDMA NICs come with the machine family: RoCE on A3 Ultra, A4, A4X and A4X Max;
      H4D's Cloud RDMA is neither; every other family has only gVNIC/virtio NICs
      (A3 High/Mega's GPUDirect-TCPX/TCPXO is TCP over ethernet): ethernet.
    - anything else, or no instance type: None.
    """
    itype = instance_type.strip()
    if node_provider == "aws":
        return "ethernet"
    if node_provider == "azure" and itype:
        match = _AZURE_SIZE.match(itype)
        if match is None:
            return None
        return "infiniband" if "r" in match.group("features") else "ethernet"
    if node_provider == "gce" and itype:
        family = itype.lower()
        if family.startswith(GCE_ROCE_MACHINE_PREFIXES):
            return "roce"
        if family.startswith(GCE_OTHER_RDMA_MACHINE_PREFIXES):
            return None
        return "ethernet"
    return None


def _rdma_resources(allocatable: Mapping[str, str]) -> tuple[bool, bool, str | None]:
    """(an RDMA device is advertised, a device that may be RDMA is, the link layer the
    RDMA devices' names tell or None). Only resources with a positive quantity count."""
    rdma = maybe = False
    hints: set[str] = set()
    for name, quantity in allocatable.items():
        if not _positive(quantity):
            continue
        domain, _, resource = name.lower().rpartition("/")
        tokens = set(_TOKEN.split(resource))
        if (
            domain in RDMA_RESOURCE_DOMAINS
            or tokens & RDMA_TOKENS
            or (domain in NETWORK_OPERATOR_DOMAINS and "hostdev" in tokens)
        ):
            rdma = True
            hints |= tokens
        elif (domain in SRIOV_RESOURCE_DOMAINS and not resource.startswith(GPU_RESOURCE_NAMES)) or (
            tokens & NIC_TOKENS
        ):
            maybe = True
    if hints & {"ib", "infiniband"}:
        return rdma, maybe, "infiniband"
    if hints & {"roce", "eth", "ethernet"}:
        return rdma, maybe, "roce"
    return rdma, maybe, None


def _rdma_labels(labels: Mapping[str, str]) -> bool:
    """NFD (or the NVIDIA Network Operator) says the host has an RDMA-capable adapter."""
    return any(labels.get(key, "").lower() == "true" for key in NFD_RDMA_LABELS) or any(
        key in labels for key in NETWORK_OPERATOR_LABELS
    )


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


_QUANTITY = re.compile(
    r"(?P<number>[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))"
    r"(?:(?P<binary>Ki|Mi|Gi|Ti|Pi|Ei)|(?P<decimal>[numkMGTPE])|[eE](?P<exponent>[+-]?[0-9]+))?"
)
#: Longer text is no count of devices (and int -> str refuses > 4300 digits).
_MAX_QUANTITY_CHARS = 40
#: Enough digits that no quantity of that length is rounded.
_EXACT = Context(prec=4 * _MAX_QUANTITY_CHARS)
_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {"n": -9, "u": -6, "m": -3, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}


def _quantity(text: str) -> Decimal | None:
    """A Kubernetes quantity (`8`, `1k` as the API writes 1000, `500m`, `1e3`, `2Ki`);
    None if the text is not one, or is too long or too large to be a count of anything."""
    match = _QUANTITY.fullmatch(text.strip()) if len(text) <= _MAX_QUANTITY_CHARS else None
    if match is None:
        return None
    number = Decimal(match["number"])
    if match["binary"]:
        return _EXACT.multiply(number, Decimal(_BINARY[match["binary"]]))
    exponent = _DECIMAL[match["decimal"]] if match["decimal"] else int(match["exponent"] or 0)
    if abs(exponent) > _MAX_QUANTITY_CHARS:
        return None
    return number.scaleb(exponent, context=_EXACT)


def _int(text: str) -> int | None:
    """A whole, non-negative quantity, else None (GPU and RDMA counts are whole numbers)."""
    value = _quantity(text)
    if value is None or value < 0 or value != value.to_integral_value():
        return None
    return int(value)


def _positive(quantity: str | None) -> bool:
    value = _quantity(quantity or "")
    return value is not None and value > 0
