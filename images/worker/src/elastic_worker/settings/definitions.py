"""The worker's settings, defined once: name, type, default, where the chart sets it, meaning
(the types of the table in schema.py).

config.py parses the environment from this table and nothing else; the table in
docs/contracts.md is generated from it (scripts/gen-worker-settings-doc, checked by a
test); tests/charts checks that the chart sets only names defined here, that
`_validate.tpl` owns exactly the ELASTIC_* names the chart sets, and that each default
equals what the chart renders from its values.yaml defaults.
"""

from __future__ import annotations

from elastic_worker.settings.schema import (
    HEARTBEATS_PER_S,
    RDZV_CONF_DEFAULT,
    SERVICEACCOUNT_DIR,
    Kind,
    Setting,
    Source,
)

SETTINGS: tuple[Setting, ...] = (
    Setting(
        "ELASTIC_JOB_ID",
        Kind.JOB_ID,
        None,
        Source.DERIVED,
        "job.id, else <namespace>-<release>",
        "torch's --rdzv-id (generation 0) and the job's etcd prefix /elastic-job/<id>/",
    ),
    Setting(
        "ELASTIC_RDZV_ENDPOINT",
        Kind.ENDPOINT,
        None,
        Source.DERIVED,
        "the bundled etcd's client Service, else rendezvous.endpoint",
        "etcd's client endpoint, for torch and for the worker's own keys (the API of "
        "ELASTIC_RDZV_BACKEND on)",
    ),
    Setting(
        "ELASTIC_RDZV_BACKEND",
        Kind.BACKEND,
        "etcd-v2",
        Source.VALUE,
        "global.rendezvousBackend",
        "torchrun's --rdzv-backend and the etcd API of the worker's own keys: etcd-v2 (v2 "
        "API, etcd 3.5 with --enable-v2), etcd-v3 (torch-etcd-v3, v3 API, etcd 3.5 or 3.6) "
        "or etcd-lease (torch-etcd-v3's rounds in per-node leased keys, v3 API)",
    ),
    Setting(
        "ELASTIC_MIN_NODES",
        Kind.COUNT,
        None,
        Source.VALUE,
        "job.minNodes",
        "fewest nodes the job trains on (--nnodes minimum; peers the gate waits for)",
    ),
    Setting(
        "ELASTIC_MAX_NODES",
        Kind.COUNT,
        None,
        Source.VALUE,
        "job.maxNodes",
        "most nodes the job trains on (--nnodes maximum), at least ELASTIC_MIN_NODES",
    ),
    Setting(
        "ELASTIC_NPROC_PER_NODE",
        Kind.NPROC,
        "1",
        Source.VALUE,
        "job.nprocPerNode",
        "training processes per node (--nproc-per-node)",
    ),
    Setting(
        "ELASTIC_MAX_RESTARTS",
        Kind.COUNT0,
        "20",
        Source.VALUE,
        "rendezvous.maxRestarts",
        "worker-group failures torchrun restarts from (--max-restarts)",
    ),
    Setting(
        "ELASTIC_RDZV_CONF",
        Kind.RDZV_CONF,
        "",  # every key has a default, one of which depends on ELASTIC_MAX_NODES
        Source.VALUE,
        "rendezvous.* and rendezvous.tls",
        "torchrun --rdzv-conf for the backend's handler (the keys it reads); keys not given "
        f"take {RDZV_CONF_DEFAULT}, but keep_alive_interval=ELASTIC_MAX_NODES/"
        f"{HEARTBEATS_PER_S} rounded up above {HEARTBEATS_PER_S} nodes (not with etcd-lease). "
        "protocol, ca_cert, "
        "ssl_cert, ssl_cert_key also set the worker's own etcd client's TLS",
    ),
    Setting(
        "ELASTIC_MONITOR_INTERVAL",
        Kind.SECONDS,
        "0.1",
        Source.VALUE,
        "rendezvous.monitorInterval",
        "seconds between torchrun's checks of its workers (--monitor-interval)",
    ),
    Setting(
        "ELASTIC_LOSS_DETECTION",
        Kind.BOOL,
        "true",
        Source.VALUE,
        "rendezvous.lossDetection.enabled",
        "stop this pod's training processes as soon as a member of its round stops renewing "
        "its key under /elastic-job/<id>/rounds/ (a silent loss), so that torchrun re-forms",
    ),
    Setting(
        "ELASTIC_LIFELINE",
        Kind.BOOL,
        "true",
        Source.VALUE,
        "rendezvous.lifeline.enabled",
        "hold a TCP connection to every other node of the round; when one closes and the "
        "peer's torchrun is gone, take its node out of torch's round at once instead of "
        "waiting for its keep-alive (docs/notes/2026-11-26-lifelines.md)",
    ),
    Setting(
        "ELASTIC_LIFELINE_PORT",
        Kind.PORT,
        "9406",
        Source.VALUE,
        "rendezvous.lifeline.port",
        "the port of the lifeline (the container port named `lifeline`), the same in every pod",
    ),
    Setting(
        "ELASTIC_EXIT_BARRIER_TIMEOUT",
        Kind.SECONDS,
        "60",
        Source.VALUE,
        "job.exitBarrierTimeoutSeconds",
        "seconds a node whose training processes all exited 0 waits for the other nodes' "
        "(torch's exit barrier; torchrun's is 300 s) before its torchrun exits 0 and the job is "
        "complete; a training process started warm whose script has returned gets half of it "
        "to end (its teardown) before it is stopped, counted as exited with the script's code",
    ),
    Setting(
        "ELASTIC_WARM_START",
        Kind.BOOL,
        "true",
        Source.VALUE,
        "job.warmStart.enabled",
        "start each training process from a server that has imported ELASTIC_WARM_PRELOAD "
        "(a fork; docs/notes/2026-11-26-warm-starts.md) instead of a new interpreter; only for a "
        "python script or -m module command",
    ),
    Setting(
        "ELASTIC_WARM_PRELOAD",
        Kind.NAMES,
        "torch,torch._dynamo,torch.distributed.checkpoint,torch.distributed.fsdp",
        Source.VALUE,
        "job.warmStart.preload",
        "modules the warm server imports before it forks (none may initialise CUDA; one "
        "that fails to import is said and left to the training process)",
    ),
    Setting(
        "ELASTIC_GATE_TIMEOUT",
        Kind.SECONDS,
        "600",
        Source.VALUE,
        "gate.timeoutSeconds",
        "seconds the readiness gate waits before exit 3",
    ),
    Setting(
        "ELASTIC_GATE_PEERS",
        Kind.BOOL,
        "true",
        Source.VALUE,
        "gate.peers",
        "also wait until ELASTIC_MIN_NODES pods registered under /elastic-job/<id>/members/",
    ),
    Setting(
        "ELASTIC_MESH_INTERFACES",
        Kind.GLOBS,
        "wg*",
        Source.VALUE,
        "mesh.interfaces",
        "interface globs of an overlay mesh, preferred for NCCL and gloo when up",
    ),
    Setting(
        "ELASTIC_MESH_REQUIRED",
        Kind.BOOL,
        "false",
        Source.VALUE,
        "mesh.required",
        "wait (within the gate's time) until a mesh interface is up",
    ),
    Setting(
        "ELASTIC_INJECT_ENV",
        Kind.PATH,
        "/etc/inject/env",
        Source.VALUE,
        "fixed (the inject volume)",
        "init-topology's KEY='value' file; its keys fill variables not already set",
    ),
    Setting(
        "ELASTIC_GRACE_PERIOD",
        Kind.COUNT,
        "90",
        Source.VALUE,
        "worker.terminationGracePeriodSeconds",
        "the pod's grace period; TORCH_ELASTIC_SHUTDOWN_TIMEOUT is set a margin below it",
    ),
    Setting(
        "ELASTIC_SCALE_DOWN",
        Kind.BOOL,
        "true",
        Source.VALUE,
        "rbac.scaleDown.enabled, with a service account and its token mounted",
        "after success, scale the StatefulSets of ELASTIC_STATEFULSETS_FILE to 0 through the API "
        "server",
    ),
    Setting(
        "ELASTIC_STATEFULSETS_FILE",
        Kind.PATH,
        "",
        Source.DERIVED,
        "fixed (the release's ConfigMap named ...-statefulsets, mounted)",
        "a file naming this release's worker StatefulSets, one a line, read when used: "
        "ELASTIC_SCALE_DOWN scales them to 0, and a pod of one of them records Events on it; "
        "empty: none",
    ),
    Setting(
        "ELASTIC_RENDEZVOUS_STATEFULSET",
        Kind.TEXT,
        "",
        Source.DERIVED,
        "the bundled etcd's StatefulSet (empty with an external rendezvous)",
        "scaled to 0 after the workers' StatefulSets so nothing pins its node; a pod that cannot "
        "reach etcd and finds it at 0 replicas takes the job as complete and exits 0",
    ),
    Setting(
        "ELASTIC_GROUP",
        Kind.TEXT,
        "",
        Source.DERIVED,
        "the workerGroups key of the pod's StatefulSet",
        "the worker group, the `group` label of the pod's metrics",
    ),
    Setting(
        "ELASTIC_METRICS",
        Kind.BOOL,
        "false",
        Source.VALUE,
        "monitoring.enabled",
        "serve Prometheus metrics (docs/contracts.md, Metrics) on ELASTIC_METRICS_PORT",
    ),
    Setting(
        "ELASTIC_METRICS_PORT",
        Kind.PORT,
        "9405",
        Source.VALUE,
        "monitoring.port",
        "the port of /metrics (the container port named `metrics`)",
    ),
    Setting(
        "ELASTIC_EVENTS",
        Kind.BOOL,
        "false",
        Source.VALUE,
        "events.enabled, with a service account and its token mounted",
        "record Kubernetes Events on this pod and its StatefulSet (docs/contracts.md, Events)",
    ),
    Setting(
        "ELASTIC_RECLAIM",
        Kind.BOOL,
        "false",
        Source.VALUE,
        "nodeLoss.reclaim.enabled, with a service account and its token mounted",
        "force-delete the pod of a peer this pod took out of the round once its node is "
        "NotReady for ELASTIC_RECLAIM_AFTER s, so that its StatefulSet places it on a "
        "healthy node (recovery/reclaim.py)",
    ),
    Setting(
        "ELASTIC_RECLAIM_AFTER",
        Kind.SECONDS,
        "30",
        Source.VALUE,
        "nodeLoss.reclaim.afterSeconds",
        "seconds a lost peer's pod must be seen on a NotReady node before it is deleted",
    ),
    Setting(
        "ELASTIC_HANG_DETECTION",
        Kind.BOOL,
        "true",
        Source.VALUE,
        "hangDetection.enabled",
        "when no rank of the round steps for the bound below, find the rank that holds it "
        "(its stack, taken without stopping it) and stop its training processes, so that "
        "torchrun re-forms (recovery/hangs.py; beside ELASTIC_LOSS_DETECTION only)",
    ),
    Setting(
        "ELASTIC_HANG_STEP_MULTIPLE",
        Kind.COUNT,
        "20",
        Source.VALUE,
        "hangDetection.stepTimeMultiple",
        "the bound is this many times the recent step time (and at least ELASTIC_HANG_FLOOR)",
    ),
    Setting(
        "ELASTIC_HANG_FLOOR",
        Kind.SECONDS,
        "30",
        Source.VALUE,
        "hangDetection.floorSeconds",
        "the shortest bound, whatever the step time",
    ),
    Setting(
        "ELASTIC_HANG_FIRST_STEP",
        Kind.SECONDS,
        "1200",
        Source.VALUE,
        "hangDetection.firstStepSeconds",
        "the bound until each attempt's second step (compilation, the first data, a restore)",
    ),
    Setting(
        "ELASTIC_TOPOLOGY_MISMATCH",
        Kind.MISMATCH,
        "refuse",
        Source.VALUE,
        "topology.mismatch",
        "a node whose GPU model, GPU count or fabric differs from the job's: refuse (wait "
        "at the gate), warn (one line, then join) or off (gate/topology.py)",
    ),
    Setting(
        "ELASTIC_LOCAL_ADDR",
        Kind.TEXT,
        "",
        Source.IMAGE,
        "-",
        "the address other nodes reach this one at; empty: the mesh address, else "
        "POD_IP, else the chosen interface's",
    ),
    Setting(
        "ELASTIC_SERVICEACCOUNT_DIR",
        Kind.PATH,
        SERVICEACCOUNT_DIR,
        Source.IMAGE,
        "-",
        "where the service-account token and CA are (moved for local runs and tests)",
    ),
    Setting(
        "ELASTIC_DEBUG",
        Kind.BOOL,
        "false",
        Source.IMAGE,
        "-",
        "log debug lines",
    ),
    Setting(
        "POD_NAME",
        Kind.TEXT,
        "",
        Source.KUBELET,
        "metadata.name",
        "this pod's name (member key); empty: the host name",
    ),
    Setting(
        "POD_NAMESPACE",
        Kind.TEXT,
        "",
        Source.KUBELET,
        "metadata.namespace",
        "the namespace of the StatefulSets this pod scales and records Events on",
    ),
    Setting(
        "POD_UID",
        Kind.TEXT,
        "",
        Source.KUBELET,
        "metadata.uid",
        "this incarnation of the pod: in its member value (a pod made again is told from the "
        "one it replaced) and the involvedObject.uid of its Events",
    ),
    Setting(
        "NODE_NAME",
        Kind.TEXT,
        "",
        Source.KUBELET,
        "spec.nodeName",
        "the source.host of this pod's Events",
    ),
    Setting(
        "POD_IP",
        Kind.TEXT,
        "",
        Source.KUBELET,
        "status.podIP",
        "registered as this pod's member value; the local address when no mesh is up",
    ),
    Setting(
        "NODE_INSTANCE_TYPE",
        Kind.TEXT,
        "",
        Source.USER,
        "init-topology (/etc/inject/env)",
        "the instance_type label of elastic_job_node_info",
    ),
    Setting(
        "NODE_CAPACITY_TYPE",
        Kind.TEXT,
        "",
        Source.USER,
        "init-topology (/etc/inject/env)",
        "the capacity_type label of elastic_job_node_info (spot, on-demand, ...)",
    ),
    Setting(
        "NODE_GPU_MODEL",
        Kind.TEXT,
        "",
        Source.USER,
        "init-topology (/etc/inject/env)",
        "the gpu_model label of elastic_job_node_info; compared with the job's "
        "(ELASTIC_TOPOLOGY_MISMATCH)",
    ),
    Setting(
        "NODE_GPU_COUNT",
        Kind.TEXT,
        "",
        Source.USER,
        "init-topology (/etc/inject/env)",
        "the node's GPUs; compared with the job's (ELASTIC_TOPOLOGY_MISMATCH)",
    ),
    Setting(
        "NODE_FABRIC",
        Kind.TEXT,
        "",
        Source.USER,
        "init-topology (/etc/inject/env)",
        "the node's fabric (infiniband, roce, efa, ...); compared with the job's "
        "(ELASTIC_TOPOLOGY_MISMATCH)",
    ),
    Setting(
        "NODE_ZONE",
        Kind.TEXT,
        "",
        Source.USER,
        "init-topology (/etc/inject/env)",
        "the zone label of elastic_job_node_info",
    ),
    Setting(
        "NCCL_SOCKET_IFNAME",
        Kind.TEXT,
        "",
        Source.USER,
        "worker.env",
        "when set (with GLOO_SOCKET_IFNAME), the worker's interface choice is only logged",
    ),
    Setting(
        "GLOO_SOCKET_IFNAME",
        Kind.TEXT,
        "",
        Source.USER,
        "worker.env",
        "as NCCL_SOCKET_IFNAME, for gloo",
    ),
    Setting(
        "KUBERNETES_SERVICE_HOST",
        Kind.TEXT,
        "",
        Source.KUBELET,
        "the `kubernetes` Service",
        "the API server, for ELASTIC_SCALE_DOWN",
    ),
    Setting(
        "KUBERNETES_SERVICE_PORT",
        Kind.TEXT,
        "443",
        Source.KUBELET,
        "the `kubernetes` Service",
        "the API server's port",
    ),
)

BY_NAME = {setting.name: setting for setting in SETTINGS}
