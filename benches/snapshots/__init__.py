"""scripts/bench-snapshots (scripts/bench's figures `snap-loss`, `snap-overhead` and
`snap-goodput`): what a lost node costs with elastic-snapshot beside today's checkpoint-only
path, in the same run (packages/elastic-snapshot, docs/snapshots.md).

    scripts.py    the training scripts measured and how to read their lines
    job.py        elastic-worker agents on this machine (a node each: an address, a
                  lifeline, a /dev/shm of its own) against a private etcd; losing one
    losses.py     steps lost and seconds to train again after SIGKILL, a silent loss and
                  SIGTERM, with DDP and FSDP2
    overhead.py   what keeping the state costs per step: train.py, and a model of 100M+
                  parameters (bigmodel.py, run under torchrun)
    bigmodel.py   that model's training program (python -m benches.snapshots.bigmodel)
    goodput.py    goodput under churn through the local run of the chart (root)
    report.py     the table's lines
    cli.py        the command line, and the figures as scripts/bench runs them
"""
