"""Whatever shape of Node the API server hands back, init-topology ends with a documented
exit code and one printable line per message, never a traceback: a field that is null or
of the wrong type reads as a Node without it (the Node is data from many hands: admission
webhooks, proxies, a future API version)."""

from __future__ import annotations

import contextlib
import io
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from init_topology import main as entrypoint
from init_topology.fabric import EFA_RESOURCE, NFD_RDMA_LABELS
from init_topology.mapping import GPU_COUNT, GPU_MODEL, INSTANCE_TYPE, REGION, ZONE

from localrun.cluster.nodes import load_node

DOCUMENTED_EXIT_CODES = {0, 2, 3, 4}

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=8,
)
label_keys = st.sampled_from(
    sorted(
        {*REGION, *ZONE, *INSTANCE_TYPE, *GPU_MODEL, *GPU_COUNT, *NFD_RDMA_LABELS}
        | {"karpenter.sh/capacity-type", "example.com/mapped"}
    )
)
resource_names = st.sampled_from(
    ["nvidia.com/gpu", EFA_RESOURCE, "rdma/ib", "nvidia.com/hostdev", "openshift.io/mlnxnics"]
)
quantities = st.one_of(st.sampled_from(["8", "1k", "0", "-1", "500m", "1e3", "x"]), json_values)
labels = st.one_of(
    json_values,
    st.dictionaries(st.one_of(label_keys, st.text(max_size=20)), st.one_of(st.text(), json_values)),
)
metadata = st.one_of(
    json_values,
    st.fixed_dictionaries({}, optional={"labels": labels, "annotations": json_values}),
)
spec = st.one_of(
    json_values,
    st.fixed_dictionaries(
        {},
        optional={
            "providerID": st.one_of(
                st.sampled_from(["aws:///us-east-1a/i-1", "ocid1.instance.oc1.iad.x", "azure://"]),
                json_values,
            )
        },
    ),
)
resources = st.one_of(
    json_values, st.dictionaries(st.one_of(resource_names, st.text(max_size=20)), quantities)
)
status = st.one_of(
    json_values,
    st.fixed_dictionaries({}, optional={"allocatable": resources, "capacity": resources}),
)
nodes = st.fixed_dictionaries(
    {}, optional={"metadata": metadata, "spec": spec, "status": status, "kind": json_values}
)


def run_main(node: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> tuple[int, str, Path]:
    """main() in this process, with `node` as what the API server answered."""
    with tempfile.TemporaryDirectory() as tmp:
        output = Path(tmp) / "env"
        with monkeypatch.context() as patch:
            patch.setattr(entrypoint, "fetch_node", lambda config: node)
            patch.setenv("NODE_NAME", "n1")
            patch.setenv("TOPOLOGY_OUTPUT", str(output))
            patch.setenv("TOPOLOGY_LABEL_MAP", '{"NODE_MAPPED": ["example.com/mapped"]}')
            stderr = io.StringIO()
            with contextlib.redirect_stderr(stderr):
                code = entrypoint.main([])
            written = output.exists()
    return code, stderr.getvalue(), output if written else Path()


@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(node=nodes)
def test_any_node_shape_ends_with_a_documented_code_and_one_line_per_message(
    node: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    code, stderr, _ = run_main(node, monkeypatch)
    assert code in DOCUMENTED_EXIT_CODES
    assert code == 0, stderr  # the Node was read: it is written, degraded or not
    lines = stderr.splitlines()
    assert lines and all(line.startswith("init-topology: ") for line in lines), stderr
    assert all(line.isprintable() for line in lines)


@pytest.mark.parametrize("field", ["spec", "status", "metadata"])
def test_a_null_top_level_field_reads_as_absent(
    field: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    node = load_node("eks-p5-efa-karpenter-spot")
    node[field] = None
    code, stderr, _ = run_main(node, monkeypatch)
    assert (code, "Traceback" in stderr) == (0, False), stderr
