"""timings.py: how the worker's internal timings must relate, asserted here rather than
stated in comments. A change to one value that breaks a relation fails here first."""

from __future__ import annotations

import ast

from elastic_worker import timings
from elastic_worker.settings.definitions import BY_NAME

from worker.test_layers import SRC


def test_a_round_key_survives_a_slow_refresh_and_two_missed_ones() -> None:
    """A healthy member must not lapse: three refreshes fit in the TTL, and one request
    that takes its whole timeout still leaves a refresh time to land."""
    assert 3 * timings.ROUND_KEY_REFRESH <= timings.ROUND_KEY_TTL
    assert timings.ROUND_REQUEST_TIMEOUT + timings.ROUND_KEY_REFRESH < timings.ROUND_KEY_TTL
    assert isinstance(timings.ROUND_KEY_TTL, int)  # etcd's TTLs and leases are whole seconds


def test_a_lapse_is_read_well_before_the_key_would_be_written_again() -> None:
    assert timings.ROUND_POLL <= timings.ROUND_KEY_REFRESH
    # a `left` key outlives every member's next reads, and a whole re-form
    assert timings.ROUND_LEFT_TTL >= 10 * timings.ROUND_KEY_TTL


def test_the_helper_answers_after_the_work_it_is_asked_to_do() -> None:
    """A take-out retries for TAKE_OUT_TIMEOUT; the helper's answer waits longer, or a slow
    take-out would be taken for a dead helper and started again."""
    assert timings.HELPER_TIMEOUT >= 2 * timings.TAKE_OUT_TIMEOUT


def test_the_leave_at_a_signal_fits_before_torchrun_is_killed() -> None:
    """The completion read and the take-out at a SIGTERM end within the shortest grace the
    chart allows torchrun's workers (the shutdown timeout of a 10 s grace period)."""
    from elastic_worker.launch.argv import shutdown_timeout  # noqa: PLC0415

    assert shutdown_timeout(10) >= timings.LEAVE_ASK + timings.TAKE_OUT_TIMEOUT


def test_a_stuck_round_is_judged_after_torchs_own_poll_and_this_watchs() -> None:
    assert timings.STUCK_SLACK >= timings.TORCH_RENDEZVOUS_POLL + timings.STUCK_POLL


def test_a_lifeline_is_judged_within_a_poll_of_the_watch() -> None:
    assert timings.LIFELINE_CONNECT_TIMEOUT <= 2 * timings.LIFELINE_POLL
    assert timings.LIFELINE_GREETING_TIMEOUT <= timings.LIFELINE_CONNECT_TIMEOUT


def test_a_confirmed_pod_is_not_asked_again_at_every_refresh() -> None:
    assert timings.FENCE_CONFIRMED_FOR >= 2 * timings.ROUND_KEY_REFRESH
    assert timings.FENCE_API_TIMEOUT <= timings.FENCE_CONFIRMED_FOR


def test_a_lost_peer_is_watched_well_past_the_control_planes_grace_and_any_reclaim_bound() -> None:
    node_monitor_grace = 50.0  # kube-controller-manager's default (40 s before 1.32)
    most = float(BY_NAME["ELASTIC_RECLAIM_AFTER"].default or 0)
    assert 5 * (node_monitor_grace + most) <= timings.RECLAIM_WATCH_FOR
    assert timings.RECLAIM_POLL >= timings.RECLAIM_API_TIMEOUT


def test_the_end_of_the_job_is_seen_before_torchrun_is_stopped_for_it() -> None:
    assert timings.COMPLETION_POLL < timings.COMPLETION_GRACE
    assert timings.EXIT_BARRIER_ASK <= timings.EXIT_BARRIER_SAY
    assert timings.EVENT_POST_TIMEOUT <= timings.EVENTS_CLOSE_WAIT


def test_a_member_key_is_refreshed_well_within_its_ttl() -> None:
    """gate/members.py refreshes every third of it."""
    assert timings.MEMBER_TTL / 3 >= 3 * timings.ROUND_KEY_REFRESH
    assert isinstance(timings.MEMBER_TTL, int)


def test_a_hang_is_judged_by_every_pod_before_a_report_goes() -> None:
    """The pods of a round see a stall within a poll or two of each other, and each dumps
    its ranks twice: the wait for the others' reports covers both, and a report outlives
    the wait, or a pod slower by a dump would judge without the first pod's."""
    judging = timings.STACK_GAP + 2 * timings.STACK_WAIT + 2 * timings.HANG_POLL
    assert 2 * judging <= timings.HANG_AGREE_FOR
    assert 2 * (timings.HANG_AGREE_FOR + judging) <= timings.HANG_REPORT_TTL
    assert isinstance(timings.HANG_REPORT_TTL, int)  # etcd's TTLs and leases are whole seconds


def test_a_hang_bound_cannot_be_shorter_than_a_judgement() -> None:
    """The chart's shortest floor (seconds > 0, but a poll is the resolution) is above the
    watch's poll: a step seen within a poll is never taken for a stall."""
    assert timings.HANG_POLL <= timings.ATTEMPTS_POLL
    assert float(BY_NAME["ELASTIC_HANG_FLOOR"].default or 0) >= 10 * timings.HANG_POLL


def test_no_module_keeps_a_timing_of_its_own() -> None:
    """Every module-level float constant of the worker is in timings.py (counts, sizes and
    codes are ints and stay where they are used)."""
    own = []
    for path in SRC.rglob("*.py"):
        if path.name == "timings.py":
            continue
        for node in ast.parse(path.read_text()).body:
            target = node.target if isinstance(node, ast.AnnAssign) else None
            if isinstance(node, ast.Assign) and len(node.targets) == 1:
                target = node.targets[0]
            value = getattr(node, "value", None)
            if (
                isinstance(target, ast.Name)
                and target.id.isupper()
                and isinstance(value, ast.Constant)
                and isinstance(value.value, float)
            ):
                own.append(f"{path.relative_to(SRC)}: {target.id}")
    assert own == []
