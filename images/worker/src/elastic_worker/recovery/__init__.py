"""What a re-form takes, from a failure seen to the next round.

    lossdetect.py   silent-loss detection: round keys with a TTL; a lapse stops the attempt
    fence.py        this incarnation fenced when a newer one replaced it (its node was lost)
    reclaim.py      a dead node's pod force-deleted so that its StatefulSet places it again
    leave.py        leaving the round at once: this pod at a signal, a dead peer's node
    lifelines/      a TCP connection to every peer; a closed one takes the node out
    epochs.py       a fresh rendezvous id when torch closed the current one early
    rendezvous.py   torch's public rendezvous API (the handler, is_closed)
    stuckround.py   a torchrun waiting for a node that left its just-completed round
                    (while torch assigns worker ranks): stopped and started again

torch's private internals (what leave.py and lifelines/ need) are in ../torchcompat.py.
"""
