"""The lean import of the official client (init_topology.k8s): few modules, the same
classes, everything else still reachable, and a full import when the lean one cannot work."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest


def run(code: str) -> dict[str, object]:
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=False, timeout=120
    )
    assert done.returncode == 0, done.stderr
    result: dict[str, object] = json.loads(done.stdout.splitlines()[-1])
    return result


def test_lean_import_loads_a_few_modules_and_the_real_classes() -> None:
    got = run(
        """
import json, sys
from init_topology import k8s
c = k8s.load()
few = len([m for m in sys.modules if m.split(".")[0] == "kubernetes"])
import kubernetes.client.api_client as ac, kubernetes.client.exceptions as ex
same = c.ApiClient is ac.ApiClient and c.ApiException is ex.ApiException
import kubernetes.client.models
node = kubernetes.client.models.V1Node.__name__   # the rest still loads on first use
from kubernetes.client import CoreV1Api
print(json.dumps({"lean": c.lean, "few": few, "same": same, "node": node,
                  "core": CoreV1Api is c.CoreV1Api}))
"""
    )
    assert got == {"lean": True, "few": got["few"], "same": True, "node": "V1Node", "core": True}
    assert isinstance(got["few"], int) and got["few"] < 40


def test_an_already_imported_client_is_used_as_it_is() -> None:
    got = run(
        """
import json, kubernetes
from init_topology import k8s
print(json.dumps({"lean": k8s.load().lean}))
"""
    )
    assert got == {"lean": False}


@pytest.mark.parametrize("breakage", ["not-a-package", "no-such-module"])
def test_when_the_lean_import_does_not_fit_the_full_import_is_used(breakage: str) -> None:
    got = run(
        f"""
import json
from init_topology import k8s
if {breakage!r} == "not-a-package":
    k8s._PACKAGES += ("kubernetes.client.rest",)
else:
    k8s._PACKAGES += ("kubernetes.no_such_module",)
c = k8s.load()
import kubernetes
print(json.dumps({{"lean": c.lean, "full": hasattr(kubernetes, "watch")}}))
"""
    )
    assert got == {"lean": False, "full": True}
