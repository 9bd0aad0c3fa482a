"""Lifelines: a peer whose processes die is taken out of the round at once.

server.py     this pod's lifeline: greets with its torchrun's pid, holds the connection
client.py     lifelines to every other node of the round; a closed one is judged
              (verdict) and its node taken out (LifelineWatcher, watch)
helper.py     the round read and a node taken out, in a helper forked from the warm
              server (torch imported there) or here
messages.py   the greeting and the helper's requests and answers
"""
