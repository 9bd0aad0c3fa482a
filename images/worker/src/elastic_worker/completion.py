"""The job's completion marker, /elastic-job/<job>/complete, and the optional scale-down."""

from __future__ import annotations

import json
import logging
import ssl
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from datetime import datetime, timezone

from elastic_worker import etcdv2
from elastic_worker.config import Config, KubeApi

logger = logging.getLogger(__name__)


def complete_key(config: Config) -> str:
    return f"{config.key_prefix}/complete"


def is_complete(client: etcdv2.Client, config: Config) -> bool:
    return client.get_value(complete_key(config)) is not None


def mark_complete(client: etcdv2.Client, config: Config) -> None:
    """Set the marker once; a marker another pod set first is left as it is."""
    value = json.dumps(
        {"pod": config.pod_name, "time": datetime.now(timezone.utc).isoformat(timespec="seconds")}
    )
    try:
        client.set(complete_key(config), value, prev_exist=False)
        logger.info("training succeeded: marked %s", complete_key(config))
    except etcdv2.NodeExists:
        logger.info("training succeeded; %s was already set", complete_key(config))


def wait_complete(
    client: etcdv2.Client,
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
        except etcdv2.EtcdError as exc:
            logger.debug("completion check failed: %s", exc)
        if clock() >= deadline:
            return False
        time.sleep(poll_every)


def scale_to_zero(api: KubeApi, namespace: str, names: tuple[str, ...], timeout: float = 10) -> int:
    """PATCH each StatefulSet's scale subresource to 0; failures are warnings.

    Returns how many were scaled.
    """
    context = ssl.create_default_context(cafile=api.ca_file) if api.ca_file else None
    body = json.dumps({"spec": {"replicas": 0}}).encode()
    scaled = 0
    for name in names:
        url = f"{api.base_url}/apis/apps/v1/namespaces/{namespace}/statefulsets/{name}/scale"
        req = urllib.request.Request(url, data=body, method="PATCH")
        req.add_header("Authorization", f"Bearer {api.token}")
        req.add_header("Content-Type", "application/merge-patch+json")
        req.add_header("Accept", "application/json")
        try:
            with urllib.request.urlopen(req, timeout=timeout, context=context):
                pass
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
        except (urllib.error.URLError, OSError) as exc:
            logger.warning("scaling statefulset %s/%s failed: %s", namespace, name, exc)
            continue
        logger.info("scaled statefulset %s/%s to 0", namespace, name)
        scaled += 1
    return scaled
