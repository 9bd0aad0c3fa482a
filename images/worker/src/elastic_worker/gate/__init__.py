"""The readiness gate: what a pod waits for before torchrun starts, bounded.

ready.py     the gate in order: DNS and etcd (or a complete job), the mesh, the
             interface choice, the peers; returns what it established
wait.py      the bounded wait with progress lines, and how it ends (exceptions)
probes.py    DNS, etcd's API for the backend (TLS and API errors as one line), mesh
certusage.py a client certificate's extended key usages (a refused one named)
members.py   this pod's member key under <prefix>/members/, refreshed while it runs
topology.py  the job's kind of node; a pod of another kind refused, or warned
netif.py     NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME
memlock.py   RLIMIT_MEMLOCK with RDMA devices
"""
