"""The worker's settings, read once.

definitions.py   every variable: name, kind, default, where the chart sets it, meaning
schema.py        what a definition is (Kind, Source, Setting), ConfigError, the
                 rendezvous defaults the table derives from
config.py        load(): the environment and /etc/inject/env -> one frozen Config
rendezvous.py    the endpoint, --rdzv-conf and the TLS of etcd
envfile.py       /etc/inject/env read as data (never sourced)
"""
