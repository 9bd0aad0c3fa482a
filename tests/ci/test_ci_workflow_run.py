"""ci/workflows/charts.yaml's steps run here as the workflow runs them (tests/workflow_runner):
the lint job's `helm lint --strict` loop; the kubeconform job's Python packages (from PyPI,
by hash), CRD schemas (ci/fetch-verified taking the pinned CRDs from a local cache) and
renders, with Helm 3 and 4; the install job's steps up to `ct install`, with kubectl
recording what they apply (no API server runs here), so that every kind ct installs is known
to the cluster first. Each step that cannot run here is named below with the reason; the
install job's image build runs with podman as docker in tests/images."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from chart_render import CHARTS, KUBERNETES_VERSIONS, Case, kubernetes_errors, objects
from ci_inputs import CI, WORKFLOW, crd_files
from kubernetes_validate.utils import SchemaNotFoundError
from testlib import HELMS, ROOT, SHARED_CACHE, runner_python
from workflow_runner import Skip, clean_copy, load, run_job

DOWNLOAD = Skip(
    "downloads helm and kubeconform from get.helm.sh and github.com, which this machine "
    "cannot reach: .tools/helm3 or helm4 is `helm` on PATH instead; no kubeconform package"
)
CT = Skip(
    "ct (chart-testing) is a Go binary with no package here: tests/charts/test_lint runs its "
    "parts (helm lint, yamale on Chart.yaml, yamllint)"
)
CT_LINT = "ct lint of the changed charts (helm lint, Chart.yaml schema, yamllint, version bump)"
KUBECONFORM = Skip(
    "kubeconform has no package here: tests/ci/test_ci_kubeconform validates the same renders "
    "against the same schemas"
)


def tool_dir(tmp: Path, helm: Path) -> Path:
    """`helm` as the workflow installs it, on PATH."""
    bin_dir = tmp / "tools"
    bin_dir.mkdir(parents=True, exist_ok=True)
    (bin_dir / "helm").symlink_to(helm)
    return bin_dir


@pytest.fixture(scope="module")
def setup_python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """actions/setup-python's part: a clean Python 3.11 first on PATH (a fresh venv)."""
    return runner_python(tmp_path_factory.mktemp("setup-python") / "venv")


@pytest.mark.slow
def test_the_lint_job_runs_helm_lint_on_every_chart_and_values_file(tmp_path: Path) -> None:
    checkout = clean_copy(ROOT, tmp_path / "checkout")
    run = run_job(
        WORKFLOW, "lint", checkout,
        skip={
            "Install helm (sha256-verified)": DOWNLOAD,
            "helm/chart-testing-action": CT,
            CT_LINT: CT,
        },
        path=[tool_dir(tmp_path, HELMS["helm3"])],
    )  # fmt: skip
    assert not run.failed, run.failed[0].output[-4000:]
    lint = run.step("helm lint --strict")
    assert lint.ran
    charts = sorted(p.parent for p in checkout.glob("charts/*/Chart.yaml"))
    values = [v for c in charts for v in c.glob("ci/*-values.yaml")]
    assert lint.output.count("1 chart(s) linted, 0 chart(s) failed") == len(charts) + len(values)


@pytest.mark.slow
@pytest.mark.parametrize("helm", ["3", "4"])
def test_the_kubeconform_job_makes_the_schemas_and_renders(
    helm: str, setup_python: Path, tmp_path: Path
) -> None:
    """Every step but the downloads and kubeconform itself, as written: the hash-pinned
    Python packages, the pinned CRDs through ci/fetch-verified (from a cache of the same
    bytes), their schemas, and ci/render-all with the matrix's Helm."""
    cache = tmp_path / "cache"
    cache.mkdir()
    for crd in crd_files():
        (cache / crd.name).write_bytes(crd.read_bytes())
    checkout = clean_copy(ROOT, tmp_path / "checkout")
    run = run_job(
        WORKFLOW, "kubeconform", checkout,
        skip={"Install helm and kubeconform (sha256-verified)": DOWNLOAD,
              "kubeconform -strict": KUBECONFORM},
        path=[tool_dir(tmp_path, HELMS[f"helm{helm}"]), setup_python],
        matrix={"kubernetes": "1.35.0", "helm": helm},
        env={"FETCH_VERIFIED_CACHE": str(cache)},
    )  # fmt: skip
    assert not run.failed, run.failed[0].name + "\n" + run.failed[0].output[-4000:]
    ran = [s.name for s in run.steps if s.ran]
    assert ran == [
        "Python packages of ci/crd_schemas.py (by hash)",
        "CRD schemas from the pinned upstream CRDs",
        "Render (defaults, ci/*-values.yaml, values-examples/, test values)",
    ]
    assert len(list((checkout / "crd-schemas").rglob("*.json"))) >= len(crd_files())
    renders = sorted(p.name for p in (checkout / "out").glob("*.yaml"))
    assert "elastic-job-defaults.yaml" in renders and "etcd-rendezvous-defaults.yaml" in renders
    statefulsets = (checkout / "out" / "elastic-job-defaults.yaml").read_text()
    assert "kind: StatefulSet" in statefulsets and "etcd-rendezvous" in statefulsets


def test_an_action_the_test_does_not_name_stops_the_run(tmp_path: Path) -> None:
    """A step added to the workflow with a new action is not skipped silently."""
    workflow = tmp_path / "wf.yaml"
    workflow.write_text(
        "on: push\njobs:\n  j:\n    runs-on: ubuntu-latest\n    steps:\n"
        "      - uses: actions/cache@0123456789012345678901234567890123456789 # v4.0.0\n"
    )
    with pytest.raises(ValueError, match="uses actions/cache: name it in skip"):
        run_job(workflow, "j", tmp_path, skip={}, path=[])


def test_a_failing_step_fails_the_job_and_stops_it(tmp_path: Path) -> None:
    workflow = tmp_path / "wf.yaml"
    workflow.write_text(
        "on: push\njobs:\n  j:\n    runs-on: ubuntu-latest\n    steps:\n"
        "      - name: out\n        id: o\n"
        '        run: echo "v=${{ matrix.x }}" >> "$GITHUB_OUTPUT"\n'
        "      - name: fails\n        if: steps.o.outputs.v == 'a'\n        run: exit 3\n"
        "      - name: never\n        run: touch never\n"
    )
    run = run_job(workflow, "j", tmp_path, skip={}, path=[], matrix={"x": "a"})
    assert [(s.name, s.ran, s.returncode) for s in run.steps] == [
        ("out", True, 0),
        ("fails", True, 3),
    ]
    assert not (tmp_path / "never").exists()


# kubectl as the install job calls it, with no cluster behind it: `apply -f` (a file or a
# directory of them, as kubectl reads it) keeps a copy of what it would create in
# $KUBECTL_APPLIED, in call order; `wait` and `rollout status` succeed; anything else fails,
# so a new kind of call is seen here first.
KUBECTL = """#!{python}
import os, shutil, sys
from pathlib import Path
args = sys.argv[1:]
if "apply" in args:
    out = Path(os.environ["KUBECTL_APPLIED"])
    src = Path(args[args.index("-f") + 1])
    for path in sorted(src.glob("*.yaml")) if src.is_dir() else [src]:
        n = len(list(out.iterdir()))
        shutil.copy(path, out / f"{{n:03d}}-{{path.name}}")
elif "wait" not in args and not {{"rollout", "status"}} <= set(args):
    sys.exit(f"kubectl stand-in: no cluster here for {{args}}")
"""
CT_INSTALL = "ct install (install, helm test, upgrade)"
VOLCANO_STEP = "Install Volcano v1.15.1 (for ci/gang-values.yaml; manifest sha256-verified)"
# What Volcano's installer manifest defines that ct's renders use, for when the manifest
# cannot be fetched (offline): when it can, the step runs and this is checked against it.
VOLCANO_KINDS = {("scheduling.volcano.sh", "PodGroup"), ("scheduling.volcano.sh", "Queue")}


def _volcano_manifest() -> Path | None:
    """The pinned Volcano installer (ci/fetch-verified, cached), None when unreachable."""
    env = load(WORKFLOW)["env"]
    target = SHARED_CACHE / "ci-installers" / f"volcano-{env['VOLCANO_COMMIT']}.yaml"
    if not target.is_file():
        url = (
            "https://raw.githubusercontent.com/volcano-sh/volcano/"
            f"{env['VOLCANO_COMMIT']}/installer/volcano-development.yaml"
        )
        proc = subprocess.run(
            [CI / "fetch-verified", env["VOLCANO_SHA256"], url, target],
            capture_output=True, text=True, check=False, timeout=120,
        )  # fmt: skip
        if proc.returncode != 0:
            return None
    return target


def _defined_kinds(files: list[Path]) -> set[tuple[str, str]]:
    """(group, kind) of every CustomResourceDefinition in `files`."""
    out = set()
    for path in files:
        for doc in yaml.safe_load_all(path.read_text()):
            if doc and doc.get("kind") == "CustomResourceDefinition":
                out.add((doc["spec"]["group"], doc["spec"]["names"]["kind"]))
    return out


def _built_in(obj: dict[str, Any]) -> bool:
    """A kind every supported Kubernetes serves without a CRD (its upstream schema)."""
    try:
        kubernetes_errors(obj, KUBERNETES_VERSIONS[0])
    except SchemaNotFoundError:
        return False
    return True


def _ct_install_cases() -> list[Case]:
    """What `ct install` installs: each chart with each of its ci/*-values.yaml."""
    return [
        Case(f"{chart.name}:ci/{values.name}", chart, (values,))
        for chart in sorted(CHARTS.glob("*/"))
        for values in sorted(chart.glob("ci/*-values.yaml"))
    ]


@pytest.mark.slow
def test_the_install_job_installs_every_kind_ct_installs_first(tmp_path: Path) -> None:
    """`ct install` installs each chart's ci/*-values.yaml into a fresh kind cluster: every
    kind those render is built into Kubernetes or defined by a CRD an earlier step of the
    install job applies (Volcano's PodGroup, prometheus-operator's PodMonitor and
    PrometheusRule). The steps run as written up to ct install, kubectl recording."""
    cache = tmp_path / "cache"
    cache.mkdir()
    for crd in crd_files():
        (cache / crd.name).write_bytes(crd.read_bytes())
    skip = {
        "Install helm (sha256-verified)": DOWNLOAD,
        "helm/chart-testing-action": CT,
        "Changed charts": Skip(CT.reason + "; taken as changed", {"changed": "true"}),
        "helm/kind-action": Skip("no kind here: kubectl records what the steps apply"),
        "Free disk space (the worker image's PyTorch base is large)": Skip(
            "frees a GitHub runner's disk; nothing of the runner's to free here"
        ),
        "Build the images": Skip("tests/images builds them with podman as docker"),
        "Load the images into kind": Skip("no kind here"),
        CT_INSTALL: CT,
    }
    volcano = _volcano_manifest()
    if volcano is None:
        skip[VOLCANO_STEP] = Skip("github.com is unreachable: its kinds are VOLCANO_KINDS")
    else:
        (cache / volcano.name).write_bytes(volcano.read_bytes())
    applied = tmp_path / "applied"
    applied.mkdir()
    tools = tmp_path / "tools"
    tools.mkdir()
    kubectl = tools / "kubectl"
    kubectl.write_text(KUBECTL.format(python=sys.executable))
    kubectl.chmod(0o755)
    checkout = clean_copy(ROOT, tmp_path / "checkout")
    run = run_job(
        WORKFLOW, "install", checkout, skip=skip, path=[tools],
        env={"FETCH_VERIFIED_CACHE": str(cache), "KUBECTL_APPLIED": str(applied)},
    )  # fmt: skip
    assert not run.failed, run.failed[0].name + "\n" + run.failed[0].output[-4000:]
    assert run.steps[-1].name == CT_INSTALL  # so every step that ran came before it
    installed = _defined_kinds(sorted(applied.iterdir()))
    if volcano is None:
        installed |= VOLCANO_KINDS
    else:
        assert installed >= VOLCANO_KINDS, installed
    missing = {}
    for case in _ct_install_cases():
        for obj in objects(case):
            group = str(obj["apiVersion"]).rpartition("/")[0]
            if not _built_in(obj) and (group, obj["kind"]) not in installed:
                missing.setdefault(f"{group}/{obj['kind']}", []).append(case.name)
    assert not missing, f"no step of the install job defines these before ct install: {missing}"
