"""elastic-job behaves as kubectl does where a user expects it to: it ends within
--request-timeout on an API server that accepts and never answers (a real socket, and the
fake API server's hang), says "connection refused" (not a timeout) where nothing listens, a
quiet watch is not a timeout, a kubeconfig that cannot be read
is one line and exit 2, KUBECONFIG's files are merged as kubectl merges them, `-o yaml`
wherever `-o json` is, and `--version`."""

from __future__ import annotations

import base64
import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import urllib3
import yaml
from cli_cluster import NS, add_release, pod, run, write_kubeconfig
from elastic_job_cli import cli, kube, options
from testlib import ROOT

from localrun.cluster.apiserver import FakeApiServer
from localrun.cluster.nodes import load_nodes

CLI = [sys.executable, "-m", "elastic_job_cli.cli"]
EXIT_UNREACHABLE = kube.EXIT_UNREACHABLE


@pytest.fixture
def api(tmp_path: Path) -> Iterator[FakeApiServer]:
    with FakeApiServer(load_nodes("local"), workdir=tmp_path / "api", namespace=NS) as server:
        add_release(server, NS, "run42", 2)
        server.publish_pods(
            NS, [pod(f"run42-elastic-job-default-{i}", "local-spot-0") for i in range(2)]
        )
        yield server


@pytest.fixture
def kubeconfig(api: FakeApiServer, tmp_path: Path) -> str:
    return write_kubeconfig(api, tmp_path / "kubeconfig")


class Mute:
    """A TCP server that accepts every connection and never reads or writes a byte (a
    kube-apiserver wedged behind its listen socket, a load balancer with no backend)."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.accepted: list[float] = []  # time.time() of each connection
        self.held: list[socket.socket] = []
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.sock.getsockname()[1]}"

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted.append(time.time())
            self.held.append(conn)

    def close(self) -> None:
        self.sock.close()
        for c in self.held:
            c.close()


def _run_cli(*args: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    """The command in a process of its own (KUBECONFIG from `env`)."""
    done = subprocess.run(
        [*CLI, *args], capture_output=True, text=True, timeout=60, check=False, env=env
    )
    return done.returncode, done.stdout, done.stderr


def _run_timed(*args: str) -> tuple[int, list[tuple[float, str]], float]:
    """The command in a process of its own: its exit code, each stderr line with the
    time.time() it was read, and the time.time() it exited."""
    proc = subprocess.Popen(
        [*CLI, *args], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    assert proc.stderr is not None
    lines = [(time.time(), line.rstrip("\n")) for line in proc.stderr]
    code = proc.wait(60)
    return code, lines, time.time()


@pytest.mark.parametrize("where", ["no TLS answer", "no HTTP answer"])
def test_a_server_that_never_answers_ends_the_command_within_the_request_timeout(
    where: str, api: FakeApiServer, tmp_path: Path
) -> None:
    """Before: the client dropped the 15 s float timeout, and the command hung for ever."""
    cfg = api.kubeconfig(NS)
    mute = Mute()
    if where == "no TLS answer":
        cfg["clusters"][0]["cluster"]["server"] = mute.url
        server = mute.url
    else:
        api.set_fault(".*", "hang")  # TLS completes; the request is read and never answered
        server = api.url
    path = tmp_path / "kubeconfig"
    path.write_text(json.dumps(cfg))
    timeout = 1.5
    try:
        code, lines, ended = _run_timed(
            "--kubeconfig", str(path), "--request-timeout", "1500ms", "status", "run42"
        )
    finally:
        mute.close()
    assert code == EXIT_UNREACHABLE, lines
    assert [line for _, line in lines] == [
        f"elastic-job: the API server at {server} did not answer within 1.5s "
        "(--request-timeout): check that it is up (kubectl cluster-info), or pass a longer "
        "--request-timeout"
    ]
    # From the server's first sight of the request to the command's line: the timeout,
    # once (a retry would make it twice), with 1 s for a loaded machine.
    asked = mute.accepted if where == "no TLS answer" else [r.time for r in api.requests]
    waited = lines[0][0] - asked[0]
    assert timeout * 0.9 <= waited <= timeout + 1.0, waited
    assert len(asked) == 1  # not asked again
    assert ended - lines[0][0] < 5  # and the process ends with it (the interpreter's exit)


def _closed_port() -> int:
    """A loopback port where nothing listens (bound, then closed: the kernel refuses it)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


@pytest.mark.parametrize("via", ["--kubeconfig", "KUBECONFIG"])
def test_a_refused_connection_is_said_to_be_refused_not_a_timeout(
    via: str, api: FakeApiServer, tmp_path: Path
) -> None:
    """A server where nothing listens: one line that says the connection was refused and
    where the address came from (file, context), at once. Before: "did not answer within
    30s (--request-timeout)" after 1.7 s (urllib3's NewConnectionError, which a refusal
    raises, is a subclass of its ConnectTimeoutError)."""
    cfg = api.kubeconfig(NS)
    server = f"https://127.0.0.1:{_closed_port()}"
    cfg["clusters"][0]["cluster"]["server"] = server
    path = tmp_path / "kubeconfig"
    path.write_text(json.dumps(cfg))
    args = ["--kubeconfig", str(path)] if via == "--kubeconfig" else []
    env = {**os.environ, "KUBECONFIG": str(path)}
    started = time.monotonic()
    code, out, err = _run_cli(*args, "status", "run42", env=env)
    assert (code, out) == (EXIT_UNREACHABLE, "")
    source = f"--kubeconfig {path}" if via == "--kubeconfig" else f"KUBECONFIG={path}"
    assert err.splitlines() == [
        f"elastic-job: connection refused: is the API server at {server} up? (kubeconfig "
        f"{source}, context {cfg['current-context']}): check --context and --kubeconfig "
        "(kubectl cluster-info)"
    ]
    assert time.monotonic() - started < 20  # no wait for the 30 s default timeout


def test_a_listening_server_that_never_answers_is_a_timeout_not_a_refusal(
    api: FakeApiServer, tmp_path: Path
) -> None:
    """The other side of the line above: a socket that accepts and stays silent (the
    default 30 s shortened to 1 s) is a timeout, never "refused"."""
    cfg = api.kubeconfig(NS)
    mute = Mute()
    cfg["clusters"][0]["cluster"]["server"] = server = mute.url
    path = tmp_path / "kubeconfig"
    path.write_text(json.dumps(cfg))
    try:
        code, _, err = _run_cli("--kubeconfig", str(path), "--request-timeout", "1s", "list")
    finally:
        mute.close()
    assert code == EXIT_UNREACHABLE
    assert err.startswith(f"elastic-job: the API server at {server} did not answer within 1s")
    assert "refused" not in err


@pytest.mark.parametrize(
    ("error", "kind"),
    [
        (ConnectionRefusedError(111, "Connection refused"), kube.REFUSED),
        (socket.gaierror(-2, "Name or service not known"), kube.NO_HOST),
        (OSError(113, "No route to host"), kube.OTHER),
    ],
)
def test_a_connection_that_could_not_be_made_is_told_from_a_timeout(
    error: OSError, kind: str
) -> None:
    """What urllib3 raises when the socket fails (its NewConnectionError, and the
    NameResolutionError it derives from it, raised from the socket's error), through the
    retry's MaxRetryError: the socket's error decides, not urllib3's class (a timeout)."""
    conn = urllib3.connection.HTTPSConnection("api.example", 6443)
    if isinstance(error, socket.gaierror):
        new: Exception = urllib3.exceptions.NameResolutionError("api.example", conn, error)
    else:
        new = urllib3.exceptions.NewConnectionError(conn, f"Failed to connect: {error}")
    new.__cause__ = error
    wrapped = urllib3.exceptions.MaxRetryError(None, "/api/v1/pods", new)  # type: ignore[arg-type]
    assert kube.failure(wrapped) == kind
    timed_out = urllib3.exceptions.ConnectTimeoutError(conn, "timed out")
    assert kube.failure(urllib3.exceptions.MaxRetryError(None, "/", timed_out)) == kube.TIMEOUT  # type: ignore[arg-type]


def test_a_quiet_watch_is_not_a_timeout(
    api: FakeApiServer, kubeconfig: str, tmp_path: Path
) -> None:
    """`events -w` with a 1 s request timeout waits 3 s on a watch with nothing to say, and
    prints the next event: the timeout bounds the wait for an answer, not a stream."""
    out = tmp_path / "events.txt"
    proc = subprocess.Popen(
        [*CLI, "--kubeconfig", kubeconfig, "--request-timeout", "1s", "events", "run42", "-w"],
        stdout=out.open("w"), stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        time.sleep(4)
        assert proc.poll() is None, proc.communicate()[1]
        api.add_event(
            {
                "metadata": {"namespace": NS},
                "involvedObject": {"kind": "Pod", "name": "run42-elastic-job-default-0"},
                "reason": "Reformed",
                "message": "re-formed at world size 2 after 3.0 s",
                "type": "Normal",
                "lastTimestamp": "2026-11-23T10:06:00Z",
            }
        )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and "Reformed" not in out.read_text():
            time.sleep(0.2)
        assert "Reformed" in out.read_text()
        assert proc.poll() is None
    finally:
        proc.terminate()
        proc.wait(10)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("0", None), ("5", 5.0), ("5s", 5.0), ("1m", 60.0), ("1m30s", 90.0), ("250ms", 0.25),
     ("1.5h", 5400.0), ("3h", 10800.0), ("0s", None)],
)  # fmt: skip
def test_request_timeout_takes_kubectls_syntax(text: str, seconds: float | None) -> None:
    assert options.request_timeout(text) == seconds


@pytest.mark.parametrize("bad", ["-1s", "5x", "s", "", "1 m", "ten"])
def test_a_bad_request_timeout_is_a_usage_error(
    bad: str, kubeconfig: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        cli.main(["--kubeconfig", kubeconfig, f"--request-timeout={bad}", "status", "run42"])
    err = capsys.readouterr().err
    assert exc.value.code == 2
    assert f"invalid timeout value {bad!r}" in err and "(e.g. 1s | 2m | 3h)" in err


def test_the_default_request_timeout_is_the_documented_one() -> None:
    args = cli.build_parser().parse_args(["status", "run42"])
    assert args.request_timeout == 30.0 == options.request_timeout(options.DEFAULT_REQUEST_TIMEOUT)
    readme = (ROOT / "packages/elastic-job-cli/README.md").read_text()
    assert f"default {options.DEFAULT_REQUEST_TIMEOUT}" in readme
    # after the subcommand, as kubectl takes flags anywhere
    args = cli.build_parser().parse_args(["status", "run42", "--request-timeout", "0"])
    assert args.request_timeout is None


# -- kubeconfig -----------------------------------------------------------------------------


def _ca(api: FakeApiServer) -> str:
    return str(api.kubeconfig(NS)["clusters"][0]["cluster"]["certificate-authority-data"])


MALFORMED: dict[str, tuple[str, str]] = {
    # name: (file text, what the one line says)
    "not YAML": ("clusters: [\n  - name: a\n  server: x\n", "not valid YAML at line 2"),
    "a list": ("- clusters\n- users\n", "a kubeconfig is a mapping"),
    "clusters not a list": ("clusters: {name: a}\n", "clusters must be a list of entries"),
    "a user without a name": ("users:\n- user: {token: t}\n", "users[0] has no name"),
    "a context that is a string": (
        "contexts:\n- name: c\n  context: oops\n",
        "contexts[0] (c): context must be a mapping",
    ),
    "no current context": ("apiVersion: v1\nkind: Config\n", "sets no current-context"),
    "current context missing": (
        "current-context: gone\ncontexts: []\n",
        "current-context 'gone' is not a context of",
    ),
    "certificate data not base64": (
        "current-context: c\ncontexts:\n- name: c\n  context: {cluster: k, user: u}\n"
        "clusters:\n- name: k\n  cluster: {server: 'https://127.0.0.1:1', "
        "certificate-authority-data: '%%% not base64'}\nusers:\n- name: u\n  user: {token: t}\n",
        "context 'c'",
    ),
    "a cluster the context does not find": (
        "current-context: c\ncontexts:\n- name: c\n  context: {cluster: nowhere, user: u}\n"
        "users:\n- name: u\n  user: {token: t}\n",
        "nowhere",
    ),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_a_kubeconfig_that_cannot_be_read_is_one_line_and_exit_2(
    case: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before: a traceback (yaml's, the client's) and exit 1 for most of them."""
    text, said = MALFORMED[case]
    path = tmp_path / "config"
    path.write_text(text)
    code, out, err = run(str(path), "status", "run42", capsys=capsys)
    assert (code, out) == (2, "")
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("elastic-job: no cluster access: "), err
    assert said in lines[0] and str(path) in lines[0], lines[0]


def _entry(section: str, name: str, body: dict[str, Any]) -> dict[str, Any]:
    key = {"clusters": "cluster", "users": "user", "contexts": "context"}[section]
    return {"name": name, key: body}


def test_kubeconfig_files_are_merged_as_kubectl_merges_them(
    api: FakeApiServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """KUBECONFIG=missing:first:second:third. The first file to name an entry keeps it whole
    (second's user and cluster of the same names are wrong and must not be used); the
    current context is the first one set (second's, not third's); a relative
    certificate-authority is relative to its own file; a missing path is skipped.
    Before: only the first path was read (here a missing one: in-cluster config, refused)."""
    first_dir, other = tmp_path / "first", tmp_path / "other"
    first_dir.mkdir()
    other.mkdir()
    (first_dir / "ca.crt").write_bytes(base64.b64decode(_ca(api)))
    relative_ca = {"server": api.url, "certificate-authority": "ca.crt"}
    first = {
        "clusters": [_entry("clusters", "k", relative_ca)],
        "users": [_entry("users", "u", {"token": api.token})],
        "contexts": [_entry("contexts", "work", {"cluster": "k", "user": "u", "namespace": NS})],
    }  # fmt: skip
    second = {
        "current-context": "work",
        "clusters": [_entry("clusters", "k", {"server": "https://127.0.0.1:1"})],
        "users": [_entry("users", "u", {"token": "wrong"})],
        "contexts": [_entry("contexts", "work", {"cluster": "k", "user": "u", "namespace": "x"}),
                     _entry("contexts", "elsewhere", {"cluster": "k", "user": "u"})],
    }  # fmt: skip
    third = {"current-context": "elsewhere"}
    paths = [tmp_path / "missing", first_dir / "config", other / "second", other / "third"]
    for p, data in zip(paths[1:], (first, second, third), strict=True):
        p.write_text(yaml.safe_dump(data))
    env = {**os.environ, "KUBECONFIG": os.pathsep.join(str(p) for p in paths)}
    code, out, err = _run_cli("status", "run42", "-o", "json", env=env)
    assert code == 0, err
    assert json.loads(out)["namespace"] == NS  # the first file's context "work"
    # --context picks a context any file names; its cluster and user are still the first's
    code, _, err = _run_cli("--context", "elsewhere", "-n", NS, "status", "run42", env=env)
    assert code == 0, err
    code, _, err = _run_cli("--context", "nope", "status", "run42", env=env)
    assert code == 2 and "--context 'nope' is not a context of KUBECONFIG=" in err
    assert "its contexts: work, elsewhere" in err
    code, _, err = _run_cli("status", "run42", env={**env, "KUBECONFIG": str(paths[0])})
    assert code == 2 and f"KUBECONFIG={paths[0]} names no file that exists" in err, err


# -- output ---------------------------------------------------------------------------------


def test_yaml_wherever_json(
    api: FakeApiServer, kubeconfig: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    prices = tmp_path / "prices.yaml"
    prices.write_text("prices:\n  c-4x-amd64-linux:\n    spot: 0.1\n    on-demand: 0.4\n")
    for args in (["status", "run42"], ["cost", "run42", "--prices", str(prices)], ["list"]):
        code, as_json, _ = run(kubeconfig, *args, "-o", "json", capsys=capsys)
        assert code == 0
        code, as_yaml, _ = run(kubeconfig, *args, "-o", "yaml", capsys=capsys)
        assert code == 0
        mine, theirs = yaml.safe_load(as_yaml), json.loads(as_json)
        for volatile in ("age_seconds",):  # list: measured at each run
            for item in [*mine.get("items", []), *theirs.get("items", [])]:
                item.pop(volatile)
        if args[0] == "cost":  # priced up to now: the hours grow between the two runs
            assert mine.keys() == theirs.keys()
        else:
            assert mine == theirs, args
    api.add_event(
        {
            "metadata": {"namespace": NS},
            "involvedObject": {"kind": "Pod", "name": "run42-elastic-job-default-0"},
            "reason": "Reformed",
            "message": "re-formed at world size 2 after 3.0 s",
            "type": "Normal",
            "lastTimestamp": "2026-11-23T10:06:00Z",
        }
    )
    _, lines, _ = run(kubeconfig, "events", "run42", "-o", "json", capsys=capsys)
    _, docs, _ = run(kubeconfig, "events", "run42", "-o", "yaml", capsys=capsys)
    assert docs.startswith("---\n")
    assert list(yaml.safe_load_all(docs)) == [json.loads(line) for line in lines.splitlines()]


def test_the_exit_codes_are_the_documented_ones() -> None:
    readme = " ".join((ROOT / "packages/elastic-job-cli/README.md").read_text().split())
    usage = " ".join((cli.__doc__ or "").split())
    for said in (
        f"{kube.EXIT_USAGE} usage or no cluster access",
        f"{kube.EXIT_NOT_FOUND} no such release",
        f"{kube.EXIT_FORBIDDEN} not allowed",
        f"{kube.EXIT_UNREACHABLE} API server unreachable or not answering within",
    ):
        assert said in readme and said in usage, said


def test_version_is_the_release_number(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        cli.main(["--version"])
    assert exc.value.code == 0
    said = capsys.readouterr().out
    version = (ROOT / "VERSION").read_text().strip()
    assert said.startswith(f"elastic-job {version} (kubernetes client ")
    code, out, _ = _run_cli("--version")
    assert code == 0 and out == said
