"""The warm server every warm test module starts once (module scope)."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from elastic_worker.warm import server as warm

from worker.worker_helpers import PYTHON


@pytest.fixture(scope="module")
def server() -> Iterator[warm.Handle]:
    handle = warm.start(str(PYTHON), ["torch", "numpy"], dict(os.environ))
    yield handle
    handle.stop()
