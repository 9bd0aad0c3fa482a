"""The project's own etcd keys (completion, generation, members, rounds).

interface.py  the KeyStore interface, its errors, connect() for the job's backend
etcdv2.py     etcd's v2 keys API (etcd-v2 backend)
etcdv3.py     etcd's v3 API through torch_etcd_v3's client (etcd-v3 backend)
"""
