"""init-topology: the node a pod runs on, its labels and fabric, written to /etc/inject/env.

Modules by concern: `config` (environment -> one frozen Config), `nodeapi` (GET the Node
over HTTPS with the standard library, bounded retries), `mapping` (pure: Node -> ordered
variables), `envfile` (the KEY='value' file, written atomically), `main` (the console script).
The package needs nothing beyond the standard library.
"""

__version__ = "0.1.0"
