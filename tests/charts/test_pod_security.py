"""Pod Security levels: each values-example states, in its leading comment, the level its
namespace needs (`# Pod Security: restricted`); the render must pass that level and fail
every stricter one, so a claim that is false, or needlessly loose, fails here. Levels are
computed by pod_security.py (the Pod Security Standards' controls as data)."""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from chart_render import CLUSTER, ELASTIC_JOB, EXAMPLES, Case, cases, objects, worker_statefulsets
from pod_security import claimed_level, level, pod_level, pod_templates

OVERLAYS = EXAMPLES / "overlays"
ROOT_FALLBACK = OVERLAYS / "rdma-root-ipc-lock.yaml"
# Device-plugin resources that give a pod RDMA devices (InfiniBand, RoCE, EFA).
RDMA_RESOURCE_PREFIXES = ("rdma/", "vpc.amazonaws.com/efa", "nvidia.com/hostdev")
EXAMPLE_FILES = sorted(EXAMPLES.glob("*.yaml"))


def _explain(objs: list[dict[str, Any]]) -> str:
    found, why = level(objs)
    lines = [f"renders at {found}"] + [
        f"  {pod}: {item}" for pod, items in why.items() for item in items
    ]
    return "\n".join(lines)


@pytest.mark.parametrize("values", EXAMPLE_FILES, ids=lambda p: p.name)
def test_each_values_example_states_the_strictest_level_it_passes(values: Path) -> None:
    """`# Pod Security: <level>` at the top of each values-examples file is the strictest
    level that admits every pod the example renders (workers, etcd, the helm test pod)."""
    claim = claimed_level(values.read_text())
    objs = objects(Case(values.name, ELASTIC_JOB, (values,)))
    assert level(objs)[0] == claim, f"{values.name} says {claim}; {_explain(objs)}"


def _requests_rdma(values: Path) -> bool:
    resources = (yaml.safe_load(values.read_text()).get("worker") or {}).get("resources") or {}
    names = [n for part in resources.values() for n in part or {}]
    return any(n.startswith(RDMA_RESOURCE_PREFIXES) for n in names)


RDMA_EXAMPLES = [p for p in EXAMPLE_FILES if _requests_rdma(p)]


def test_the_rdma_examples_are_found() -> None:
    """The RDMA examples (AKS, EKS, on-prem) request a device-plugin RDMA resource."""
    assert {p.name for p in RDMA_EXAMPLES} == {
        "aks-nd-h100-infiniband.yaml",
        "eks-efa.yaml",
        "onprem-infiniband.yaml",
    }


@pytest.mark.parametrize("values", RDMA_EXAMPLES, ids=lambda p: p.name)
def test_rdma_worker_is_non_root_without_added_capabilities(values: Path) -> None:
    """An RDMA example's worker runs as uid 10001 with every capability dropped and none
    added (an added IPC_LOCK is inert for a non-root user and needs "privileged")."""
    objs = objects(Case(values.name, ELASTIC_JOB, (values,)))
    for sts in worker_statefulsets(objs):
        (worker,) = [
            c for c in sts["spec"]["template"]["spec"]["containers"] if c["name"] == "worker"
        ]
        ctx = worker["securityContext"]
        assert (ctx["runAsUser"], ctx["runAsNonRoot"]) == (10001, True)
        assert ctx["capabilities"] == {"drop": ["ALL"]}


@pytest.mark.parametrize("values", RDMA_EXAMPLES, ids=lambda p: p.name)
def test_rdma_examples_name_the_root_fallback_and_it_needs_privileged(values: Path) -> None:
    """Each RDMA example points at the root + IPC_LOCK overlay for nodes that cannot be
    changed; layered over the example it runs the worker as root with IPC_LOCK, and the
    level the overlay states (privileged) is true."""
    assert str(ROOT_FALLBACK.relative_to(EXAMPLES.parent)) in values.read_text()
    objs = objects(Case(values.name, ELASTIC_JOB, (values, ROOT_FALLBACK)))
    claim = claimed_level(ROOT_FALLBACK.read_text())
    assert level(objs)[0] == claim, f"{ROOT_FALLBACK.name} says {claim}; {_explain(objs)}"
    for sts in worker_statefulsets(objs):
        (worker,) = [
            c for c in sts["spec"]["template"]["spec"]["containers"] if c["name"] == "worker"
        ]
        ctx = worker["securityContext"]
        assert ctx["runAsUser"] == 0
        assert ctx["capabilities"] == {"drop": ["ALL"], "add": ["IPC_LOCK"]}


# Test-only values that turn on what only "privileged" admits, on purpose (each says why).
_PRIVILEGED_ON_PURPOSE = {
    "elastic-job:tests/fabric-pod-settings.yaml": "hostNetwork: true",
}
_UNCLAIMED = [
    c
    for c in cases()
    if not c.name.startswith("elastic-job:values-examples/")
    and c.name not in _PRIVILEGED_ON_PURPOSE
    and c.chart != CLUSTER  # runs no pod (next test)
]


@pytest.mark.parametrize("case", [c for c in cases() if c.chart == CLUSTER], ids=str)
def test_the_cluster_chart_runs_no_pod(case: Case) -> None:
    """elastic-job-cluster holds RBAC, monitoring objects and a ConfigMap: no pod to judge."""
    assert not list(pod_templates(objects(case)))


@pytest.mark.parametrize(("name", "why"), sorted(_PRIVILEGED_ON_PURPOSE.items()))
def test_test_values_that_need_privileged_need_it_for_the_stated_reason(
    name: str, why: str
) -> None:
    (case,) = [c for c in cases() if c.name == name]
    objs = objects(case)
    found, reasons = level(objs)
    assert found == "privileged", _explain(objs)
    assert any(why in r for rs in reasons.values() for r in rs), _explain(objs)


@pytest.mark.parametrize("case", _UNCLAIMED, ids=str)
def test_chart_defaults_and_ci_configurations_are_restricted(case: Case) -> None:
    """Every chart's defaults, its ci/*-values.yaml and the test-only values render pods
    that Pod Security "restricted" admits (the cluster chart's render none)."""
    objs = objects(case)
    assert level(objs)[0] == "restricted", _explain(objs)


def test_ipc_lock_on_the_worker_needs_privileged() -> None:
    """The examples' former setting (IPC_LOCK added for uid 10001) is not "baseline"."""
    values = EXAMPLES / "eks-efa.yaml"
    objs = objects(
        Case("eks", ELASTIC_JOB, (values,)),
        extra=("--set-json", 'worker.containerSecurityContext.capabilities.add=["IPC_LOCK"]'),
    )
    assert level(objs)[0] == "privileged"


# --- the evaluator itself: one change to a restricted pod, one control each ------------

_RESTRICTED_POD: dict[str, Any] = {
    "securityContext": {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
    "containers": [
        {
            "name": "c",
            "securityContext": {
                "allowPrivilegeEscalation": False,
                "capabilities": {"drop": ["ALL"]},
            },
        }
    ],
    "volumes": [{"name": "shm", "emptyDir": {"medium": "Memory"}}],
}


def _with(path: str, value: Any) -> dict[str, Any]:
    """The restricted pod with one field set (`a/b/0/c`); value None deletes it."""
    spec = copy.deepcopy(_RESTRICTED_POD)
    *parents, last = path.split("/")
    node: Any = spec
    for key in parents:
        node = node[int(key)] if isinstance(node, list) else node.setdefault(key, {})
    if value is None:
        del node[last]
    elif isinstance(node, list):
        node.append(value)
    else:
        node[last] = value
    return spec


_CTX = "containers/0/securityContext"


@pytest.mark.parametrize(
    ("path", "value", "expected"),
    [
        (f"{_CTX}/capabilities/add", ["IPC_LOCK"], "privileged"),
        (f"{_CTX}/capabilities/add", ["SYS_ADMIN"], "privileged"),
        (f"{_CTX}/capabilities/add", ["CHOWN"], "baseline"),
        (f"{_CTX}/capabilities/add", ["NET_BIND_SERVICE"], "restricted"),
        (f"{_CTX}/capabilities/drop", ["NET_RAW"], "baseline"),
        (f"{_CTX}/privileged", True, "privileged"),
        (f"{_CTX}/allowPrivilegeEscalation", None, "baseline"),
        (f"{_CTX}/allowPrivilegeEscalation", True, "baseline"),
        (f"{_CTX}/runAsNonRoot", False, "baseline"),
        (f"{_CTX}/runAsUser", 0, "baseline"),
        (f"{_CTX}/procMount", "Unmasked", "privileged"),
        (f"{_CTX}/seccompProfile", {"type": "Unconfined"}, "privileged"),
        (f"{_CTX}/seLinuxOptions", {"type": "spc_t"}, "privileged"),
        (f"{_CTX}/appArmorProfile", {"type": "Unconfined"}, "privileged"),
        (f"{_CTX}/windowsOptions", {"hostProcess": True}, "privileged"),
        ("containers/0/ports", [{"containerPort": 80, "hostPort": 80}], "privileged"),
        ("securityContext/runAsNonRoot", None, "baseline"),
        ("securityContext/runAsNonRoot", False, "baseline"),
        ("securityContext/runAsUser", 0, "baseline"),
        ("securityContext/seccompProfile", None, "baseline"),
        ("securityContext/sysctls", [{"name": "net.core.somaxconn", "value": "1"}], "privileged"),
        (
            "securityContext/sysctls",
            [{"name": "net.ipv4.tcp_syncookies", "value": "1"}],
            "restricted",
        ),
        ("hostNetwork", True, "privileged"),
        ("hostPID", True, "privileged"),
        ("hostIPC", True, "privileged"),
        ("volumes/-", {"name": "shm", "hostPath": {"path": "/dev/shm"}}, "privileged"),
        ("volumes/-", {"name": "data", "nfs": {"server": "s", "path": "/"}}, "baseline"),
        ("volumes/-", {"name": "claim", "persistentVolumeClaim": {"claimName": "c"}}, "restricted"),
    ],
)
def test_each_control_sets_the_level(path: str, value: Any, expected: str) -> None:
    """Each Pod Security control moves a restricted pod to the level the standard says."""
    assert pod_level(_RESTRICTED_POD) == "restricted"
    assert pod_level(_with(path, value)) == expected


def test_apparmor_annotation_other_than_runtime_default_needs_privileged() -> None:
    """The AppArmor annotation: runtime/default and localhost/* pass baseline, others do not."""
    key = "container.apparmor.security.beta.kubernetes.io/c"
    assert pod_level(_RESTRICTED_POD, {key: "localhost/p"}) == "restricted"
    assert pod_level(_RESTRICTED_POD, {key: "unconfined"}) == "privileged"


def test_level_is_the_worst_pod_of_the_render() -> None:
    """One privileged pod among restricted ones makes the namespace need privileged."""

    def pod(spec: dict[str, Any], name: str) -> dict[str, Any]:
        return {"kind": "Pod", "metadata": {"name": name}, "spec": spec}

    objs = [pod(_RESTRICTED_POD, "a"), pod(_with("hostNetwork", True), "b")]
    found, why = level(objs)
    assert (found, why["Pod/a"], why["Pod/b"]) == ("privileged", [], ["hostNetwork: true"])


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("# An example.\n#\n# Pod Security: baseline\n\njob: {}\n", "baseline"),
        ("# Pod Security: restricted\njob: {}\n", "restricted"),
    ],
)
def test_claimed_level_reads_the_leading_comment(text: str, expected: str) -> None:
    """The level is read from the comment block before the first key."""
    assert claimed_level(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        "# An example.\njob: {}\n",
        "# Pod Security: strict\njob: {}\n",
        "# Pod Security: restricted\n# Pod Security: baseline\njob: {}\n",
        "job: {}\n# Pod Security: restricted\n",
    ],
)
def test_claimed_level_refuses_a_missing_unknown_or_double_claim(text: str) -> None:
    """No claim, an unknown level, two claims, or one after the first key: an error."""
    with pytest.raises(ValueError, match="Pod Security"):
        claimed_level(text)


# --- docs/rdma.md agrees with the examples ----------------------------------------------

RDMA_DOC = EXAMPLES.parent / "docs" / "rdma.md"


def _anchors(markdown: str) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to dashes."""
    headings = re.findall(r"^#+ (.+)$", markdown, re.MULTILINE)
    return {re.sub(r"[^\w\- ]", "", h).strip().lower().replace(" ", "-") for h in headings}


@pytest.mark.parametrize("values", [*EXAMPLE_FILES, ROOT_FALLBACK], ids=lambda p: p.name)
def test_links_to_docs_rdma_name_existing_sections(values: Path) -> None:
    """Every `docs/rdma.md#section` an example's comments point at is a heading there."""
    anchors = _anchors(RDMA_DOC.read_text())
    for anchor in re.findall(r"docs/rdma\.md#([\w-]+)", values.read_text()):
        assert anchor in anchors, f"{values.name}: docs/rdma.md has no section #{anchor}"


def test_docs_rdma_table_states_the_examples_levels() -> None:
    """docs/rdma.md's table gives, per example (and the root overlay), the level that the
    values file itself states."""
    rows = re.findall(r"^\| (.+) \| .+ \| .+ \| (\w+) \|$", RDMA_DOC.read_text(), re.MULTILINE)
    assert len(rows) == len(RDMA_EXAMPLES) + 1
    for first, stated in rows:
        path = EXAMPLES.parent / re.findall(r"`(values-examples/[^`]+)`", first)[-1]
        assert stated == claimed_level(path.read_text()), first


def test_a_render_without_pods_has_no_level() -> None:
    """A render with no pod is an error, never a vacuous "restricted"."""
    with pytest.raises(ValueError, match="no pods"):
        level([{"kind": "Service", "metadata": {"name": "s"}, "spec": {}}])
