"""Warm starts: training processes forked from a server that has imported torch.

server.py     the server (python -m elastic_worker.warm.server), started once per pod
child.py      a forked child becoming the user's program, as `python -u` would run it
client.py     what torchrun runs in place of `python -u` (standard library only)
master.py     a child's env:// rendezvous waits for rank 0's store to listen
protocol.py   the client's command line, its request and the server's answers
"""
