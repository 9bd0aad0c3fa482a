"""The profiles bench-recovery compares: torch's defaults and the project's tunings, each
the rendezvous settings, the monitor interval, the environment and the process-group
timeout of train.py, and which of elastic-worker's parts run (warm starts, the leave at
SIGTERM, lifelines)."""

from __future__ import annotations

from dataclasses import dataclass, field

from benches.worker import BY_NAME, RDZV_CONF_DEFAULT

MONITOR_INTERVAL = float(str(BY_NAME["ELASTIC_MONITOR_INTERVAL"].default))
#: What the warm server imports before it forks: elastic-worker's default.
PRELOAD = str(BY_NAME["ELASTIC_WARM_PRELOAD"].default).split(",")
#: torch's shared agent TCPStore off, as elastic-worker sets it.
NO_SHARED_STORE = {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}


@dataclass(frozen=True)
class Profile:
    rdzv_conf: str  # torchrun's --rdzv-conf ("" for torch's defaults)
    monitor: float  # torchrun's --monitor-interval
    pg_timeout: int  # train.py's process-group timeout (TRAIN_PG_TIMEOUT), seconds
    env: dict[str, str] = field(default_factory=dict)
    warm: bool = False  # each training process forked from a warm server
    leave: bool = False  # a SIGTERMed node leaves the round at the signal
    lifeline: bool = False  # the others take a dead node out when its lifelines close


TUNED = Profile(RDZV_CONF_DEFAULT, MONITOR_INTERVAL, 60, NO_SHARED_STORE)

PROFILES: dict[str, Profile] = {
    "baseline": Profile("", 0.1, 1800),
    "baseline-fixed-store": Profile("", 0.1, 60, NO_SHARED_STORE),
    "design": Profile("last_call_timeout=2", 0.1, 1800),
    "design2": Profile(
        "last_call_timeout=1,keep_alive_interval=1,keep_alive_max_attempt=2", 0.1, 1800
    ),
    "tuned-shared-store": Profile(RDZV_CONF_DEFAULT, MONITOR_INTERVAL, 60),
    "tuned": TUNED,
    "tuned-warm": Profile(
        RDZV_CONF_DEFAULT,
        MONITOR_INTERVAL,
        60,
        NO_SHARED_STORE,
        warm=True,
        leave=True,
        lifeline=True,
    ),
    # Before the lifelines (elastic_worker/recovery/lifelines/): for comparison.
    "tuned-warm-no-lifeline": Profile(
        RDZV_CONF_DEFAULT, MONITOR_INTERVAL, 60, NO_SHARED_STORE, warm=True, leave=True
    ),
    # The waits before they were measured down, for comparison
    # (docs/notes/2026-11-21-torch-rendezvous-settings.md).
    "tuned-warm-before": Profile(
        RDZV_CONF_DEFAULT.replace("last_call_timeout=1", "last_call_timeout=2"),
        MONITOR_INTERVAL,
        60,
        NO_SHARED_STORE,
        warm=True,
    ),
}
