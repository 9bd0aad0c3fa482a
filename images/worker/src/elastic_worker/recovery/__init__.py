"""What the pod does when the job loses a node. Start at policy.py: its table names every
signal and the action it leads to, and it wires the rest.

    policy.py       the table (RULES) and the wiring: NodeLoss (the pod's detectors),
                    TorchrunWatch (one torchrun's), After (what follows a torchrun's exit)
    lossdetect.py   silent-loss detection: round keys with a TTL; a lapse is told
    hangs.py        a rank that hangs while alive: no step for the bound, the culprit named
    lifelines/      a TCP connection to every peer; a closed one is told
    stuckround.py   a torchrun waiting for a node that left its just-completed round
    fence.py        this incarnation fenced when a newer one replaced it (its node was lost)
    reclaim.py      a dead node's pod force-deleted so that its StatefulSet places it again
    round.py        torch's round read, and a node taken out of it (this one, or a peer)
    generations.py  a fresh rendezvous id when torch closed the current one early
    rendezvous.py   torch's public rendezvous API (the handler, is_closed)

torch's private internals (what round.py needs) are in ../torchcompat.py; every timing
is in ../timings.py.
"""
