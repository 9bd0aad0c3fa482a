"""The chart's rendered init container, run as the kubelet would run it.

`helm template` renders charts/elastic-job with values-examples/cpu-smoke.yaml; the test
takes the `init-topology` init container from the worker StatefulSet and runs ITS command
with ITS env (downward-API fields resolved for a pod on a fixture node, the `kubernetes`
Service variables the kubelet always sets), the service-account token and CA bind-mounted
read-only at /var/run/secrets/kubernetes.io/serviceaccount and the `inject` emptyDir at its
mountPath, inside a private mount namespace (`unshare --mount`), as the pod's user, with a
read-only root filesystem when the container asks for one. Then the file is sourced with
sh. If the chart and the image drift apart (names, paths, env, RBAC fix text), this fails.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from test_topology_mapping import EXPECTED
from topology_helpers import BIN, read_env_file

from localrun.cluster.apiserver import FakeApiServer
from localrun.cluster.nodes import load_nodes
from localrun.cluster.podspec import SERVICEACCOUNT_PATH

RELEASE = "run42"
NAMESPACE = "ml"
NODE_STEM = "local-spot-0"

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("unshare") is None or shutil.which("setpriv") is None,
    reason="needs root, unshare and setpriv (util-linux) for a private mount namespace",
)

# Runs inside `unshare --mount --propagation private`: mounts as the kubelet does, then
# drops to the pod's user and execs the container's command with exactly its env.
#
# Mount targets are never created on the host (the local runner's tests mount at the same
# paths at the same time): the top directory of each (/etc, /run) is covered, in this
# namespace only, by an overlay whose upper layer is a tmpfs, and the target made there.
# Where this machine's interpreter lives in a directory the pod's user cannot enter (pyenv
# under /root), that directory is likewise replaced by a tmpfs holding just the
# interpreter's prefix: the image has its Python in /usr/local.
MOUNT_AND_EXEC = r"""
set -eu
sa=$1 sa_at=$2 inject=$3 inject_at=$4 readonly_root=$5 uid=$6 gid=$7 groups=$8
locked=$9 prefix=${10} scratch=${11}
shift 11
mount -t tmpfs -o mode=0700 tmpfs "$scratch"
overlaid=
for target in "$sa_at" "$inject_at"; do
  top=/$(printf %s "$target" | cut -d/ -f2)
  case " $overlaid " in *" $top "*) ;; *)
    up=$scratch/upper$top work=$scratch/work$top
    mkdir -p "$up" "$work"
    mount -t overlay overlay -o "lowerdir=$top,upperdir=$up,workdir=$work" "$top"
    overlaid="$overlaid $top" ;;
  esac
  mkdir -p "$target"
done
if [ "$locked" != - ]; then
  mkdir "$scratch/interpreter"
  mount --bind "$prefix" "$scratch/interpreter"
  mount -t tmpfs -o mode=0755 tmpfs "$locked"
  mkdir -p "$prefix"
  mount --move "$scratch/interpreter" "$prefix"
fi
mount --bind "$sa" "$sa_at"
mount -o remount,bind,ro "$sa_at"
mount --bind "$inject" "$inject_at"
if [ "$readonly_root" = true ]; then
  mount -o remount,bind,ro /
  for top in $overlaid; do mount -o remount,ro "$top"; done
fi
exec setpriv --reuid="$uid" --regid="$gid" --groups="$groups" --no-new-privs -- "$@"
"""


def locked_interpreter_dir() -> tuple[str, str]:
    """(the outermost directory others cannot enter on the way to the interpreter, its
    prefix), or ("-", "-") when any user can run it."""
    prefix = Path(os.path.realpath(sys.executable)).parents[1]
    for parent in reversed([prefix, *prefix.parents]):
        if not parent.stat().st_mode & stat.S_IXOTH:
            return str(parent), str(prefix)
    return "-", "-"


def render(helm: Path, repo_root: Path, *args: str) -> list[dict[str, Any]]:
    chart = repo_root / "charts" / "elastic-job"
    values = repo_root / "values-examples" / "cpu-smoke.yaml"
    if not (chart / "Chart.yaml").exists() or not values.exists():
        pytest.fail(f"{chart} or {values} is missing: the chart owns them")
    done = subprocess.run(
        [str(helm), "template", RELEASE, str(chart), "-f", str(values), "-n", NAMESPACE, *args],
        capture_output=True,
        text=True,
        check=False,
        cwd=repo_root,
    )
    assert done.returncode == 0, done.stderr
    return [d for d in yaml.safe_load_all(done.stdout) if d]


def worker_statefulset(docs: list[dict[str, Any]]) -> dict[str, Any]:
    for doc in docs:
        if doc["kind"] == "StatefulSet":
            inits = doc["spec"]["template"]["spec"].get("initContainers") or []
            if any(c["name"] == "init-topology" for c in inits):
                return doc
    pytest.fail("no StatefulSet with an init container named init-topology was rendered")


def resolve_env(
    container: dict[str, Any], pod: dict[str, Any], pod_name: str, node_name: str
) -> dict[str, str]:
    """The container's env as the kubelet computes it (value, fieldRef, $(VAR) expansion)."""
    assert "envFrom" not in container, "envFrom is not resolved by this test"
    fields = {
        "metadata.name": pod_name,
        "metadata.namespace": NAMESPACE,
        "metadata.uid": "5c0a5a1e-0000-4000-8000-000000000001",
        "spec.nodeName": node_name,
        "spec.serviceAccountName": pod["spec"].get("serviceAccountName", "default"),
        "status.podIP": "198.18.0.101",
        "status.hostIP": "198.18.0.10",
    }
    env: dict[str, str] = {}
    for item in container.get("env") or []:
        if "value" in item or "valueFrom" not in item:
            value = re.sub(
                r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)",
                lambda m: "$" if m[0] == "$$" else env.get(m[1], m[0]),
                str(item.get("value", "")),
            )
        else:
            ref = item["valueFrom"].get("fieldRef")
            assert ref, f"{item['name']}: only fieldRef is resolved by this test"
            path = ref["fieldPath"]
            label = re.fullmatch(r"metadata\.labels\['(.+)'\]", path)
            value = pod["metadata"]["labels"][label[1]] if label else fields[path]
        env[item["name"]] = value
    return env


def run_init_container(
    helm: Path, repo_root: Path, tmp_path: Path, *helm_args: str, fault: int | None = None
) -> tuple[subprocess.CompletedProcess[str], Path, dict[str, Any], dict[str, str]]:
    docs = render(helm, repo_root, *helm_args)
    sts = worker_statefulset(docs)
    pod = sts["spec"]["template"]
    spec = pod["spec"]
    [init] = [c for c in spec["initContainers"] if c["name"] == "init-topology"]
    assert spec.get("automountServiceAccountToken", True), "the worker pod must mount its token"
    node = load_nodes([NODE_STEM])
    node_name = next(iter(node))
    pod_name = f"{sts['metadata']['name']}-0"
    env = resolve_env(init, pod, pod_name, node_name)

    volumes = {v["name"]: v for v in spec["volumes"]}
    [mount] = [m for m in init["volumeMounts"] if m["name"] == "inject"]
    assert "emptyDir" in volumes["inject"], "inject must be an emptyDir"
    assert not mount.get("readOnly"), "init-topology writes into inject"
    assert {m["name"] for m in init["volumeMounts"]} == {"inject"}
    inject = tmp_path / "inject-volume"
    inject.mkdir()
    inject.chmod(0o777)  # the kubelet creates emptyDirs world-writable
    scratch = tmp_path / "scratch"
    scratch.mkdir()

    pod_sc = spec.get("securityContext") or {}
    sc = init.get("securityContext") or {}
    uid = sc.get("runAsUser", pod_sc.get("runAsUser", 0))
    gid = sc.get("runAsGroup", pod_sc.get("runAsGroup", 0))
    groups = ",".join(str(g) for g in [gid, pod_sc.get("fsGroup")] if g is not None)
    readonly_root = bool(sc.get("readOnlyRootFilesystem"))

    api = FakeApiServer(
        node,
        workdir=tmp_path / "api",
        namespace=NAMESPACE,
        serviceaccount=spec.get("serviceAccountName", "default"),
    )
    with api:
        if fault:
            api.set_fault(r"^/api/v1/nodes/", fault)
        # What the kubelet and the image add: the kubernetes Service (always, whatever
        # enableServiceLinks says), HOSTNAME, HOME for a user without a passwd entry, and
        # the image's PATH (here: the venv where the package is installed).
        container_env = {
            "PATH": f"{BIN}:/usr/local/bin:/usr/bin:/bin",
            "HOSTNAME": pod_name,
            "HOME": "/",
            **api.env(),
            **env,
        }
        command = [*init["command"], *(init.get("args") or [])]
        resolved = shutil.which(command[0], path=container_env["PATH"])
        assert resolved, f"{command[0]} is not on the image's PATH"
        argv = [
            "unshare", "--mount", "--propagation", "private",
            "sh", "-c", MOUNT_AND_EXEC, "sh",
            str(api.serviceaccount_dir), str(Path(SERVICEACCOUNT_PATH).resolve()),
            str(inject), str(Path(mount["mountPath"]).resolve()),
            "true" if readonly_root else "false", str(uid), str(gid), groups,
            *locked_interpreter_dir(), str(scratch),
            "env", "-i", *(f"{k}={v}" for k, v in container_env.items()),
            resolved, *command[1:],
        ]  # fmt: skip
        done = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
    output = inject / Path(env["TOPOLOGY_OUTPUT"]).relative_to(mount["mountPath"])
    return done, output, sts, env


def test_rendered_init_container_writes_the_file_the_worker_reads(
    helm: Path, repo_root: Path, tmp_path: Path
) -> None:
    done, output, sts, env = run_init_container(helm, repo_root, tmp_path)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    assert [line.split(": ")[1] for line in done.stderr.splitlines()] == ["info"], done.stderr

    got = read_env_file(output)
    assert got == EXPECTED[NODE_STEM] | {"NODE_NAME": env["NODE_NAME"]}
    # Written by the pod's user, readable by the worker.
    assert output.stat().st_uid == 65532
    assert output.stat().st_mode & 0o777 == 0o644
    assert [p.name for p in output.parent.iterdir()] == [output.name]

    # The worker reads the same file from the same volume.
    spec = sts["spec"]["template"]["spec"]
    [worker] = [c for c in spec["containers"] if c["name"] == "worker"]
    worker_env = {e["name"]: e.get("value") for e in worker.get("env") or []}
    [wmount] = [m for m in worker["volumeMounts"] if m["name"] == "inject"]
    assert worker_env["ELASTIC_INJECT_ENV"] == env["TOPOLOGY_OUTPUT"]
    assert Path(env["TOPOLOGY_OUTPUT"]).parent == Path(wmount["mountPath"])


def test_worker_env_set_by_the_user_gets_no_default(
    helm: Path, repo_root: Path, tmp_path: Path
) -> None:
    done, output, _, env = run_init_container(
        helm, repo_root, tmp_path, "--set-json", 'worker.env={"NCCL_IB_DISABLE":"0","X":"y"}'
    )
    assert done.returncode == 0, done.stderr
    assert set(env["TOPOLOGY_USER_ENV"].split(",")) == {"NCCL_IB_DISABLE", "X"}
    assert "NCCL_IB_DISABLE" not in read_env_file(output)


def test_strict_chart_value_fails_the_init_container_on_403(
    helm: Path, repo_root: Path, tmp_path: Path
) -> None:
    done, output, _, env = run_init_container(
        helm, repo_root, tmp_path, "--set", "topology.strict=true", fault=403
    )
    assert env["TOPOLOGY_STRICT"] == "true"
    assert done.returncode == 3
    [line] = done.stderr.splitlines()
    assert 'cannot get resource "nodes"' in line and "rbac.nodeReader.enabled" in line
    assert not output.exists()


def test_label_map_from_values_reaches_the_file(
    helm: Path, repo_root: Path, tmp_path: Path
) -> None:
    label_map = {
        "NODE_POOL": ["karpenter.sh/nodepool"],
        "NODE_ZONE": ["topology.kubernetes.io/zone"],
    }
    done, output, _, env = run_init_container(
        helm, repo_root, tmp_path, "--set-json", f"topology.labelMap={json.dumps(label_map)}"
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(env["TOPOLOGY_LABEL_MAP"])["NODE_POOL"] == ["karpenter.sh/nodepool"]
    assert read_env_file(output)["NODE_POOL"] == "workers-spot"
