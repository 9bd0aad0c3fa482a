"""--rdzv-endpoint / --rdzv-conf mistakes: one error naming the value and the fix, raised
when the handler is made (before any agent joins)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from etcd3_helpers import params
from torch.distributed.elastic.rendezvous import RendezvousParameters
from torch_etcd_v3 import ConfigError, create_backend
from torch_etcd_v3.config import load


@pytest.mark.parametrize(
    ("conf", "message"),
    [
        ({"protocol": "ftp"}, "protocol='ftp': use http or https"),
        ({"read_timeout": "soon"}, "read_timeout='soon': must be a whole number"),
        ({"lease_ttl": "0"}, "lease_ttl='0': must be a whole number of seconds above 0"),
        ({"key_prefix": "torch"}, "key_prefix='torch': must start with / (/ alone is the root"),
        ({"keep_alive_interval": "soon"}, "keep_alive_interval='soon': must be a whole number"),
        ({"ca_cert": "/x/ca.crt"}, "ca_cert='/x/ca.crt' is set but protocol is http"),
        ({"protocol": "https", "ca_cert": "/nope/ca.crt"}, "ca_cert='/nope/ca.crt': no such file"),
        ({"protocol": "https", "ssl_cert_key": "/k"}, "ssl_cert_key='/k' without ssl_cert"),
        ({"user": "trainer"}, "user='trainer' without password_file"),
        ({"password_file": "/p"}, "password_file='/p' without user"),
        ({"user": "u", "password_file": "/nope/pw"}, "password_file='/nope/pw': cannot read"),
    ],
)
def test_bad_conf_is_one_error_naming_the_value(conf: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match="--rdzv-conf " + message.replace("(", r"\(")):
        create_backend(params("127.0.0.1:2379", **conf))


@pytest.mark.parametrize(
    ("endpoint", "message"),
    [
        ("host:abc", "the port 'abc' is not a number from 1 to 65535"),
        ("host:70000", "the port '70000' is not a number from 1 to 65535"),
        ("http://etcd:2379", "give HOST:PORT without a scheme .for TLS add protocol=https"),
        ("fd00::1:2379", "write an IPv6 address in brackets"),
        ("[fd00::1", "write an IPv6 address as \\[ADDRESS\\]:PORT"),
        ("etcd/x:2379", "'etcd/x' is not a host name or address"),
    ],
)
def test_bad_endpoint_names_it(endpoint: str, message: str) -> None:
    with pytest.raises(ConfigError, match=f"--rdzv-endpoint='{re.escape(endpoint)}': {message}"):
        load(RendezvousParameters("etcd-v3", endpoint, "job", 1, 1))


@pytest.mark.parametrize(
    ("endpoint", "host", "port"),
    [
        ("etcd", "etcd", 2379),
        (" etcd.ns.svc:2380 ", "etcd.ns.svc", 2380),
        ("[fd00::1]:2381", "fd00::1", 2381),
        ("[fd00::1]", "fd00::1", 2379),
        ("127.0.0.1:1", "127.0.0.1", 1),
    ],
)
def test_endpoint_forms(endpoint: str, host: str, port: int) -> None:
    cfg = load(RendezvousParameters("etcd-v3", endpoint, "job", 1, 1))
    assert (cfg.client.host, cfg.client.port) == (host, port)


def test_key_prefix_slash_is_the_root() -> None:
    """`key_prefix=/` is the root of etcd's keyspace (it was refused with "must start with
    /"); an empty value is the default, as for every key."""
    cfg = load(params("h:1", "j", key_prefix="/"))
    assert (cfg.state_key, cfg.store_prefix) == (b"/rendezvous/j", b"/store/j/")
    cfg = load(params("h:1", "j", key_prefix="//"))
    assert cfg.state_key == b"/rendezvous/j"
    cfg = load(params("h:1", "j", key_prefix=""))
    assert cfg.state_key == b"/torch/elastic/rendezvous/j"


def test_empty_password_file_is_refused(tmp_path: Path) -> None:
    (tmp_path / "pw").write_text("\n")
    with pytest.raises(ConfigError, match=r"password_file=.*is empty"):
        load(params("h:1", user="u", password_file=str(tmp_path / "pw")))


def test_defaults_and_keys_per_run(tmp_path: Path) -> None:
    (tmp_path / "pw").write_text("s3cret\n")  # a mounted Secret's trailing newline is dropped
    cfg = load(params("etcd.example", "job-7", user="u", password_file=str(tmp_path / "pw")))
    assert (cfg.client.host, cfg.client.port, cfg.client.tls) == ("etcd.example", 2379, None)
    assert cfg.client.password == "s3cret"
    assert cfg.lease_ttl == 60
    assert cfg.state_key == b"/torch/elastic/rendezvous/job-7"
    assert cfg.store_prefix == b"/torch/elastic/store/job-7/"
    cfg = load(params("h:1", "j", key_prefix="/team-a/"))
    assert cfg.state_key == b"/team-a/rendezvous/j"


def test_keys_names_every_key_the_handler_reads() -> None:
    """config.HANDLER_KEYS (which the worker checks its ELASTIC_RDZV_CONF against) is
    exactly the keys load() reads, and a key it does not read is ignored, as torch's own
    handlers ignore the keys torchrun adds."""
    from torch_etcd_v3 import config  # noqa: PLC0415

    source = Path(config.__file__).read_text()
    read = set(re.findall(r'_get\(conf, "([a-z_]+)"', source))
    read |= set(re.findall(r'_positive_int\(conf, "([a-z_]+)"', source))
    # keep_alive_interval: torch's, read here too (the backoff scales with it)
    assert read - config.RENDEZVOUS_KEYS == config.HANDLER_KEYS
    assert read <= config.KEYS
    assert not config.HANDLER_KEYS & config.RENDEZVOUS_KEYS
    assert config.KEYS == config.HANDLER_KEYS | config.RENDEZVOUS_KEYS
    load(params("127.0.0.1:2379", not_a_key="1"))


def test_importing_the_package_first_still_registers_the_backend() -> None:
    """`import torch_etcd_v3` before torch's rendezvous package: torch loads the entry
    point while importing it, and the registration must not fail on a half-imported
    package (it did: a circular import, logged and swallowed by torch)."""
    code = (
        "import torch_etcd_v3\n"
        "from torch.distributed.elastic.rendezvous import rendezvous_handler_registry as r\n"
        "assert 'etcd-v3' in r._registry, sorted(r._registry)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert proc.returncode == 0, proc.stderr
    assert "Exception while registering" not in proc.stderr, proc.stderr
