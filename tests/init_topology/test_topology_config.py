"""Settings: which variable names a label map (TOPOLOGY_LABEL_MAP, topology.labelMap) may
write. A rule, not a list: a name starts with a fabric-tuning family's prefix and holds no
word that loads code, so names that change a shell, an interpreter or the loader are out
whether or not anyone thought of them."""

from __future__ import annotations

import json

import pytest
from init_topology.config import (
    LABEL_MAP_FORBIDDEN_WORDS,
    LABEL_MAP_PREFIXES,
    ConfigError,
    parse_label_map,
)

# Names that change how a shell, Python or the dynamic loader behaves for whoever sources
# or runs under the file, and names that load code into NCCL, libfabric or UCX.
REFUSED = [
    "PATH",
    "ENV",
    "BASH_ENV",
    "SHELLOPTS",
    "BASHOPTS",
    "PROMPT_COMMAND",
    "CDPATH",
    "IFS",
    "PS4",
    "HOME",
    "PYTHONSTARTUP",
    "PYTHONINSPECT",
    "PYTHONWARNINGS",
    "PYTHONPATH",
    "PYTHONHOME",
    "LD_PRELOAD",
    "LD_AUDIT",
    "LD_BIND_NOW",
    "LD_DEBUG_OUTPUT",
    "GCONV_PATH",
    "NCCL_NET_PLUGIN",
    "NCCL_TUNER_PLUGIN",
    "NCCL_PROFILER_PLUGIN",
    "FI_PROVIDER_PATH",
    "UCX_LIBRARY_PATH",
    "GLOO_PRELOAD_X",
    "NODE_LIBS",
    "NODE_SEARCHPATH",
    # Syntax: the whole name is ^[A-Z][A-Z0-9_]*$.
    "node_rack",
    "NODE-RACK",
    "NODE_RACK ",
    "NODE_RACK\n",
    "_NODE_RACK",
    "NODE_Rack",
    "",
]

ALLOWED = [
    "NODE_RACK",
    "NODE_FABRIC",
    "NODE_POOL",
    "NCCL_IB_HCA",
    "NCCL_SOCKET_IFNAME",
    "NCCL_CROSS_NIC",
    "GLOO_SOCKET_IFNAME",
    "FI_EFA_USE_DEVICE_RDMA",
    "UCX_NET_DEVICES",
]


@pytest.mark.parametrize("name", REFUSED)
def test_label_map_refuses_a_name_outside_the_rule_naming_it_and_stating_the_rule(
    name: str,
) -> None:
    with pytest.raises(ConfigError) as info:
        parse_label_map(json.dumps({"NODE_OK": ["a.example.com/x"], name: ["example.com/x"]}))
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith("TOPOLOGY_LABEL_MAP (values: topology.labelMap): ")
    shown = name if name.isidentifier() else json.dumps(name)
    assert f" {shown} is not allowed: " in message
    assert "^[A-Z][A-Z0-9_]*$" in message
    assert all(p in message for p in [*LABEL_MAP_PREFIXES, *LABEL_MAP_FORBIDDEN_WORDS])


@pytest.mark.parametrize("name", ALLOWED)
def test_label_map_accepts_fabric_tuning_names(name: str) -> None:
    assert parse_label_map(json.dumps({name: ["example.com/x"]})) == ((name, ("example.com/x",)),)
