"""elastic-worker: one Kubernetes pod of an elastic PyTorch job, from its settings to its
exit code (`elastic-worker <training command>`, docs/contracts.md). The folders follow a
pod's life:

    main.py          arguments and environment -> one Config and the key store; pod.run
    pod.py           the pod's life: gate -> torchrun after torchrun -> end; its services
                     started and stopped by one owner (an ExitStack)
    torchruns.py     torchrun after torchrun (Torchruns), and the signal relay to the
                     running one (Relay)
    exits.py         the exit codes
    timings.py       every internal timing, in one place
    image.py         what the image must have (Python, torch), checked at the start
    bundle.py        the worker injected into a user's image: the bundle's layout, and
                     which of its processes sees which libraries
    settings/        every ELASTIC_* variable defined once (definitions.py, schema.py),
                     read into one Config (config.py, rendezvous.py, envfile.py)
    gate/            the readiness gate: its wait (wait.py), probes (probes.py), peer
                     registration (members.py), the job's kind of node (topology.py),
                     the interface and address choice (netif.py), locked memory for RDMA
                     (memlock.py), all in order (ready.py)
    launch/          torchrun's argv and environment (argv.py), torchrun supervised
                     (supervisor.py), torch's torchrun with the job's exit barrier
                     (torchrun.py)
    attempt_line.py  the attempt shim torchrun runs before the program, and its line
    rankprobe.py     a training process's optimizer steps and, on a signal, its stacks
                     (installed by a warm child, read by recovery/hangs.py)
    completion.py    the end of the job: its table of decision points
    scaledown.py     the job's StatefulSets scaled to 0 at its end
    recovery/        the loss of a node (and a rank that hangs): its table of signals and
                     actions (policy.py), and the detectors and mechanisms it wires
                     (recovery/__init__.py)
    torchcompat.py   torch's private rendezvous internals, behind one fence
    warm/            warm starts: a server that forks training processes (server.py,
                     child.py) and the client torchrun runs (client.py), protocol.py
    observe/         metrics (metrics.py), torchrun's attempts followed (attempts.py),
                     a script's snapshot lines (snapshots.py), Kubernetes Events and
                     their reasons (events.py)
    kubeapi.py       the few requests to the API server (standard library only)
    keystore/        the project's own etcd keys: the interface (interface.py) and its
                     two backends (etcdv2.py, etcdv3.py)

The packages import each other in one direction (tests/worker/test_layers.py): settings
and keystore below everything, then observe, gate, launch, recovery, and the modules
that run the pod (torchruns.py, pod.py, main.py) on top.

Nothing here is imported by a package __init__: `python -m elastic_worker.warm.client`
starts once per training process and stays cheap.
"""
