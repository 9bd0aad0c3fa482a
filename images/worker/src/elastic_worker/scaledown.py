"""The end of a job through the API server: its StatefulSets scaled to 0, and the scale of
the bundled etcd read back (a finished job scales it to 0 last). The decision that the job
is complete is completion.py's; this module only talks to the scale subresource."""

from __future__ import annotations

import logging
import urllib.error

from elastic_worker import kubeapi
from elastic_worker.settings.config import Config, ConfigError, KubeApi, read_statefulsets

logger = logging.getLogger(__name__)

#: The chart value that turns the scale-down (ELASTIC_SCALE_DOWN and its Role) on and off,
#: named in every warning (tests/worker/test_scaledown.py holds it to values.yaml).
CHART_VALUE = "rbac.scaleDown.enabled"


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
                    "patch on statefulsets/scale (the chart renders it with %s=true; "
                    "set %s=false not to scale down); leaving it running",
                    namespace,
                    name,
                    CHART_VALUE,
                    CHART_VALUE,
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
        logger.warning(
            "ELASTIC_SCALE_DOWN is true (chart: %s) but no in-cluster API access: mount the "
            "ServiceAccount token (worker.automountServiceAccountToken), or set %s=false; "
            "scaling nothing",
            CHART_VALUE,
            CHART_VALUE,
        )
    elif not config.pod_namespace:
        logger.warning(
            "ELASTIC_SCALE_DOWN is true (chart: %s) but POD_NAMESPACE is not set: set it from "
            "the downward API (metadata.namespace) as the chart does, or set %s=false; "
            "scaling nothing",
            CHART_VALUE,
            CHART_VALUE,
        )
    else:
        scale_to_zero(api, config.pod_namespace, names)


def rendezvous_at_zero(config: Config, timeout: float) -> bool | None:
    """Whether the bundled etcd's StatefulSet is at 0 replicas; None when this pod cannot
    ask (no scale-down, no API access, no such StatefulSet). Raises what the request
    raised (URLError, OSError, ValueError)."""
    api = config.kube_api
    name = config.rendezvous_statefulset
    if not (config.scale_down and api and name and config.pod_namespace):
        return None
    scale = _scale_request(api, config.pod_namespace, name, None, timeout)
    spec = scale.get("spec")
    return isinstance(spec, dict) and spec.get("replicas") == 0
