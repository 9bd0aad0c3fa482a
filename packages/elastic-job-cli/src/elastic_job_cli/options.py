"""How the command reaches the cluster, as kubectl's flags say it (--kubeconfig,
--context, -n, -A, --request-timeout): parsed once by main() into `Access`."""

from __future__ import annotations

import re
from dataclasses import dataclass

#: --request-timeout when not given: longer than a large list takes, and well under the
#: minute after which the API server itself gives up on a request.
DEFAULT_REQUEST_TIMEOUT = "30s"

_UNITS = {
    "ns": 1e-9, "us": 1e-6, "µs": 1e-6, "μs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0
}  # fmt: skip
_TERM = r"(\d+\.?\d*|\.\d+)(ns|us|µs|μs|ms|s|m|h)"
_DURATION = re.compile(rf"(?:{_TERM})+")

#: kubectl's own words for a bad --request-timeout (client-go clientcmd).
TIMEOUT_HELP = (
    "invalid timeout value {value!r}: a timeout must be a single integer in seconds, or an "
    "integer followed by a corresponding time unit (e.g. 1s | 2m | 3h); 0 waits for ever"
)


class DurationError(ValueError):
    pass


def request_timeout(text: str) -> float | None:
    """Seconds from kubectl's --request-timeout syntax, None for 0 (no timeout): a bare
    integer is seconds, else a Go duration (`5s`, `1m30s`, `250ms`, `1.5h`)."""
    value = text.strip()
    if value.isdigit():
        seconds = float(int(value))
    elif _DURATION.fullmatch(value):
        seconds = sum(float(n) * _UNITS[unit] for n, unit in re.findall(_TERM, value))
    else:
        raise DurationError(TIMEOUT_HELP.format(value=text))
    return seconds or None


def seconds_text(seconds: float | None) -> str:
    """A timeout as the user would write it again: `30s`, `1.5s`, `0` for none."""
    if seconds is None:
        return "0"
    return f"{seconds:g}s"


@dataclass(frozen=True)
class Access:
    kubeconfig: str | None
    context: str | None
    namespace: str | None
    all_namespaces: bool
    #: Seconds to wait for the API server (connect, TLS, each answer); None: for ever.
    request_timeout: float | None
