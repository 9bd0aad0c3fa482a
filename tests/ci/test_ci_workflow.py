"""ci/workflows/charts.yaml, the workflow users copy: valid for GitHub Actions, every
action pinned by commit, every download checked by sha256, and its pins and matrix the
ones this project tests with."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml
from chart_render import KUBERNETES_VERSIONS
from ci_inputs import CI, CRD_PINS, WORKFLOW, crd_files, crd_pins, sha256
from testlib import ROOT, UPSTREAM_CRDS

VENV_BIN = ROOT / ".venv" / "bin"
SHA = re.compile(r"^[0-9a-f]{64}$")


def _workflow() -> dict[Any, Any]:
    workflow: dict[Any, Any] = yaml.safe_load(WORKFLOW.read_text())
    return workflow


def _steps() -> list[dict[str, Any]]:
    return [step for job in _workflow()["jobs"].values() for step in job["steps"]]


def test_workflow_is_a_valid_github_actions_workflow() -> None:
    """check-jsonschema's vendored GitHub workflow schema accepts it."""
    proc = subprocess.run(
        [VENV_BIN / "check-jsonschema", "--builtin-schema", "vendor.github-workflows", WORKFLOW],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_every_action_is_pinned_by_commit_with_its_tag_in_a_comment() -> None:
    """`uses: owner/repo@<40 hex> # vX.Y.Z`: a moved tag cannot change what runs."""
    lines = [ln.strip() for ln in WORKFLOW.read_text().splitlines() if "uses:" in ln]
    assert lines
    for line in lines:
        assert re.fullmatch(r"(- )?uses: [\w.-]+/[\w.-]+@[0-9a-f]{40} # v\d+\.\d+\.\d+", line), line


def test_every_download_goes_through_fetch_verified() -> None:
    """No curl/wget/helm repo in a run step: downloads use ci/fetch-verified with a pinned
    sha256 (a SHA256 env value), and Volcano is one release at a commit."""
    env = _workflow()["env"]
    for step in _steps():
        run = step.get("run", "")
        assert not re.search(r"\b(curl|wget)\b|helm repo add", run), run
        for match in re.finditer(r"ci/fetch-verified (\S+)", run):
            assert re.fullmatch(r'"\$(\w+_SHA256|sum)"|--list', match[1]), match[0]
    sums = {k: v for k, v in env.items() if k.endswith("_SHA256")}
    assert len(sums) == 4 and all(SHA.match(v) for v in sums.values()), sums
    assert re.fullmatch(r"[0-9a-f]{40}", env["VOLCANO_COMMIT"])
    volcano = next(s for s in _steps() if "Volcano" in s.get("name", ""))
    assert "$VOLCANO_SHA256" in volcano["run"] and "$VOLCANO_COMMIT" in volcano["run"]


def test_helm_versions_are_the_ones_bootstrap_installs() -> None:
    """The workflow renders with the Helm 3 and 4 releases bootstrap takes first, checked
    against the same official sha256."""
    bootstrap = (ROOT / "scripts" / "bootstrap").read_text()
    env = _workflow()["env"]
    for major in ("3", "4"):
        for key in (f"HELM{major}_VERSION", f"HELM{major}_SHA256"):
            want = re.search(rf"^{key}=(\S+)$", bootstrap, re.MULTILINE)
            assert want and env[key] == want[1], key


def test_kubeconform_matrix_is_the_tested_kubernetes_minors() -> None:
    """The matrix equals tests/charts' KUBERNETES_VERSIONS, with Helm 3 and 4."""
    matrix = _workflow()["jobs"]["kubeconform"]["strategy"]["matrix"]
    assert matrix["kubernetes"] == [f"{v}.0" for v in KUBERNETES_VERSIONS]
    assert matrix["helm"] == ["3", "4"]


def test_kubeconform_step_uses_the_scripts_the_tests_run() -> None:
    """The step validates ci/render-all's output with ci/crd_schemas.py's layout and does not
    ignore missing schemas."""
    runs = "\n".join(s.get("run", "") for s in _workflow()["jobs"]["kubeconform"]["steps"])
    assert "ci/fetch-verified --list ci/crds.sha256 crds" in runs
    assert "ci/crd_schemas.py crd-schemas crds/*.yaml" in runs
    assert "ci/render-all out" in runs
    assert "'crd-schemas/{{.Group}}/{{.ResourceKind}}_{{.ResourceAPIVersion}}.json'" in runs
    assert "-strict" in runs and "ignore-missing-schemas" not in runs


def test_crd_pins_are_the_upstream_files_the_tests_use() -> None:
    """Each ci/crds.sha256 entry is a raw file at a 40-hex commit whose bytes are those of
    ../shared/crds; every CRD the chart tests fetch (testlib.UPSTREAM_CRDS) is pinned."""
    pins = crd_pins()
    for pin in pins:
        assert SHA.match(pin.sha256), pin
        assert re.match(
            r"https://raw\.githubusercontent\.com/[\w.-]+/[\w.-]+/[0-9a-f]{40}/", pin.url
        )
    for local, pin in zip(crd_files(), pins, strict=True):
        assert sha256(local) == pin.sha256, (local, pin)
    urls = {pin.url for pin in pins}
    for name, (repo_at_commit, path) in UPSTREAM_CRDS.items():
        url = f"https://raw.githubusercontent.com/{repo_at_commit}/{path}"
        assert url in urls, f"{name}: add '<sha256>  {url}' to {CRD_PINS.relative_to(ROOT)}"


def _fetch(*args: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [CI / "fetch-verified", *map(str, args)], capture_output=True, text=True, check=False
    )


def test_fetch_verified_keeps_a_file_whose_sha256_matches(tmp_path: Path) -> None:
    src = tmp_path / "tool.tar.gz"
    src.write_bytes(b"release bytes")
    dest = tmp_path / "out" / "tool.tar.gz"
    proc = _fetch(sha256(src), src.as_uri(), dest)
    assert proc.returncode == 0, proc.stderr
    assert dest.read_bytes() == b"release bytes"


def test_fetch_verified_refuses_a_changed_file_and_names_it(tmp_path: Path) -> None:
    """A tampered or re-tagged download fails, is not left behind, and the error names the
    URL and both sums."""
    src = tmp_path / "tool.tar.gz"
    src.write_bytes(b"release bytes")
    pinned = sha256(src)
    src.write_bytes(b"something else")
    dest = tmp_path / "tool-copy.tar.gz"
    proc = _fetch(pinned, src.as_uri(), dest)
    assert proc.returncode == 1
    assert not dest.exists() and not dest.with_name(dest.name + ".part").exists()
    assert src.as_uri() in proc.stderr and pinned in proc.stderr and sha256(src) in proc.stderr


def test_fetch_verified_list_mode_fetches_each_pinned_line(tmp_path: Path) -> None:
    files = []
    for name in ("a_crds.yaml", "b_crds.yaml"):
        path = tmp_path / "src" / name
        path.parent.mkdir(exist_ok=True)
        path.write_text(f"{name}\n")
        files.append(path)
    pins = tmp_path / "pins"
    pins.write_text("# comment\n\n" + "".join(f"{sha256(p)}  {p.as_uri()}\n" for p in files))
    proc = _fetch("--list", pins, tmp_path / "crds")
    assert proc.returncode == 0, proc.stderr
    assert sorted(p.name for p in (tmp_path / "crds").iterdir()) == ["a_crds.yaml", "b_crds.yaml"]


def test_render_all_stops_at_a_values_file_that_does_not_render(
    helm3: Path, tmp_path: Path
) -> None:
    """A values example the chart refuses fails the workflow's render step with helm's
    message, instead of leaving an empty file for kubeconform to pass."""
    repo = tmp_path / "repo"
    shutil.copytree(ROOT / "charts", repo / "charts", symlinks=True)
    shutil.copytree(ROOT / "ci", repo / "ci")
    shutil.copytree(ROOT / "values-examples", repo / "values-examples")
    (repo / "values-examples" / "zz-bad.yaml").write_text("job:\n  minNodes: 5\n  maxNodes: 2\n")
    proc = subprocess.run(
        [repo / "ci" / "render-all", tmp_path / "out"],
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin", "HELM": str(helm3), "HOME": str(tmp_path)},
        check=False,
        timeout=300,
    )
    assert proc.returncode != 0
    assert "job.minNodes (5) is greater than job.maxNodes (2)" in proc.stderr


def test_crd_schemas_refuses_a_file_without_a_crd(tmp_path: Path) -> None:
    """A pin pointing at the wrong file (not a CRD) is an error naming it."""
    wrong = tmp_path / "not-a-crd.yaml"
    wrong.write_text("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n")
    proc = subprocess.run(
        [sys.executable, CI / "crd_schemas.py", tmp_path / "out", wrong],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode != 0
    assert f"{wrong}: no CustomResourceDefinition in it" in proc.stderr
