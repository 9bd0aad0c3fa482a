"""The worker's few requests to the API server, with the pod's service-account token
(config.KubeApi): the scale subresource (completion.py) and Events (events.py). The
standard library only: the image carries no Kubernetes client."""

from __future__ import annotations

import json
import ssl
import urllib.request
from typing import Any

from elastic_worker.settings.config import KubeApi


def request(
    api: KubeApi,
    method: str,
    path: str,
    body: Any = None,
    *,
    content_type: str = "application/json",
    timeout: float,
) -> dict[str, object]:
    """`method` `path` (from /api or /apis) with `body` as JSON; the answer's JSON object.

    Raises urllib.error.HTTPError for a refusal, URLError/OSError/ValueError otherwise."""
    context = ssl.create_default_context(cafile=api.ca_file) if api.ca_file else None
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(f"{api.base_url}{path}", data=data, method=method)
    req.add_header("Authorization", f"Bearer {api.token}")
    req.add_header("Accept", "application/json")
    if data is not None:
        req.add_header("Content-Type", content_type)
    with urllib.request.urlopen(req, timeout=timeout, context=context) as resp:
        answer = json.loads(resp.read() or b"{}")
    return answer if isinstance(answer, dict) else {}
