"""The parts of the official `kubernetes` client this program uses, imported lean.

`import kubernetes` runs the package's `__init__`, which imports every API group, about a
thousand model classes, the dynamic client, watch, stream and leader election: about 0.45
CPU-seconds, which a 200m CPU limit stretches to over 2 s of wall time for a program whose
whole job is one GET. The modules used here (Configuration, ApiClient, CoreV1Api,
ApiException, InClusterConfigLoader) need none of that.

So the client's packages are first registered as *lazy shells*: real module objects with the
package's `__path__`, whose `__init__` runs only when an attribute it would define is asked
for (PEP 562 `__getattr__`). Importing a submodule such as `kubernetes.client.api_client`
then loads just that module and what it imports. Nothing of the client is copied or
patched: its own modules run unchanged, and a package the code does reach into (e.g. the
models, if a response were deserialized) loads in full on first use.

If the client's layout ever stops fitting (an ImportError or AttributeError), everything is
discarded and the client is imported the ordinary way: slower, never wrong. The client is
pinned (kubernetes==35.0.0) and the tests run this path against a real HTTPS server.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import logging
import sys
from dataclasses import dataclass
from types import ModuleType
from typing import Any

log = logging.getLogger(__name__)

_PACKAGES = (
    "kubernetes",
    "kubernetes.client",
    "kubernetes.client.api",
    "kubernetes.client.models",
    "kubernetes.config",
)


@dataclass(frozen=True)
class Client:
    Configuration: Any
    ApiClient: Any
    CoreV1Api: Any
    ApiException: type[Exception]
    InClusterConfigLoader: Any
    lean: bool


@functools.cache
def load() -> Client:
    """The client's classes; lean unless `kubernetes` was already imported in full."""
    if "kubernetes" not in sys.modules:
        try:
            return _load(lean=True)
        except (ImportError, AttributeError) as exc:
            log.debug("lean import of the kubernetes client failed (%s): importing it all", exc)
            for name in [m for m in sys.modules if m.split(".")[0] == "kubernetes"]:
                del sys.modules[name]
    return _load(lean=False)


def _load(*, lean: bool) -> Client:
    if lean:
        for name in _PACKAGES:
            _lazy_package(name)
        configuration = importlib.import_module("kubernetes.client.configuration")
        # incluster_config does `from kubernetes.client import Configuration`: answer it
        # without running the client package's __init__ (setattr: mypy cannot type a lazy
        # module's attributes).
        setattr(sys.modules["kubernetes.client"], "Configuration", configuration.Configuration)  # noqa: B010
    else:
        importlib.import_module("kubernetes")
    api_client = importlib.import_module("kubernetes.client.api_client")
    core_v1 = importlib.import_module("kubernetes.client.api.core_v1_api")
    exceptions = importlib.import_module("kubernetes.client.exceptions")
    incluster = importlib.import_module("kubernetes.config.incluster_config")
    return Client(
        Configuration=importlib.import_module("kubernetes.client.configuration").Configuration,
        ApiClient=api_client.ApiClient,
        CoreV1Api=core_v1.CoreV1Api,
        ApiException=exceptions.ApiException,
        InClusterConfigLoader=incluster.InClusterConfigLoader,
        lean=lean,
    )


def _lazy_package(name: str) -> ModuleType:
    """Register package `name` without running its __init__ until an attribute is missed."""
    spec = importlib.util.find_spec(name)
    if spec is None or spec.loader is None or spec.submodule_search_locations is None:
        raise ImportError(f"{name} is not a package")
    module = importlib.util.module_from_spec(spec)
    loader = spec.loader
    state = {"loaded": False}

    def __getattr__(attr: str) -> Any:  # PEP 562: only called for missing attributes
        if state["loaded"] or attr.startswith("__"):
            raise AttributeError(f"module {name!r} has no attribute {attr!r}")
        # `from package import submodule` asks for the attribute first: a submodule is
        # imported alone, as the import system would after the attribute lookup failed.
        if importlib.util.find_spec(f"{name}.{attr}") is not None:
            return importlib.import_module(f"{name}.{attr}")
        state["loaded"] = True
        log.debug("loading all of %s for %s", name, attr)
        loader.exec_module(module)
        return getattr(module, attr)

    module.__getattr__ = __getattr__  # type: ignore[method-assign]
    sys.modules[name] = module
    parent, _, child = name.rpartition(".")
    if parent:
        setattr(sys.modules[parent], child, module)
    return module
