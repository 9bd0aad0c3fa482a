"""elastic-worker: one Kubernetes pod of an elastic PyTorch job, from its settings to its
exit code (`elastic-worker <training command>`, docs/contracts.md). The folders follow a
pod's life:

    main.py          arguments and environment -> one Config and the key store; pod.run
    pod.py           the pod's life: gate -> torchrun epoch after epoch -> end; its
                     services started and stopped by one owner (an ExitStack)
    torchruns.py     torchrun run after run, one per rendezvous epoch (Epochs), and the
                     signal relay to the running one (Relay)
    exits.py         the exit codes
    image.py         what the image must have (Python, torch), checked at the start
    bundle.py        the worker injected into a user's image: the bundle's layout, and
                     which of its processes sees which libraries
    settings/        every ELASTIC_* variable defined once (definitions.py, schema.py),
                     read into one Config (config.py, rendezvous.py, envfile.py)
    gate/            the readiness gate: its wait (wait.py), probes (probes.py), peer
                     registration (members.py), the job's kind of node (topology.py),
                     the interface choice (netif.py), locked memory for RDMA
                     (memlock.py), all in order (ready.py)
    launch/          torchrun's argv and environment (argv.py), the attempt shim and its
                     line (attempt_line.py), torchrun supervised (supervisor.py)
    completion.py    whether the job is complete: every decision about it
    scaledown.py     the job's StatefulSets scaled to 0 at its end
    recovery/        what a re-form takes: silent-loss detection (lossdetect.py), leaving
                     the round (leave.py), lifelines to the peers (lifelines/), rendezvous
                     epochs (epochs.py), torch's public rendezvous API (rendezvous.py);
                     what a lost node takes: this incarnation fenced (fence.py), the
                     dead node's pod reclaimed (reclaim.py)
    torchcompat.py   torch's private rendezvous internals, behind one fence
    warm/            warm starts: a server that forks training processes (server.py,
                     child.py) and the client torchrun runs (client.py), protocol.py
    observe/         metrics (metrics.py), torchrun's attempts followed (attempts.py),
                     a script's snapshot lines (snapshots.py), Kubernetes Events
                     (events.py), the API server (kubeapi.py)
    keystore/        the project's own etcd keys: the interface (interface.py) and its
                     two backends (etcdv2.py, etcdv3.py)

Nothing here is imported by a package __init__: `python -m elastic_worker.warm.client`
starts once per training process and stays cheap.
"""
