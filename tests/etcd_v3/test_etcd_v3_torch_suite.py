"""torch's own `RendezvousBackendTestMixin`, run unmodified against etcd-v3 on a real etcd
(3.4 and 3.5, v2 API off), when a copy of torch's test file is at hand.

torch ships no tests in its wheel and the project keeps no copy of torch's source, so the
file comes from a checkout of torch at the pinned release (requirements/dev.txt):

    TORCH_RDZV_TESTS=/src/pytorch/test/distributed/elastic/rendezvous pytest tests/etcd_v3

Without it this module skips, saying so; test_etcd_v3_conformance.py checks the same
contract in every run. torch's file imports torch.testing._internal, which needs
expecttest (requirements/dev.txt).
"""

from __future__ import annotations

import base64
import itertools
import json
import os
import sys
import tempfile
import unittest
import urllib.request
from pathlib import Path
from typing import Any, ClassVar

import pytest
from etcd3_helpers import connect
from testlib import EtcdServer, start_etcd

ENV = "TORCH_RDZV_TESTS"
MIXIN_FILE = "rendezvous_backend_test.py"
SOURCE = os.environ.get(ENV, "")
_RUNS = itertools.count()


def _load_mixin() -> type[Any] | None:
    if not SOURCE:
        return None
    if not (Path(SOURCE) / MIXIN_FILE).is_file():
        pytest.fail(f"{ENV}={SOURCE!r} holds no {MIXIN_FILE}: give torch's rendezvous test folder")
    sys.path.insert(0, SOURCE)
    from rendezvous_backend_test import RendezvousBackendTestMixin  # noqa: PLC0415

    mixin: type[Any] = RendezvousBackendTestMixin
    return mixin


Mixin = _load_mixin()


if Mixin is None:

    def test_torch_own_backend_tests() -> None:
        pytest.skip(
            f"{ENV} is not set: give the folder of torch's {MIXIN_FILE} (a checkout of the "
            "pinned torch release) to run torch's own mixin; the contract is checked by "
            "test_etcd_v3_conformance.py"
        )

else:

    class _EtcdV3Backend(unittest.TestCase, Mixin):  # type: ignore[misc, valid-type]
        """torch's mixin with this backend: a fresh run id per test on one etcd."""

        version: ClassVar[str]
        _server: ClassVar[EtcdServer]
        _tmp: ClassVar[tempfile.TemporaryDirectory[str]]

        @classmethod
        def setUpClass(cls) -> None:
            cls._tmp = tempfile.TemporaryDirectory()
            cls._server = start_etcd(Path(cls._tmp.name) / "etcd", v2=False, version=cls.version)

        @classmethod
        def tearDownClass(cls) -> None:
            cls._server.stop()
            cls._tmp.cleanup()

        def setUp(self) -> None:
            super().setUp()
            self._run_id = f"torch-mixin-{next(_RUNS)}"
            self._backend = connect(self._server.endpoint, self._run_id)[0]

        def _corrupt_state(self) -> None:
            # As torch's etcd-v2 test does: a value that is not base64.
            key = base64.b64encode(f"/torch/elastic/rendezvous/{self._run_id}".encode())
            body = {"key": key.decode(), "value": base64.b64encode(b"non_base64").decode()}
            req = urllib.request.Request(
                f"{self._server.url}/v3/kv/put", data=json.dumps(body).encode(), method="POST"
            )
            urllib.request.urlopen(req, timeout=5).close()

    class TestTorchMixinOnEtcd34(_EtcdV3Backend):
        version = "3.4"

    class TestTorchMixinOnEtcd35(_EtcdV3Backend):
        version = "3.5"

    del _EtcdV3Backend  # the base alone has no etcd version: not collected
