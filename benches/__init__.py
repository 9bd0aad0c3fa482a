"""The project's benchmarks, each behind a thin entry point in scripts/ (same name, same
command line). Figures are printed beside a baseline measured in the same run.

    suite/          scripts/bench: every figure beside torch's defaults; bench.json, plots
    recovery/       scripts/bench-recovery: a lost node, timed by phase, per profile
    rendezvous/     scripts/bench's rendezvous figure: N agents joining one round
    churn/          scripts/bench-churn: a silent loss and goodput, through the local run
    snapshots/      scripts/bench-snapshots: steps lost, per-step cost and goodput with
                    snapshots in memory beside the checkpoint alone
    hangs/          scripts/bench-hangs: a hung rank to training again, hang detection
                    on beside torch's defaults (capped)
    soak/           scripts/soak-false-evictions: the round liveness on a saturated machine
    init_topology.py       scripts/bench-init-topology: the init container end to end
    reform_monitoring.py   scripts/bench-reform-monitoring: whether metrics slow a re-form
    render.py              scripts/bench-render: `helm template` with many worker groups
    spares.py              scripts/bench-spares: back at full size after a loss, with a spare

Shared by them:

    env.py         the checkout, its venv, the re-exec into it
    procs.py       a private etcd, free ports, process trees, busy loops, a quiet machine
    cgroups.py     a cgroup of our own: a measured process under a CPU or memory limit
    stats.py       medians and spreads, a wait cut at a bound, percentiles
    worker.py      every name taken from elastic_worker, in one place

Programs the benches start in processes of their own are modules run with `python -m`
(recovery/lifeline_node.py, rendezvous/agents.py, soak/member.py). This package imports
nothing at its top: the entry points import env.py under the system python first.
"""
