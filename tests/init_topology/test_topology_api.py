"""The console script (a subprocess, as the container runs it) against a real HTTPS server:
the standard library's HTTPS, in-cluster config, the bearer token, CA verification, retries and
every failure the issue names.

No conftest.py in this directory: tests/ has no __init__.py, so a second module named
`conftest` would shadow tests/conftest.py for `from conftest import ...` elsewhere."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from test_topology_mapping import EXPECTED
from topology_helpers import BIN, INIT_TOPOLOGY, Run, read_env_file

from localrun.cluster.apiserver import FakeApiServer
from localrun.cluster.nodes import NODES_DIR, load_nodes

RunInit = Callable[..., Run]

NODE = "cpu-node-01"
DEGRADED = {
    "NODE_NAME": NODE,
    "NODE_CAPACITY_TYPE": "unknown",
    "NODE_FABRIC": "unknown",
    "NODE_TOPOLOGY_SOURCE": "downward-api",
}


#: Every Node fixture, including those no local-run profile names.
ALL_FIXTURES = sorted(path.stem for path in NODES_DIR.glob("*.json"))


@pytest.fixture
def api(tmp_path: Path) -> Iterator[FakeApiServer]:
    nodes = load_nodes(ALL_FIXTURES)
    with FakeApiServer(nodes, workdir=tmp_path / "api", hang_seconds=60) as server:
        yield server


def test_every_node_fixture_has_its_expected_file() -> None:
    assert sorted(EXPECTED) == ALL_FIXTURES


@pytest.fixture
def run_init(tmp_path: Path, api: FakeApiServer) -> Callable[..., Run]:
    """Run the installed console script against `api` with the chart's environment."""

    def run(node_name: str, **overrides: str | None) -> Run:
        """`overrides`: variables to set, or None to remove one."""
        output = tmp_path / "inject" / "env"
        output.parent.mkdir(exist_ok=True)
        env: dict[str, str | None] = {
            "PATH": f"{BIN}:/usr/bin:/bin",
            "NODE_NAME": node_name,
            "POD_NAME": "run42-elastic-job-default-0",
            "POD_NAMESPACE": "default",
            "TOPOLOGY_OUTPUT": str(output),
            "TOPOLOGY_STRICT": "false",
            "TOPOLOGY_TIMEOUT_SECONDS": "10",
            "TOPOLOGY_USER_ENV": "",
            "TOPOLOGY_SERVICEACCOUNT_DIR": str(api.serviceaccount_dir),
            **api.env(),
        }
        env.update(overrides)
        done = subprocess.run(
            [str(INIT_TOPOLOGY)],
            env={k: v for k, v in env.items() if v is not None},
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        return Run(done.returncode, done.stdout, done.stderr, output)

    return run


def assert_clean(run: Run) -> None:
    """Expected outcomes never print a traceback or write to stdout."""
    assert "Traceback" not in run.stderr
    assert run.stdout == ""


def warning(run: Run) -> str:
    lines = [line for line in run.lines if ": warning: " in line or ": error: " in line]
    assert len(lines) == 1, run.stderr
    return lines[0]


@pytest.mark.parametrize("stem", sorted(EXPECTED))
def test_each_fixture_over_https_gives_its_expected_file(
    stem: str, run_init: RunInit, api: FakeApiServer
) -> None:
    name = next(iter(load_nodes([stem])))
    run = run_init(name)
    assert_clean(run)
    assert run.returncode == 0, run.stderr
    assert read_env_file(run.output) == EXPECTED[stem]
    assert run.lines == [line for line in run.lines if ": info: " in line]
    [request] = api.requests
    assert (request.method, request.path, request.status) == ("GET", f"/api/v1/nodes/{name}", 200)
    # The token from the service-account dir.
    assert request.authorization == f"Bearer {api.token}"


def test_chart_label_map_and_user_env_reach_the_file(run_init: RunInit) -> None:
    run = run_init(
        "dgx-a100-r07-n03",
        TOPOLOGY_LABEL_MAP='{"NODE_FABRIC": ["platform.example.com/fabric"], '
        '"NODE_RACK": ["nope.example.com/rack", "platform.example.com/rack"]}',
        TOPOLOGY_USER_ENV="NCCL_IB_DISABLE,MY_VAR",
    )
    assert_clean(run)
    got = read_env_file(run.output)
    assert got["NODE_FABRIC"] == "roce" and got["NODE_RACK"] == "r07"
    assert "NCCL_IB_DISABLE" not in got


def test_403_degrades_with_one_line_naming_cause_and_fix(
    run_init: RunInit, api: FakeApiServer
) -> None:
    api.set_fault(r"^/api/v1/nodes/", 403)
    run = run_init(NODE)
    assert_clean(run)
    assert run.returncode == 0
    line = warning(run)
    assert line.startswith(f'init-topology: warning: cannot read Node "{NODE}": 403 Forbidden: ')
    assert f'User "{api.user}" cannot get resource "nodes"' in line
    # the fix names the cluster chart's value for this pod's own namespace, as a command
    # that works whether the cluster chart is installed yet or not, keeping its other values
    assert "helm upgrade --install --reuse-values elastic-job-cluster " in line, line
    assert f"--set nodeReader.namespaces.{api.namespace}=true" in line, line
    assert read_env_file(run.output) == DEGRADED
    assert len(api.requests) == 1  # permanent: not retried


def test_403_in_strict_mode_fails_with_the_same_line_and_writes_nothing(
    run_init: RunInit, api: FakeApiServer
) -> None:
    api.set_fault(r"^/api/v1/nodes/", 403)
    degraded = warning(run_init(NODE))
    run = run_init(NODE, TOPOLOGY_STRICT="true")
    assert_clean(run)
    assert run.returncode == 3
    line = warning(run)
    assert line.startswith("init-topology: error: ")
    assert line.split(": ", 2)[2].split(" -- ")[0] == degraded.split(": ", 2)[2].split(" -- ")[0]
    assert "TOPOLOGY_STRICT" in line


def test_strict_mode_writes_no_file(run_init: RunInit, api: FakeApiServer) -> None:
    api.set_fault(r"^/api/v1/nodes/", 403)
    run = run_init(NODE, TOPOLOGY_STRICT="true")
    assert run.returncode == 3
    assert not run.output.exists()


def test_404_names_node_name_as_the_fix(run_init: RunInit, api: FakeApiServer) -> None:
    run = run_init("no-such-node")
    assert_clean(run)
    assert run.returncode == 0
    line = warning(run)
    assert 'nodes "no-such-node" not found' in line and "spec.nodeName" in line
    assert read_env_file(run.output)["NODE_NAME"] == "no-such-node"
    assert len(api.requests) == 1


def test_500_is_retried_and_a_recovery_is_success(run_init: RunInit, api: FakeApiServer) -> None:
    api.set_fault(r"^/api/v1/nodes/", 500, times=2)
    run = run_init(NODE)
    assert_clean(run)
    assert run.returncode == 0 and run.lines[-1].startswith("init-topology: info: ")
    assert [r.status for r in api.requests] == [500, 500, 200]
    assert read_env_file(run.output) == EXPECTED["cpu-bare"]


def test_429_is_retried(run_init: RunInit, api: FakeApiServer) -> None:
    api.set_fault(r"^/api/v1/nodes/", 429, times=1)
    run = run_init(NODE)
    assert run.returncode == 0
    assert [r.status for r in api.requests] == [429, 200]


def test_persistent_500_degrades_within_the_budget(run_init: RunInit, api: FakeApiServer) -> None:
    api.set_fault(".*", 500)
    run = run_init(NODE, TOPOLOGY_TIMEOUT_SECONDS="1.5")
    assert_clean(run)
    assert run.returncode == 0
    line = warning(run)
    assert "500 Internal Server Error: Internal error occurred: etcdserver" in line
    assert "attempts in" in line
    assert len(api.requests) >= 2
    assert read_env_file(run.output) == DEGRADED
    strict = run_init(NODE, TOPOLOGY_TIMEOUT_SECONDS="1", TOPOLOGY_STRICT="true")
    assert strict.returncode == 3


def test_a_hanging_api_server_is_bounded_by_the_timeout(
    run_init: RunInit, api: FakeApiServer
) -> None:
    api.set_fault(".*", "hang")
    run = run_init(NODE, TOPOLOGY_TIMEOUT_SECONDS="1.5")
    assert_clean(run)
    assert run.returncode == 0
    line = warning(run)
    assert "no answer from the API server" in line and "timeoutSeconds" in line
    assert read_env_file(run.output) == DEGRADED
    assert run_init(NODE, TOPOLOGY_TIMEOUT_SECONDS="1", TOPOLOGY_STRICT="true").returncode == 3


def test_connection_refused(run_init: RunInit) -> None:
    with socket.socket() as sock:  # a port that was free a moment ago: nothing listens
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    run = run_init(NODE, KUBERNETES_SERVICE_PORT=str(port), TOPOLOGY_TIMEOUT_SECONDS="1")
    assert_clean(run)
    assert run.returncode == 0
    line = warning(run)
    assert f"cannot connect to the API server 127.0.0.1:{port}: connection refused" in line
    assert read_env_file(run.output) == DEGRADED


def test_a_rejected_token_is_401_and_not_retried(
    run_init: RunInit, api: FakeApiServer, tmp_path: Path
) -> None:
    sa = tmp_path / "other-sa"
    shutil.copytree(api.serviceaccount_dir, sa)
    (sa / "token").write_text("not-the-token")
    run = run_init(NODE, TOPOLOGY_SERVICEACCOUNT_DIR=str(sa))
    assert_clean(run)
    assert run.returncode == 0
    assert "401 Unauthorized" in warning(run)
    assert [r.status for r in api.requests] == [401]


def test_a_ca_that_did_not_sign_the_server_fails_tls_once(
    run_init: RunInit, api: FakeApiServer, tmp_path: Path
) -> None:
    with FakeApiServer({}, workdir=tmp_path / "other") as other:
        sa = tmp_path / "other-ca"
        shutil.copytree(api.serviceaccount_dir, sa)
        shutil.copyfile(other.ca_path, sa / "ca.crt")
    run = run_init(NODE, TOPOLOGY_SERVICEACCOUNT_DIR=str(sa))
    assert_clean(run)
    assert run.returncode == 0
    assert "TLS verification of the API server" in warning(run)
    assert api.requests == []


def test_outside_a_pod_it_degrades(run_init: RunInit) -> None:
    run = run_init(NODE, KUBERNETES_SERVICE_HOST=None, KUBERNETES_SERVICE_PORT=None)
    assert_clean(run)
    assert run.returncode == 0
    assert "KUBERNETES_SERVICE_HOST" in warning(run)


def test_without_a_token_it_degrades_and_says_how_to_mount_one(
    run_init: RunInit, tmp_path: Path
) -> None:
    run = run_init(NODE, TOPOLOGY_SERVICEACCOUNT_DIR=str(tmp_path / "missing"))
    assert_clean(run)
    assert run.returncode == 0
    assert "automountServiceAccountToken" in warning(run)


@pytest.mark.parametrize(
    ("env", "needle"),
    [
        (
            {"TOPOLOGY_LABEL_MAP": "{not json"},
            "TOPOLOGY_LABEL_MAP (values: topology.labelMap) is not valid JSON",
        ),
        ({"TOPOLOGY_LABEL_MAP": '["NODE_X"]'}, "must be a JSON object"),
        (
            {"TOPOLOGY_LABEL_MAP": '{"node-rack": ["a"]}'},
            '"node-rack" is not allowed: a variable name must match',
        ),
        ({"TOPOLOGY_LABEL_MAP": '{"PATH": ["a"]}'}, "PATH is not allowed"),
        ({"TOPOLOGY_LABEL_MAP": '{"BASH_ENV": ["a"]}'}, "BASH_ENV is not allowed"),
        (
            {"TOPOLOGY_LABEL_MAP": '{"NODE_RACK": "a"}'},
            "must map to a non-empty list of label keys",
        ),
        ({"TOPOLOGY_LABEL_MAP": '{"NODE_RACK": []}'}, "must map to a non-empty list of label keys"),
        ({"TOPOLOGY_STRICT": "yes"}, 'TOPOLOGY_STRICT must be "true" or "false"'),
        ({"TOPOLOGY_TIMEOUT_SECONDS": "soon"}, "TOPOLOGY_TIMEOUT_SECONDS"),
        ({"TOPOLOGY_TIMEOUT_SECONDS": "0"}, "must be > 0"),
        ({"TOPOLOGY_TIMEOUT_SECONDS": "nan"}, "must be > 0"),
        ({"NODE_NAME": ""}, "NODE_NAME is not set"),
    ],
)
def test_bad_settings_exit_2_with_one_line(
    env: dict[str, str], needle: str, run_init: RunInit, api: FakeApiServer
) -> None:
    run = run_init(env.pop("NODE_NAME", NODE), **env)
    assert_clean(run)
    assert run.returncode == 2
    assert len(run.lines) == 1 and run.lines[0].startswith("init-topology: error: ")
    assert needle in run.lines[0]
    assert not run.output.exists()
    assert api.requests == []


def test_an_unwritable_output_exits_4_with_one_line(run_init: RunInit, tmp_path: Path) -> None:
    run = run_init(NODE, TOPOLOGY_OUTPUT=str(tmp_path / "no-such-dir" / "env"))
    assert_clean(run)
    assert run.returncode == 4
    assert len(run.lines) == 1
    assert "cannot write" in run.lines[-1] and "emptyDir" in run.lines[-1]


def test_a_hostile_label_value_survives_json_the_file_and_sh(
    run_init: RunInit, api: FakeApiServer, tmp_path: Path
) -> None:
    """Kubernetes would reject this label value; the file must not rely on that."""
    marker = tmp_path / "executed"
    value = f"$(touch {marker})'\n`touch {marker}`\\'; touch {marker}; 'é✓\t\"x\"" + "z" * 63
    api.nodes[NODE]["metadata"]["labels"]["example.com/evil"] = value
    run = run_init(NODE, TOPOLOGY_LABEL_MAP='{"NODE_EVIL": ["example.com/evil"]}')
    assert run.returncode == 0, run.stderr
    assert read_env_file(run.output)["NODE_EVIL"] == value
    assert not marker.exists()


def test_label_bytes_are_escaped_in_the_log_and_exact_in_the_file(
    run_init: RunInit, api: FakeApiServer
) -> None:
    """A newline must not split the summary line, nor an escape sequence reach the terminal;
    the env file still holds the label's bytes."""
    model = "H100\ninit-topology: error: forged\x1b[2J\x1b]0;title\x07\x9b31m\u202eok\u2028"
    zone = 'zone a "b" \\c'
    labels = api.nodes[NODE]["metadata"]["labels"]
    labels["nvidia.com/gpu.product"] = model
    labels["topology.kubernetes.io/zone"] = zone
    run = run_init(NODE)
    assert_clean(run)
    assert run.returncode == 0, run.stderr
    [line] = run.lines
    assert line.isprintable()
    # JSON-quoted (so a space or quote cannot blur the key=value list), then what JSON
    # leaves raw (C1, bidi, line separator) escaped by the formatter.
    expected = (
        r'"H100\ninit-topology: error: forged\u001b[2J\u001b]0;title\u0007\x9b31m\u202eok\u2028"'
    )
    assert f"gpu_model={expected} " in line
    assert f"zone={json.dumps(zone)} " in line
    got = read_env_file(run.output)
    assert (got["NODE_GPU_MODEL"], got["NODE_ZONE"]) == (model, zone)


@pytest.mark.parametrize(
    "node_name",
    ["gone\x1b[2J\ninit-topology: info: forged", "Upper.Case", "a_b", "x" * 254, "-a", "a..b"],
)
def test_a_node_name_no_node_can_have_is_refused_in_one_printable_line(
    node_name: str, run_init: RunInit, api: FakeApiServer
) -> None:
    """Refused before any request (the downward API only ever gives a DNS subdomain), and
    whatever it holds, the message stays one line and sends no escape to the terminal."""
    run = run_init(node_name)
    assert_clean(run)
    assert run.returncode == 2
    [line] = run.lines
    assert line.isprintable()
    assert f"init-topology: error: NODE_NAME {node_name!r} is not a Kubernetes node name" in line
    assert "spec.nodeName" in line
    assert api.requests == []


def test_a_node_name_that_is_not_utf8_is_refused_not_a_traceback(
    api: FakeApiServer, tmp_path: Path
) -> None:
    """Python reads undecodable environment bytes as lone surrogates, which neither the
    client's URL quoting nor stderr can encode: they reached a traceback, exit 1."""
    output = tmp_path / "env"
    env = {
        b"PATH": f"{BIN}:/usr/bin:/bin".encode(),
        b"NODE_NAME": b"gone-\xff",
        b"TOPOLOGY_OUTPUT": str(output).encode(),
        b"TOPOLOGY_SERVICEACCOUNT_DIR": str(api.serviceaccount_dir).encode(),
        **{k.encode(): v.encode() for k, v in api.env().items()},
    }
    done = subprocess.run(
        [str(INIT_TOPOLOGY)], env=env, capture_output=True, timeout=120, check=False
    )
    stderr = done.stderr.decode("utf-8")
    assert done.returncode == 2, stderr
    assert "Logging error" not in stderr and "Traceback" not in stderr
    assert stderr.startswith("init-topology: error: NODE_NAME 'gone-\\udcff' is not")


@pytest.mark.parametrize(
    ("path", "value"),
    [
        (("spec",), None),
        (("status",), None),
        (("metadata",), None),
        (("metadata", "labels"), ["nvidia.com/gpu.product=H100"]),
        (("metadata", "labels"), "zone=a"),
        (("metadata", "labels", "topology.kubernetes.io/zone"), 7),
        (("metadata", "annotations"), 3),
        (("status", "allocatable"), [8]),
        (("status", "capacity"), "lots"),
        (("status", "allocatable", "nvidia.com/gpu"), {"n": 8}),
        (("spec", "providerID"), ["aws:///x"]),
    ],
)
def test_a_malformed_node_degrades_as_one_without_those_fields(
    path: tuple[str, ...], value: object, run_init: RunInit, api: FakeApiServer
) -> None:
    node = api.nodes["aks-ndh100-26783410-vmss000003"]
    *parents, last = path
    target = node
    for key in parents:
        target = target[key]
    target[last] = value
    run = run_init("aks-ndh100-26783410-vmss000003")
    assert_clean(run)
    assert run.returncode == 0, run.stderr
    assert [line.split(": ")[1] for line in run.lines] == ["info"], run.stderr
    got = read_env_file(run.output)
    assert got["NODE_NAME"] == "aks-ndh100-26783410-vmss000003"
    assert got["NODE_TOPOLOGY_SOURCE"] == "api"
