"""Every name the benches take from the worker (images/worker, `elastic_worker`), in one
place: when the worker's modules move, this file changes and no bench does.

The benches run the worker's own code where a pod would (the lifelines, the leave at
SIGTERM, warm starts, the round liveness) and its defaults (settings), so that a figure
measures what the chart runs. (`parse_attempt`: tests/bench check that the attempt line
the soak writes is one the worker reads.)
"""

from __future__ import annotations

from elastic_worker import config, etcdv2, leave, lifeline, liveness, warm
from elastic_worker.attempt import ATTEMPT_PREFIX, parse_attempt
from elastic_worker.main import setup_logging
from elastic_worker.settings import BY_NAME, RDZV_CONF_DEFAULT, rdzv_conf_default

__all__ = [
    "ATTEMPT_PREFIX",
    "BY_NAME",
    "RDZV_CONF_DEFAULT",
    "config",
    "etcdv2",
    "leave",
    "lifeline",
    "liveness",
    "parse_attempt",
    "rdzv_conf_default",
    "setup_logging",
    "warm",
]
