"""init-topology: the node a pod runs on, its labels and fabric, written to /etc/inject/env.

Modules by concern: `config` (environment -> one frozen Config), `nodeapi` (GET the Node
with the official client, bounded retries), `k8s` (the client's classes, imported lean),
`mapping` (pure: Node -> ordered variables), `envfile` (the KEY='value' file, written
atomically), `main` (the console script).
"""

__version__ = "0.1.0"
