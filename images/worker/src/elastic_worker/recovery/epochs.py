"""Rendezvous epochs: a fresh torch rendezvous id when the old one was closed too early.

torch closes a rendezvous for good when any agent ends with an error other than a signal
(torch/distributed/launcher/api.py `launch_agent`: `rdzv_handler.shutdown()`), for example
a RendezvousConnectionError while the etcd pod restarts, or an agent out of restarts.
Every later torchrun with that id fails at once with RendezvousClosedError, so without a
new id the job could never train again. The epoch lives under the project's own prefix,
`/elastic-job/<job>/epoch`; epoch 0 is the job id itself, epoch N is `<job id>-r<N>`.
Whether a rendezvous is closed is asked through torch's public handler API
(`RendezvousHandler.is_closed`, rendezvous.py), never by reading torch's keys.
"""

from __future__ import annotations

import logging

from elastic_worker.keystore import interface as kvstore
from elastic_worker.recovery import rendezvous
from elastic_worker.settings.config import Config

logger = logging.getLogger(__name__)

#: Re-openings one elastic-worker process makes before it leaves the failure to the
#: kubelet (restart with back-off): a script that fails every time must not loop here.
MAX_REOPENS = 3


def epoch_key(config: Config) -> str:
    return f"{config.key_prefix}/epoch"


def run_id(config: Config, epoch: int) -> str:
    """torch's --rdzv-id for an epoch."""
    return config.job_id if epoch == 0 else f"{config.job_id}-r{epoch}"


def current(client: kvstore.KeyStore, config: Config) -> int:
    value = client.get_value(epoch_key(config))
    if value is None:
        return 0
    try:
        return max(0, int(value))
    except ValueError:
        logger.warning("ignoring %s=%r: not a whole number", epoch_key(config), value)
        return 0


def advance(client: kvstore.KeyStore, config: Config, seen: int) -> int:
    """Move the epoch from `seen` to `seen + 1` unless another pod moved it first (a
    compare-and-swap); return the epoch in force afterwards."""
    try:
        if seen == 0:
            client.set(epoch_key(config), "1", prev_exist=False)
        else:
            client.set(epoch_key(config), str(seen + 1), prev_value=str(seen))
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
