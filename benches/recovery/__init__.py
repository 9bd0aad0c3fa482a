"""scripts/bench-recovery: what a lost node costs an elastic torchrun job.

profiles.py       what each profile runs (torch's defaults, the project's tunings)
agent.py          one torchrun agent's output, stamped: steps, phases of a recovery
job.py            one job: a private etcd, the agents, warm servers, lifelines; a loss
lifeline_node.py  a node's lifelines as elastic-worker runs them (`python -m`)
measure.py        one run: bring-up, scale-up, a loss and the recovery, or a soak
cli.py            the command line and its table
"""
