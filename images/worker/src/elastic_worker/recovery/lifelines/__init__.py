"""Lifelines: a peer whose processes die is seen at once, by its closed connection.

server.py     this pod's lifeline: greets with its torchrun's pid, holds the connection
client.py     lifelines to every other node of the round; a closed one is judged
              (verdict) and told to the node-loss policy (LifelineWatcher)
helper.py     the round's operations (recovery/round.py) in a helper forked from the
              warm server (torch imported there)
messages.py   the greeting and the helper's requests and answers
"""
