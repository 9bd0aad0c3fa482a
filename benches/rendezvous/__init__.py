"""scripts/bench-rendezvous (and scripts/bench's rendezvous figure): N agents of each backend
against one etcd, through a bring-up, a SIGKILL and a silent loss.

agents.py    one process of agents as threads (`python -m`), driven line by line
counting.py  what each agent asks of etcd: requests and bytes written, by activity
profiles.py  the backends compared, each with the chart's settings for its size
figure.py    one run: the etcd, the processes, the phases and their seconds
report.py    the runs reduced to medians, and the table (ratios to etcd-lease)
three.py     the README's figures at 3-4 real torchrun nodes on each backend
cli.py       the sizes and repeats, backends alternating, the JSON written
"""
