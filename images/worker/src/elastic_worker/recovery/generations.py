"""Rendezvous generations: a fresh torch rendezvous id when torch closed the current one
before the job completed.

torch closes a rendezvous for good when any agent ends with an error other than a signal
(torch/distributed/launcher/api.py `launch_agent`: `rdzv_handler.shutdown()`), for example
a RendezvousConnectionError while the etcd pod restarts, or an agent out of restarts.
Every later torchrun with that id fails at once with RendezvousClosedError, so without a
new id the job could never train again. The generation is kept under the project's own
prefix, `/elastic-job/<job>/generation`; generation 0 is the job id itself, generation N
is `<job id>-r<N>`. Whether a rendezvous is closed is asked through torch's public handler
API (`RendezvousHandler.is_closed`, rendezvous.py), never by reading torch's keys.
"""

from __future__ import annotations

import logging

from elastic_worker.keystore import interface as kvstore
from elastic_worker.recovery import rendezvous
from elastic_worker.settings.config import Config

logger = logging.getLogger(__name__)


def generation_key(config: Config) -> str:
    return f"{config.key_prefix}/generation"


def run_id(config: Config, generation: int) -> str:
    """torch's --rdzv-id for a generation."""
    return config.job_id if generation == 0 else f"{config.job_id}-r{generation}"


def current(client: kvstore.KeyStore, config: Config) -> int:
    value = client.get_value(generation_key(config))
    if value is None:
        return 0
    try:
        return max(0, int(value))
    except ValueError:
        logger.warning("ignoring %s=%r: not a whole number", generation_key(config), value)
        return 0


def advance(client: kvstore.KeyStore, config: Config, seen: int) -> int:
    """Move the generation from `seen` to `seen + 1` unless another pod moved it first (a
    compare-and-swap); return the generation in force afterwards."""
    try:
        if seen == 0:
            client.set(generation_key(config), "1", prev_exist=False)
        else:
            client.set(generation_key(config), str(seen + 1), prev_value=str(seen))
        return seen + 1
    except (kvstore.NodeExists, kvstore.CompareFailed, kvstore.KeyNotFound):
        return current(client, config)


def rendezvous_closed(config: Config, rdzv_id: str) -> bool:
    """torch's own answer for `rdzv_id` (rendezvous.closed)."""
    return rendezvous.closed(config, rdzv_id)


def closed_early(config: Config, rdzv_id: str) -> bool:
    """True when torch closed `rdzv_id` although the job is not complete; False when it
    is open or etcd cannot say (the kubelet's restart and the gate take it from there)."""
    try:
        return rendezvous_closed(config, rdzv_id)
    except Exception as exc:  # noqa: BLE001 - torch raises its own and etcd's errors
        logger.info("could not ask whether rendezvous %s is closed: %s", rdzv_id, exc)
        return False
