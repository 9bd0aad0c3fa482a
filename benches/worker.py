"""Every name the benches take from the worker (images/worker, `elastic_worker`), in one
place: when the worker's modules move, this file changes and no bench does.

The benches run the worker's own code where a pod would (the lifelines, the leave at
SIGTERM, warm starts, the round liveness) and its defaults (settings), so that a figure
measures what the chart runs. (`parse_attempt`: tests/bench check that the attempt line
the soak writes is one the worker reads.)
"""

from __future__ import annotations

from elastic_worker.keystore import etcdv2
from elastic_worker.launch.attempt_line import ATTEMPT_PREFIX, parse_attempt
from elastic_worker.main import setup_logging
from elastic_worker.recovery import leave
from elastic_worker.recovery import lossdetect as liveness
from elastic_worker.recovery.lifelines import client as lifeline
from elastic_worker.recovery.lifelines import server as lifeline_server
from elastic_worker.settings import config
from elastic_worker.settings.definitions import BY_NAME
from elastic_worker.settings.schema import RDZV_CONF_DEFAULT, rdzv_conf_default
from elastic_worker.warm import server as warm
from elastic_worker.warm.protocol import warm_command

__all__ = [
    "ATTEMPT_PREFIX",
    "BY_NAME",
    "RDZV_CONF_DEFAULT",
    "config",
    "etcdv2",
    "leave",
    "lifeline",
    "lifeline_server",
    "liveness",
    "parse_attempt",
    "rdzv_conf_default",
    "setup_logging",
    "warm",
    "warm_command",
]
