"""The job's completion marker, /elastic-job/<job>/complete, and the optional scale-down."""

from __future__ import annotations

import json
import logging
import time
import urllib.error
from collections.abc import Callable
from datetime import datetime, timezone

from elastic_worker.keystore import interface as kvstore
from elastic_worker.observe import kubeapi
from elastic_worker.settings.config import Config, ConfigError, KubeApi, read_statefulsets

logger = logging.getLogger(__name__)


def complete_key(config: Config) -> str:
    return f"{config.key_prefix}/complete"


def is_complete(client: kvstore.KeyStore, config: Config) -> bool:
    return client.get_value(complete_key(config)) is not None


def complete_now(client: kvstore.KeyStore, config: Config, within: float = 0.0) -> bool:
    """Whether the job is complete: the marker in etcd, or, when etcd cannot answer (a
    finished job scales it to 0 after the workers), the rendezvous' scale. While neither
    can say, ask again for up to `within` seconds (a pod told to stop at the end of the
    job has its grace period to find out that it may exit 0)."""
    deadline = time.monotonic() + within
    while True:
        try:
            return is_complete(client, config)
        except kvstore.EtcdError as exc:
            etcd_error: Exception = exc
        try:
            scaled = _rendezvous_at_zero(config, timeout=5)
        except (urllib.error.URLError, OSError, ValueError) as exc:
            scaled, api_error = None, f"reading the scale of {config.rendezvous_statefulset}: {exc}"
        else:
            api_error = "no API access to read the rendezvous' scale"
        if scaled is not None:
            return scaled
        if time.monotonic() >= deadline:
            logger.info(
                "cannot tell whether job %s is complete: etcd: %s; %s",
                config.job_id,
                etcd_error,
                api_error,
            )
            return False
        time.sleep(0.5)


def mark_complete(client: kvstore.KeyStore, config: Config) -> bool:
    """Set the marker once; a marker another pod set first is left as it is. True when
    this pod set it."""
    value = json.dumps(
        {"pod": config.pod_name, "time": datetime.now(timezone.utc).isoformat(timespec="seconds")}
    )
    try:
        client.set(complete_key(config), value, prev_exist=False)
        logger.info("training succeeded: marked %s", complete_key(config))
    except kvstore.NodeExists:
        logger.info("training succeeded; %s was already set", complete_key(config))
        return False
    return True


def wait_complete(
    client: kvstore.KeyStore,
    config: Config,
    timeout: float,
    *,
    poll_every: float = 0.5,
    clock: Callable[[], float] = time.monotonic,
) -> bool:
    """Poll for the marker for at most `timeout` seconds; etcd errors count as 'not yet'."""
    deadline = clock() + timeout
    while True:
        try:
            if is_complete(client, config):
                return True
        except kvstore.EtcdError as exc:
            logger.debug("completion check failed: %s", exc)
            if rendezvous_scaled_to_zero(config):
                return True
        if clock() >= deadline:
            return False
        time.sleep(poll_every)


def _scale_request(
    api: KubeApi, namespace: str, name: str, body: dict[str, object] | None, timeout: float
) -> dict[str, object]:
    """GET (body None) or merge-PATCH a StatefulSet's scale subresource; the answer's JSON."""
    path = f"/apis/apps/v1/namespaces/{namespace}/statefulsets/{name}/scale"
    if body is None:
        return kubeapi.request(api, "GET", path, timeout=timeout)
    return kubeapi.request(
        api,
        "PATCH",
        path,
        body,
        content_type="application/merge-patch+json",
        timeout=timeout,
    )


def set_replicas(
    api: KubeApi, namespace: str, name: str, replicas: int, timeout: float
) -> dict[str, object]:
    """As `kubectl scale` does: a merge PATCH of the scale subresource; the Scale's JSON.

    Raises urllib.error.HTTPError for a refusal, URLError/OSError/ValueError otherwise
    (localrun's runner scales through this too)."""
    return _scale_request(api, namespace, name, {"spec": {"replicas": replicas}}, timeout)


def scale_to_zero(api: KubeApi, namespace: str, names: tuple[str, ...], timeout: float = 10) -> int:
    """PATCH each StatefulSet's scale subresource to 0, in order; failures are warnings.

    Returns how many were scaled.
    """
    scaled = 0
    for name in names:
        try:
            set_replicas(api, namespace, name, 0, timeout)
        except urllib.error.HTTPError as exc:
            if exc.code == 403:
                logger.warning(
                    "not allowed to scale statefulset %s/%s (403): the Role lacks "
                    "patch on statefulsets/scale; leaving it running",
                    namespace,
                    name,
                )
            else:
                logger.warning(
                    "scaling statefulset %s/%s failed: HTTP %d", namespace, name, exc.code
                )
            continue
        except (urllib.error.URLError, OSError, ValueError) as exc:
            logger.warning("scaling statefulset %s/%s failed: %s", namespace, name, exc)
            continue
        logger.info("scaled statefulset %s/%s to 0", namespace, name)
        scaled += 1
    return scaled


def scale_down_after_success(config: Config) -> None:
    """The workers' StatefulSets, then the bundled etcd's last (so that its
    PodDisruptionBudget stops pinning a node); only with ELASTIC_SCALE_DOWN."""
    if not config.scale_down:
        return
    try:
        workers = read_statefulsets(config.statefulsets_file)
    except ConfigError as exc:
        logger.warning("%s: scaling none of the workers' StatefulSets", exc)
        workers = ()
    names = workers + ((config.rendezvous_statefulset,) if config.rendezvous_statefulset else ())
    if not names:
        return
    api = config.kube_api
    if api is None:
        logger.warning("ELASTIC_SCALE_DOWN is true but no in-cluster API access")
    elif not config.pod_namespace:
        logger.warning("ELASTIC_SCALE_DOWN is true but POD_NAMESPACE is not set")
    else:
        scale_to_zero(api, config.pod_namespace, names)


def rendezvous_scaled_to_zero(config: Config, timeout: float = 5) -> bool | None:
    """Whether the bundled etcd's StatefulSet was scaled to 0, which a finished job does
    last: then the job is complete. None when the API cannot say (no access, no such
    setting, the request failed): callers that must decide take that as "not done"."""
    try:
        return _rendezvous_at_zero(config, timeout)
    except (urllib.error.URLError, OSError, ValueError) as exc:
        logger.debug(
            "reading the scale of statefulset %s failed: %s", config.rendezvous_statefulset, exc
        )
        return None


def _rendezvous_at_zero(config: Config, timeout: float) -> bool | None:
    """rendezvous_scaled_to_zero, raising what the request raised."""
    api = config.kube_api
    name = config.rendezvous_statefulset
    if not (config.scale_down and api and name and config.pod_namespace):
        return None
    scale = _scale_request(api, config.pod_namespace, name, None, timeout)
    spec = scale.get("spec")
    return isinstance(spec, dict) and spec.get("replicas") == 0
