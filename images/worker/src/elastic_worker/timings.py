"""Every internal timing of the worker, in seconds, in one place.

These are not settings: a user tunes the job through the chart (settings/definitions.py).
Each line says what the value trades; how the values must relate to each other (a
refresh well inside its TTL, a helper that waits longer than the work it is asked to do)
is asserted in tests/worker/test_timings.py, not stated here. The modules that use them
name them at call time or as defaults, so a test may shorten one.
"""

from __future__ import annotations

# -- torch's own ------------------------------------------------------------------------
#: torch's dynamic rendezvous polls its state about once a second (its state cache).
TORCH_RENDEZVOUS_POLL = 1.0

# -- the readiness gate (gate/) ---------------------------------------------------------
GATE_POLL = 0.5  # between two checks of a probe that did not pass
GATE_PROGRESS_EVERY = 5.0  # between two progress lines while the gate waits
#: A member key's time to live (gate/members.py); refreshed every third of it. Long: a
#: member that lapses is only not counted by the gate and the metrics.
MEMBER_TTL = 30

# -- silent-loss detection: the round keys (recovery/lossdetect.py) ---------------------
#: A member's round key lives this long after its last refresh: the time a silent loss
#: takes to be seen, traded against false evictions of a member on a saturated node
#: (scripts/soak-false-evictions). Whole seconds: etcd's v2 TTLs and v3 leases are.
ROUND_KEY_TTL = 4
ROUND_KEY_REFRESH = 1.0  # between two refreshes of this pod's round key
ROUND_POLL = 0.5  # between two reads of the round's members (and of the attempt log)
#: One round-key request's bound: a slow one must not hold the next refresh.
ROUND_REQUEST_TIMEOUT = 2.0
#: A key rewritten `left` stays this long, so that every member reads it before it goes.
ROUND_LEFT_TTL = 60

# -- lifelines (recovery/lifelines/) ------------------------------------------------------
LIFELINE_CONNECT_TIMEOUT = 1.0  # a peer that does not answer within it proves nothing
LIFELINE_GREETING_TIMEOUT = 1.0  # to send the greeting to a peer that connected
LIFELINE_POLL = 0.5  # between two looks for a new round (the attempt log)

# -- a node taken out of torch's round (recovery/round.py) -------------------------------
#: How long a take-out retries torch's compare-and-set before the keep-alive does it.
TAKE_OUT_TIMEOUT = 5.0
#: One answer of the lifelines' helper (it may be running a take-out).
HELPER_TIMEOUT = 15.0

# -- a torchrun stuck in a round that lost a node (recovery/stuckround.py) ---------------
STUCK_POLL = 0.5  # between two reads of the round while no worker runs
#: Beyond torch's keep-alive window: torch's poll, this watch's poll and the state's cache.
STUCK_SLACK = 2.0
#: A torchrun stopped to be launched again has no workers: it ends at once, else SIGKILL.
RELAUNCH_GRACE = 10.0

# -- a rank that hangs while alive (recovery/hangs.py) ------------------------------------
HANG_POLL = 0.5  # between two reads of the rank files (a step seen within it)
#: Between a rank's two stack dumps: a stack that changed in it moves (slow, not hung).
STACK_GAP = 1.0
STACK_WAIT = 2.0  # for a dump to be written (faulthandler writes it at once)
#: For every member of the round to report its stall: they see it within a poll or two
#: of each other; one that does not report in this time still steps.
HANG_AGREE_FOR = 15.0
#: A stall report outlives the judgement by this; a pod that steps again deletes its own.
HANG_REPORT_TTL = 60
#: For the culprit's processes to end (and this pod's attempt with them) before this pod
#: stops its own: one blocked in the kernel cannot be killed and keeps its sockets open.
HANG_TAKEOUT_GRACE = 10.0

# -- this incarnation fenced (recovery/fence.py) -----------------------------------------
FENCE_API_TIMEOUT = 5.0
#: A "this pod" answer stands this long before the next sign asks again.
FENCE_CONFIRMED_FOR = 5.0

# -- a dead node's pod reclaimed (recovery/reclaim.py) -----------------------------------
RECLAIM_POLL = 5.0  # between two reads of a lost peer's pod
#: How long a lost peer is watched: well past the control plane's node-monitor grace
#: period (40-50 s) and any nodeLoss.reclaim.afterSeconds one would choose.
RECLAIM_WATCH_FOR = 900.0
RECLAIM_API_TIMEOUT = 5.0

# -- torchrun supervised, and the end of the job (launch/supervisor.py, completion.py) ---
COMPLETION_POLL = 2.0  # between two reads of the completion marker while torchrun runs
COMPLETION_GRACE = 15.0  # torchrun's time to end by itself once the job is complete
#: After a failed torchrun: how long to wait for another pod's completion marker.
FAILURE_WAIT = 15.0
#: After a SIGTERM: how long to keep asking whether the job completed (etcd, then the
#: API: at the end both may be going away), well inside the pod's grace period.
STOPPED_ASK = 10.0
LEAVE_ASK = 2.0  # the completion read before this pod leaves its round at a signal
MARK_FOR = 30.0  # to keep trying to set the completion marker after success
#: In torch's exit barrier before the worker says whom it waits for (nodes that finish
#: together pass it within a second), then between two reads of who has not finished.
EXIT_BARRIER_SAY = 2.0
EXIT_BARRIER_ASK = 2.0

# -- what the pod tells the world (observe/) ---------------------------------------------
ATTEMPTS_POLL = 0.5  # between two reads of the attempt log and the progress file
#: Between two reads of the progress file while a save is awaited (a silent loss's
#: SIGKILL comes once the script said it saved).
SAVE_AWAIT_POLL = 0.02
EVENT_POST_TIMEOUT = 3.0  # an Event is worth less than a stalled worker
EVENTS_CLOSE_WAIT = 3.0  # for queued Events when the pod exits

# -- etcd ---------------------------------------------------------------------------------
ETCD_TIMEOUT = 5.0  # one request of the worker's own keys
#: A TLS server that drops every connection the same way for this long (and at least 3
#: times) refuses this worker: one drop can be a restart or a proxy starting.
TLS_DROP_SECONDS = 5.0

# -- warm starts (warm/) ------------------------------------------------------------------
WARM_BIND_WAIT = 5.0  # for the warm server's socket; a client finding none starts cold
#: A warm child's wait for rank 0's store: a connection attempt every MASTER_POLL while
#: rank 0 does not listen yet, every MASTER_SLOW_POLL after MASTER_FAST_FOR.
MASTER_POLL = 0.005
MASTER_FAST_FOR = 2.0
MASTER_SLOW_POLL = 0.05
MASTER_CONNECT_TIMEOUT = 1.0  # one attempt (a listening port answers at once)
