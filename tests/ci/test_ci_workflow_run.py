"""ci/workflows/charts.yaml's steps run here as the workflow runs them (tests/workflow_runner):
the lint job's `helm lint --strict` loop; the kubeconform job's Python packages (from PyPI,
by hash), CRD schemas (ci/fetch-verified taking the pinned CRDs from a local cache) and
renders, with Helm 3 and 4. Each step that cannot run here is named below with the reason;
the install job's image build runs with podman as docker in tests/images."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from ci_inputs import WORKFLOW, crd_files
from testlib import HELMS, ROOT
from workflow_runner import Skip, clean_copy, run_job

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
    venv = tmp_path_factory.mktemp("setup-python") / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    return venv / "bin"


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
