"""scripts/bench's rendezvous figure: N agents joining one round against one etcd.

agents.py   one process of agents as threads (`python -m`), joining when told
figure.py   a run: the etcd, the processes, the seconds and the etcd writes per join
"""
