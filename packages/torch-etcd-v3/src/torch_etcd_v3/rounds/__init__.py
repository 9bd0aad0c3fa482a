"""`etcd-lease`: a torchrun rendezvous whose rounds live in the job's own etcd keys, one
per node under the node's own lease, so that what a node costs etcd does not grow with
the job (the package README's "etcd-lease"; docs/rendezvous.md has the figures).

    keys.py      where a job's rounds live (one prefix per run id)
    rule.py      when a round is decided and who is in it (pure)
    member.py    this node's lease, kept alive: the heartbeat
    protocol.py  join, wait, decide; what a member learns while its round trains
    view.py      the rounds as another process reads and changes them (elastic-worker)
    torchapi.py  what is taken from torch, by release (2.1-2.14)
    handler.py   torch's RendezvousHandler over protocol.py
    entry.py     the `torchrun.handlers` entry point; register() for torch < 2.5

Everything but torchapi.py and handler.py is the standard library alone.
"""
