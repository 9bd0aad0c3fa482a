"""`Status` bodies as kube-apiserver writes them for a failed request, and the message the
real server gives for each status a fault can inject."""

from __future__ import annotations

from localrun.cluster.apirequest import JsonObject, Target

_REASONS = {
    400: "BadRequest",
    401: "Unauthorized",
    403: "Forbidden",
    404: "NotFound",
    405: "MethodNotAllowed",
    409: "Conflict",
    415: "UnsupportedMediaType",
    422: "Invalid",
    429: "TooManyRequests",
    500: "InternalError",
    503: "ServiceUnavailable",
    504: "Timeout",
}
NO_SUCH_RESOURCE = "the server could not find the requested resource"


def status_object(code: int, message: str, details: JsonObject | None = None) -> JsonObject:
    """A `Status` body as kube-apiserver writes it for a failed request."""
    body: JsonObject = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": _REASONS.get(code, "InternalError" if code >= 500 else "BadRequest"),
    }
    if details:
        body["details"] = details
    body["code"] = code
    return body


def not_allowed(method: str) -> JsonObject:
    return status_object(405, f"{method} is not supported here")


def not_found(target: Target) -> JsonObject:
    return status_object(404, f'{target.qualified} "{target.name}" not found', target.details)


def fault_body(code: int, target: Target | None, path: str, user: str) -> JsonObject:
    """The body the real server sends with `code` for a request of `user` to `target`."""
    if target is None:
        return status_object(code, NO_SUCH_RESOURCE)
    resource = f"{target.resource}/{target.subresource}" if target.subresource else target.resource
    if code == 401:
        return status_object(401, "Unauthorized")
    if code == 403:
        subject = f'{target.qualified} "{target.name}"' if target.name else target.qualified
        scope = (
            f'in the namespace "{target.namespace}"' if target.namespace else "at the cluster scope"
        )
        message = (
            f'{subject} is forbidden: User "{user}" cannot {target.verb} resource '
            f'"{resource}" in API group "{target.group}" {scope}'
        )
        return status_object(403, message, target.details)
    if code == 404:
        return not_found(target)
    if code == 409:
        message = (
            f'Operation cannot be fulfilled on {target.qualified} "{target.name}": the object '
            "has been modified; please apply your changes to the latest version and try again"
        )
        return status_object(409, message, target.details)
    if code == 429:
        return status_object(
            429, "Too many requests, please try again later.", {"retryAfterSeconds": 1}
        )
    if code == 500:
        cause = "etcdserver: request timed out"
        return status_object(
            500, f"Internal error occurred: {cause}", {"causes": [{"message": cause}]}
        )
    if code == 503:
        return status_object(503, "the server is currently unable to handle the request")
    if code == 504:
        return status_object(504, "Timeout: request did not complete within requested timeout")
    return status_object(code, f"fault injected on {path}")
