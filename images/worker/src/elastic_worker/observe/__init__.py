"""What the pod tells the world about itself.

metrics.py    Prometheus metrics and the pod's state machine (Tracker)
attempts.py   torchrun's attempts and the script's progress, followed for the metrics
snapshots.py  a script's snapshot lines (restored=, saved=): for the log, the metrics and
              the loss detection
events.py     Kubernetes Events on the pod and its StatefulSet, and their reasons
"""
