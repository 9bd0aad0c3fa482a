"""scripts/soak-false-evictions: the round liveness on a saturated machine.

member.py   one member of the round: the worker's liveness code (`python -m`)
watch.py    etcd's events on the round: refresh gaps per member, lapses
cli.py      the soak: etcd, members, busy loops; the report and its verdict
"""
