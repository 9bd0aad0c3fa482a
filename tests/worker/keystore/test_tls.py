"""TLS to the rendezvous: the worker's own etcd client uses the settings the chart gives
torch (ELASTIC_RDZV_CONF protocol, ca_cert, ssl_cert, ssl_cert_key), against a real etcd
serving HTTPS only, with and without client-certificate auth; a refusal is one line."""

from __future__ import annotations

import contextlib
import re
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from charts.chart_render import (
    ELASTIC_JOB,
    TEST_VALUES,
    container,
    env_of,
    etcd_statefulset,
    objects,
)
from charts.chart_render import worker_statefulsets as rendered_worker_statefulsets
from elastic_worker import completion
from elastic_worker.gate import members, probes
from elastic_worker.keystore import etcdv2
from elastic_worker.recovery import generations
from elastic_worker.settings import config
from testlib import ETCD_VERSIONS, EtcdServer

from worker.etcd_tls import Pki, make_pki, start_tls_etcd, tls_flags
from worker.worker_helpers import WORKER, Agent, worker_env

# The chart's two TLS configurations: server TLS (the bundled etcd's certificate from a
# Secret), and mutual TLS (tests/charts/values/tls-everything-on.yaml: client certificates).
SERVER_TLS = (
    "rendezvous.tls.enabled=true",
    "rendezvous.tls.caSecret=etcd-ca",
    "etcd-rendezvous.tls.enabled=true",
    "etcd-rendezvous.tls.existingSecret=etcd-server",
)
MUTUAL_TLS_VALUES = TEST_VALUES / "tls-everything-on.yaml"


def rendered(mutual: bool) -> list[dict[str, Any]]:
    if mutual:
        return objects(ELASTIC_JOB, values=[MUTUAL_TLS_VALUES])
    return objects(ELASTIC_JOB, sets=SERVER_TLS)


def chart_rdzv_conf(mutual: bool) -> tuple[str, dict[str, str]]:
    """The worker's ELASTIC_RDZV_CONF as the chart renders it, and the mount path of each
    rendezvous Secret volume (name -> mountPath)."""
    objs = rendered(mutual)
    worker = container(rendered_worker_statefulsets(objs)[0], "worker")
    mounts = {
        m["name"]: m["mountPath"]
        for m in worker["volumeMounts"]
        if m["name"].startswith("rendezvous-")
    }
    return str(env_of(worker)["ELASTIC_RDZV_CONF"]), mounts


def mounted_conf(pki: Pki, where: Path, *, mutual: bool, ca: str, client: str | None) -> str:
    """The chart's ELASTIC_RDZV_CONF with each Secret volume laid out under `where` (the
    kubelet's job), holding the CA `ca` and the client certificate `client`."""
    conf, mounts = chart_rdzv_conf(mutual)
    assert set(mounts) == ({"rendezvous-ca", "rendezvous-client"} if mutual else {"rendezvous-ca"})
    pki.mount(where / "ca", ca=ca, client=None)
    conf = conf.replace(mounts["rendezvous-ca"], str(where / "ca"))
    if "rendezvous-client" in mounts:
        if client is None:  # a worker without the client Secret
            keep = [p for p in conf.split(",") if not p.startswith(("ssl_cert=", "ssl_cert_key="))]
            return ",".join(keep)
        pki.mount(where / "client", ca=ca, client=client)
        conf = conf.replace(mounts["rendezvous-client"], str(where / "client"))
    return conf


@pytest.fixture(scope="session")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


def etcd_flags(mode: str, pki: Pki) -> list[str]:
    """etcd's TLS flags as the chart renders them: "mutual" (tls.clientCertAuth) or
    "server" (HTTPS only; no --trusted-ca-file, which would turn client auth on)."""
    etcd = container(etcd_statefulset(rendered(mode == "mutual")), "etcd")
    return tls_flags(etcd["command"], pki)


@pytest.fixture
def tls_etcd(tmp_path: Path, pki: Pki) -> Iterator[Callable[[str], EtcdServer]]:
    started: list[EtcdServer] = []

    def start(mode: str) -> EtcdServer:
        data = tmp_path / f"etcd-tls-{len(started)}"
        server = start_tls_etcd(data, pki, etcd_flags(mode, pki))
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


def load(endpoint: str, conf: str, job: str = "tls-job", **extra: str) -> config.Config:
    env = {
        "ELASTIC_JOB_ID": job,
        "ELASTIC_RDZV_ENDPOINT": endpoint,
        "ELASTIC_MIN_NODES": "1",
        "ELASTIC_MAX_NODES": "1",
        "ELASTIC_RDZV_CONF": conf,
        "ELASTIC_INJECT_ENV": "/nonexistent",
        "POD_NAME": "tls-worker-0",
        **extra,
    }
    return config.load(["train.py"], env)


@pytest.mark.parametrize("mode", ["mutual", "server"])
def test_the_workers_keys_work_over_tls_with_the_charts_settings(
    mode: str, pki: Pki, tls_etcd: Callable[[str], EtcdServer], tmp_path: Path
) -> None:
    mutual = mode == "mutual"
    etcd = tls_etcd(mode)
    conf = mounted_conf(pki, tmp_path / "mnt", mutual=mutual, ca="ca", client="client")
    cfg = load(etcd.endpoint, conf)
    assert cfg.rdzv_url == f"https://{etcd.endpoint}"
    assert cfg.tls is not None and (cfg.tls.cert is not None) is mutual
    client = etcdv2.connect(cfg)

    assert probes.etcd_api_probe(client, cfg)() == (True, "")
    assert not completion.is_complete(client, cfg)
    completion.mark_complete(client, cfg)
    assert completion.is_complete(client, cfg)
    assert generations.current(client, cfg) == 0
    assert generations.advance(client, cfg, 0) == 1
    assert generations.current(client, cfg) == 1
    registration = members.Registration(client, cfg, "127.0.0.1")
    assert registration.probe() == (True, "")
    registration.stop()
    assert client.list_dir(f"{cfg.key_prefix}/members") == []
    # torch's handler, built from the same Config, reaches the same etcd (one source).
    assert generations.rendezvous_closed(cfg, generations.run_id(cfg, 1)) is False


def run_worker(conf: str, endpoint: str, job: str, **extra: str) -> tuple[int, list[str], float]:
    env = worker_env(endpoint, job, ELASTIC_RDZV_CONF=conf, **extra)
    start = time.monotonic()
    result = subprocess.run(  # noqa: PLW1510 - the code is asserted
        [str(WORKER), "python", "train.py"], env=env, capture_output=True, text=True, timeout=90
    )
    return result.returncode, result.stderr.strip().splitlines(), time.monotonic() - start


@pytest.mark.parametrize(
    ("case", "mode", "ca", "client", "names"),
    [
        (
            "no client certificate",
            "mutual",
            "ca",
            None,
            # In the parentheses: the alert, or the connections etcd closed (which of the
            # two reaches the client is a race between etcd's close and our request).
            (
                "etcd requires a client certificate (",
                ") and ELASTIC_RDZV_CONF ssl_cert (chart: rendezvous.tls.clientCertSecret) "
                "is not set; give one signed by etcd's trusted CA",
            ),
        ),
        (
            "a client certificate from another CA",
            "mutual",
            "ca",
            "rogue-client",
            (
                "etcd refused this worker's client certificate (",
                "): ELASTIC_RDZV_CONF ssl_cert (chart: rendezvous.tls.clientCertSecret)=",
            ),
        ),
        (
            "a client certificate without the client-auth usage",
            "mutual",
            "ca",
            "server-usage-client",
            (
                "etcd refused this worker's client certificate (",
                "): ELASTIC_RDZV_CONF ssl_cert (chart: rendezvous.tls.clientCertSecret)=",
                "extended key usage",
                "clientAuth",
                "certificate specifies an incompatible key usage",
            ),
        ),
        (
            "the wrong CA",
            "server",
            "rogue",
            None,
            (
                "etcd's certificate is not trusted (unable to get local issuer certificate): "
                "ELASTIC_RDZV_CONF ca_cert (chart: rendezvous.tls.caSecret)=",
            ),
        ),
    ],
)
def test_a_tls_refusal_is_one_line_naming_the_setting_and_exit_2(  # noqa: PLR0917
    case: str,
    mode: str,
    ca: str,
    client: str | None,
    names: tuple[str, ...],
    pki: Pki,
    tls_etcd: Callable[[str], EtcdServer],
    tmp_path: Path,
) -> None:
    etcd = tls_etcd(mode)
    conf = mounted_conf(pki, tmp_path / "mnt", mutual=mode == "mutual", ca=ca, client=client)
    code, lines, took = run_worker(conf, etcd.endpoint, "refused", ELASTIC_GATE_TIMEOUT="120")
    assert code == 2, (case, lines)
    assert took < 30, "a refusal must not wait out the gate"
    errors = [line for line in lines if "certificate" in line]
    assert len(errors) == 1, lines
    assert errors[0].startswith(f"elastic-worker: rendezvous endpoint https://{etcd.endpoint}: ")
    for part in names:
        assert part in errors[0], errors[0]
    if client != "server-usage-client":  # the key usage only when it is the cause
        assert "key usage" not in errors[0], errors[0]


@pytest.mark.parametrize("version", ETCD_VERSIONS)
def test_a_client_certificate_without_client_auth_is_named_as_etcd_logs_it(
    version: str, pki: Pki, tmp_path: Path
) -> None:
    """A client certificate signed by etcd's CA for serverAuth only: etcd answers with the
    bad_certificate alert, as for other causes, and logs "certificate specifies an
    incompatible key usage"; the worker's one line names that cause, in etcd's words, and
    how to issue the certificate instead of blaming its CA or expiry."""
    data = tmp_path / "etcd-usage"
    etcd = start_tls_etcd(data, pki, etcd_flags("mutual", pki), version=version)
    try:
        conf = mounted_conf(
            pki, tmp_path / "mnt", mutual=True, ca="ca", client="server-usage-client"
        )
        code, lines, _ = run_worker(conf, etcd.endpoint, "usage", ELASTIC_GATE_TIMEOUT="120")
    finally:
        etcd.stop()
    etcd_log = (tmp_path / "etcd-usage.log").read_text()
    assert "x509: certificate specifies an incompatible key usage" in etcd_log
    assert code == 2, lines
    assert lines[-1] == (
        f"elastic-worker: rendezvous endpoint https://{etcd.endpoint}: etcd refused this "
        "worker's client certificate (the server sent SSLV3_ALERT_BAD_CERTIFICATE): "
        "ELASTIC_RDZV_CONF ssl_cert (chart: rendezvous.tls.clientCertSecret)="
        f"{tmp_path}/mnt/client/tls.crt allows no client authentication: its certificate has "
        "extended key usage serverAuth, without clientAuth (etcd's log: \"certificate "
        'specifies an incompatible key usage"); issue it for client auth (cert-manager: '
        "usages [client auth]; openssl: extendedKeyUsage=clientAuth)"
    ), lines


def test_the_alerts_of_newer_etcd_builds_name_their_cause(pki: Pki) -> None:
    """etcd built with Go 1.20 or later sends unknown_ca and certificate_expired for those
    causes (bad_certificate for the rest): the line says which, whatever the usages."""
    cert = Path(pki.path("server-usage-client.crt"))
    assert "not signed by a CA etcd trusts" in probes.client_cert_fault(
        "the server sent TLSV1_ALERT_UNKNOWN_CA", cert
    )
    assert "has expired" in probes.client_cert_fault(
        "the server sent SSLV3_ALERT_CERTIFICATE_EXPIRED", cert
    )
    generic = probes.client_cert_fault("the server sent SSLV3_ALERT_BAD_CERTIFICATE", Path("/none"))
    assert "allow client authentication" in generic


def test_https_to_a_plain_etcd_names_the_protocol_and_exits_2(
    etcd: EtcdServer, pki: Pki, tmp_path: Path
) -> None:
    conf = mounted_conf(pki, tmp_path / "mnt", mutual=False, ca="ca", client=None)
    code, lines, took = run_worker(conf, etcd.endpoint, "plain", ELASTIC_GATE_TIMEOUT="120")
    assert code == 2, lines
    assert took < 30
    assert re.fullmatch(
        f"elastic-worker: rendezvous endpoint https://{re.escape(etcd.endpoint)}: the server "
        r"closed every TLS handshake for \d+ s: it seems not to speak TLS; ELASTIC_RDZV_CONF "
        r"protocol \(chart: rendezvous.tls.enabled\) says https: enable TLS on etcd or drop "
        r"protocol=https",
        lines[-1],
    ), lines


def test_plain_http_to_a_tls_etcd_says_what_to_enable_when_the_gate_gives_up(
    tls_etcd: Callable[[str], EtcdServer],
) -> None:
    """The defect of issue 9: the chart's env without TLS waited its whole timeout on
    "Remote end closed connection without response"; the line now says why."""
    etcd = tls_etcd("server")
    code, lines, _ = run_worker("", etcd.endpoint, "no-tls", ELASTIC_GATE_TIMEOUT="3")
    assert code == 3, lines
    assert "does etcd serve only HTTPS? then enable TLS" in lines[-1], lines


def test_a_missing_ca_file_is_a_bad_setting_before_any_wait(tmp_path: Path) -> None:
    conf = f"protocol=https,ca_cert={tmp_path}/ca.crt"
    cfg = load("127.0.0.1:2379", conf)  # the Secret is mounted by then; read when connecting
    with pytest.raises(config.ConfigError) as info:
        etcdv2.connect(cfg)
    assert str(info.value) == (
        f"ELASTIC_RDZV_CONF ca_cert (chart: rendezvous.tls.caSecret): {tmp_path}/ca.crt does "
        "not exist; mount the Secret there or fix the path"
    )


@pytest.mark.parametrize(
    ("conf", "names"),
    [
        ("protocol=ftp", "ELASTIC_RDZV_CONF: protocol='ftp': use http or https"),
        ("ca_cert=/x", "ELASTIC_RDZV_CONF: ca_cert is set but protocol is http"),
        ("protocol=https,ssl_cert_key=/k", "ssl_cert_key (chart: rendezvous.tls.clientCertSecret)"),
    ],
)
def test_inconsistent_tls_keys_are_refused(conf: str, names: str) -> None:
    with pytest.raises(config.ConfigError) as info:
        load("127.0.0.1:2379", conf)
    assert names in str(info.value)


def test_a_client_key_that_does_not_match_is_a_bad_setting(pki: Pki, tmp_path: Path) -> None:
    conf = (
        f"protocol=https,ca_cert={pki.path('ca.crt')},ssl_cert={pki.path('client.crt')},"
        f"ssl_cert_key={pki.path('rogue-client.key')}"
    )
    with pytest.raises(config.ConfigError) as info:
        etcdv2.connect(load("127.0.0.1:2379", conf))
    assert str(info.value).startswith(
        "ELASTIC_RDZV_CONF ssl_cert (chart: rendezvous.tls.clientCertSecret): cannot load "
    )


# A training program that needs the whole group: gloo all-reduce over 2 nodes.
ALLREDUCE = """
import os, torch, torch.distributed as dist
dist.init_process_group("gloo")
t = torch.ones(1)
dist.all_reduce(t)
print(f"[allreduce] sum={int(t.item())} rank={dist.get_rank()}", flush=True)
os._exit(0)  # no teardown: the process-group shutdown can block (train.py says why)
"""


@pytest.mark.slow
def test_two_agents_train_through_a_mutual_tls_etcd(
    pki: Pki, tls_etcd: Callable[[str], EtcdServer], tmp_path: Path
) -> None:
    etcd = tls_etcd("mutual")
    conf = mounted_conf(pki, tmp_path / "mnt", mutual=True, ca="ca", client="client")
    script = tmp_path / "allreduce.py"
    script.write_text(ALLREDUCE)
    agents = [
        Agent.start(
            name,
            ["python", str(script)],
            worker_env(
                etcd.endpoint,
                "tls-train",
                POD_NAME=name,
                ELASTIC_MIN_NODES="2",
                ELASTIC_MAX_NODES="2",
                ELASTIC_RDZV_CONF=conf,
            ),
            tmp_path / f"{name}.log",
        )
        for name in ("w0", "w1")
    ]
    try:
        codes = [agent.wait(180) for agent in agents]
    finally:
        for agent in agents:
            agent.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                agent.wait(10)
    logs = [agent.text() for agent in agents]
    assert codes == [0, 0], logs
    assert sorted(line for log in logs for line in log.splitlines() if "[allreduce]" in line) == [
        "[allreduce] sum=2 rank=0",
        "[allreduce] sum=2 rank=1",
    ]
    cfg = load(etcd.endpoint, conf, job="tls-train")
    assert completion.is_complete(etcdv2.connect(cfg), cfg)
