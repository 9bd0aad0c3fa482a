"""Every name the benches take from the worker (images/worker, `elastic_worker`), in one
place: when the worker's modules move, this file changes and no bench does.

The benches run the worker's own code where a pod would (the node-loss policy with its
lifelines, the leave at SIGTERM, warm starts, the round liveness) and its defaults
(settings), so that a figure measures what the chart runs. (`parse_attempt`: tests/bench
check that the attempt line the soak writes is one the worker reads.)
"""

from __future__ import annotations

from elastic_worker import timings
from elastic_worker.attempt_line import ATTEMPT_LOG_ENV, ATTEMPT_PREFIX, parse_attempt
from elastic_worker.completion import Completion
from elastic_worker.keystore import etcdv2
from elastic_worker.keystore import interface as kvstore
from elastic_worker.main import setup_logging
from elastic_worker.recovery import lossdetect as liveness
from elastic_worker.recovery import policy
from elastic_worker.recovery import round as rounds
from elastic_worker.settings import config
from elastic_worker.settings.definitions import BY_NAME
from elastic_worker.settings.schema import RDZV_CONF_DEFAULT, rdzv_conf_default
from elastic_worker.warm import server as warm
from elastic_worker.warm.protocol import warm_command

__all__ = [
    "ATTEMPT_LOG_ENV",
    "ATTEMPT_PREFIX",
    "BY_NAME",
    "RDZV_CONF_DEFAULT",
    "Completion",
    "config",
    "etcdv2",
    "kvstore",
    "liveness",
    "parse_attempt",
    "policy",
    "rdzv_conf_default",
    "rounds",
    "setup_logging",
    "timings",
    "warm",
    "warm_command",
]
