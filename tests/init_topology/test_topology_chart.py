"""The chart's rendered init container, run as the kubelet would run it.

`helm template` renders charts/elastic-job with values-examples/cpu-smoke.yaml; the test
takes the `init-topology` init container from the worker StatefulSet and runs ITS command
with ITS env (downward-API fields resolved for a pod on a fixture node, the `kubernetes`
Service variables the kubelet always sets), the service-account token and CA bind-mounted
read-only at /var/run/secrets/kubernetes.io/serviceaccount and the `inject` emptyDir at its
mountPath, inside a private mount namespace (`unshare --mount`), as the pod's user, with a
read-only root filesystem when the container asks for one. Then the file is sourced with
sh. If the chart and the image drift apart (names, paths, env, RBAC fix text), this fails.

The pod's user must not need the checkout (a clone may sit under a directory only its
owner can enter: /root, `mktemp -d`). So the program runs from an image-like install made
once per test module: a venv of its own holding a copy of the package and nothing else (the
image has no dependency beyond the standard library), with the console script pyproject.toml
declares. It is bind-mounted at IMAGE_ROOT inside the namespace, so no
directory on the way to the copy has to be open to others either.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import subprocess
import sys
import sysconfig
import venv
from pathlib import Path
from typing import Any

import pytest
import tomllib
import yaml
from test_topology_mapping import EXPECTED
from topology_helpers import read_env_file

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
# drops to the pod's user and execs the container's command with exactly its env, from the
# image's WORKDIR (/).
#
# Mount targets are never created on the host (the local runner's tests mount at the same
# paths at the same time): the top directory of each (/etc, /run, /usr) is covered, in this
# namespace only, by an overlay whose upper layer is a tmpfs, and the target made there.
# Where this machine's interpreter lives in a directory the pod's user cannot enter (pyenv
# under /root), that directory is likewise replaced by a tmpfs holding just the
# interpreter's prefix: the image has its Python in /usr/local.
MOUNT_AND_EXEC = r"""
set -eu
umask 022  # directories made here are the kubelet's and the image's: 0755 whatever ours is
sa=$1 sa_at=$2 inject=$3 inject_at=$4 image=$5 image_at=$6 readonly_root=$7 uid=$8 gid=$9
groups=${10} locked=${11} prefix=${12} scratch=${13}
shift 13
mount -t tmpfs -o mode=0700 tmpfs "$scratch"
overlaid=
for target in "$sa_at" "$inject_at" "$image_at"; do
  top=/$(printf %s "$target" | cut -d/ -f2)
  case " $overlaid " in *" $top "*) ;; *)
    up=$scratch/upper$top work=$scratch/work$top
    mkdir -p "$up" "$work"
    # The overlay's root takes the upper layer's mode and owner: keep the real one's.
    chmod --reference="$top" "$up"
    chown --reference="$top" "$up"
    mount -t overlay overlay -o "lowerdir=$top,upperdir=$up,workdir=$work" "$top"
    overlaid="$overlaid $top" ;;
  esac
  mkdir -p "$target"
done
mount --bind "$sa" "$sa_at"
mount -o remount,bind,ro "$sa_at"
mount --bind "$inject" "$inject_at"
mount --bind "$image" "$image_at"
mount -o remount,bind,ro "$image_at"
# After the binds: the test's temp dir may itself be under the locked directory. The
# interpreter waits on a mountpoint outside it while the tmpfs goes over it.
if [ "$locked" != - ]; then
  held=$image_at.interpreter
  mkdir "$held"
  mount --bind "$prefix" "$held"
  mount -t tmpfs -o mode=0755 tmpfs "$locked"
  mkdir -p "$prefix"
  mount --move "$held" "$prefix"
fi
if [ "$readonly_root" = true ]; then
  mount -o remount,bind,ro /
  for top in $overlaid; do mount -o remount,ro "$top"; done
fi
cd /
exec setpriv --reuid="$uid" --regid="$gid" --groups="$groups" --no-new-privs -- "$@"
"""

#: Where the image-like install is mounted in the namespace (as the image's /usr/local).
IMAGE_ROOT = Path("/usr/local/lib/init-topology-image")
PACKAGE = Path(__file__).resolve().parents[2] / "images" / "init-topology"

# pip's console-script template: what `pip install` writes into the image's bin/.
CONSOLE_SCRIPT = """#!{python}
# -*- coding: utf-8 -*-
import re
import sys
from {module} import {attr}
if __name__ == "__main__":
    sys.argv[0] = re.sub(r"(-script\\.pyw|\\.exe)?$", "", sys.argv[0])
    sys.exit({attr}())
"""


def install_image(dest: Path) -> Path:
    """An install of init-topology as the image has it, in a venv at `dest` whose scripts
    expect to be mounted at IMAGE_ROOT; every file readable by any user."""
    venv.EnvBuilder(symlinks=True, with_pip=False).create(dest)
    site = Path(sysconfig.get_path("purelib", vars={"base": str(dest), "platbase": str(dest)}))
    shutil.copytree(
        PACKAGE / "src" / "init_topology",
        site / "init_topology",
        ignore=shutil.ignore_patterns("__pycache__"),
    )
    scripts = tomllib.loads((PACKAGE / "pyproject.toml").read_text())["project"]["scripts"]
    for script, entry in scripts.items():
        module, _, attr = entry.partition(":")
        path = dest / "bin" / script
        path.write_text(
            CONSOLE_SCRIPT.format(python=IMAGE_ROOT / "bin" / "python", module=module, attr=attr)
        )
    # An image's files are world-readable whatever this user's umask made of the copies.
    for path in [dest, *dest.rglob("*")]:
        if not path.is_symlink():
            executable = path.is_dir() or path.parent.name == "bin" or os.access(path, os.X_OK)
            path.chmod(0o755 if executable else 0o644)
    return dest


@pytest.fixture(scope="module")
def image(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return install_image(tmp_path_factory.mktemp("init-topology") / "image")


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
    helm: Path,
    repo_root: Path,
    tmp_path: Path,
    image: Path,
    *helm_args: str,
    fault: int | None = None,
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
        # The kubelet's token volume is open to the pod's user whatever our umask is.
        api.serviceaccount_dir.chmod(0o755)
        if fault:
            api.set_fault(r"^/api/v1/nodes/", fault)
        # What the kubelet and the image add: the kubernetes Service (always, whatever
        # enableServiceLinks says), HOSTNAME, HOME for a user without a passwd entry, and
        # the image's PATH (here: the image-like install's bin first).
        container_env = {
            "PATH": f"{IMAGE_ROOT / 'bin'}:/usr/local/bin:/usr/bin:/bin",
            "HOSTNAME": pod_name,
            "HOME": "/",
            **api.env(),
            **env,
        }
        command = [*init["command"], *(init.get("args") or [])]
        # `env` looks the command up on the container's PATH, inside the namespace.
        assert shutil.which(command[0], path=image / "bin"), f"{command[0]} is not in the image"
        argv = [
            "unshare", "--mount", "--propagation", "private",
            "sh", "-c", MOUNT_AND_EXEC, "sh",
            str(api.serviceaccount_dir), str(Path(SERVICEACCOUNT_PATH).resolve()),
            str(inject), str(Path(mount["mountPath"]).resolve()),
            str(image), str(IMAGE_ROOT),
            "true" if readonly_root else "false", str(uid), str(gid), groups,
            *locked_interpreter_dir(), str(scratch),
            "env", "-i", *(f"{k}={v}" for k, v in container_env.items()),
            *command,
        ]  # fmt: skip
        done = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
    output = inject / Path(env["TOPOLOGY_OUTPUT"]).relative_to(mount["mountPath"])
    return done, output, sts, env


def test_rendered_init_container_writes_the_file_the_worker_reads(
    helm: Path, repo_root: Path, tmp_path: Path, image: Path
) -> None:
    done, output, sts, env = run_init_container(helm, repo_root, tmp_path, image)
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
    helm: Path, repo_root: Path, tmp_path: Path, image: Path
) -> None:
    done, output, _, env = run_init_container(
        helm, repo_root, tmp_path, image, "--set-json", 'worker.env={"NCCL_IB_DISABLE":"0","X":"y"}'
    )
    assert done.returncode == 0, done.stderr
    assert set(env["TOPOLOGY_USER_ENV"].split(",")) == {"NCCL_IB_DISABLE", "X"}
    assert "NCCL_IB_DISABLE" not in read_env_file(output)


def test_strict_chart_value_fails_the_init_container_on_403(
    helm: Path, repo_root: Path, tmp_path: Path, image: Path
) -> None:
    done, output, _, env = run_init_container(
        helm, repo_root, tmp_path, image, "--set", "topology.strict=true", fault=403
    )
    assert env["TOPOLOGY_STRICT"] == "true"
    assert done.returncode == 3
    [line] = done.stderr.splitlines()
    assert 'cannot get resource "nodes"' in line
    assert f"--set nodeReader.namespaces.{NAMESPACE}=true" in line, line
    assert not output.exists()


def test_label_map_from_values_reaches_the_file(
    helm: Path, repo_root: Path, tmp_path: Path, image: Path
) -> None:
    label_map = {
        "NODE_POOL": ["karpenter.sh/nodepool"],
        "NODE_ZONE": ["topology.kubernetes.io/zone"],
    }
    done, output, _, env = run_init_container(
        helm, repo_root, tmp_path, image, "--set-json", f"topology.labelMap={json.dumps(label_map)}"
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(env["TOPOLOGY_LABEL_MAP"])["NODE_POOL"] == ["karpenter.sh/nodepool"]
    assert read_env_file(output)["NODE_POOL"] == "workers-spot"
