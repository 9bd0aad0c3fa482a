"""elastic-local: the elastic-job chart's rendered pods, run on one machine.

    elastic-local run --chart charts/elastic-job -f values-examples/cpu-smoke.yaml \
        [--set k=v] [--kill POD@WHEN[:DOWN]] [--preempt POD@WHEN[:DOWN]] \
        [--partition POD@WHEN[:DURATION]] [--scale GROUP=N@WHEN] [--restart-rendezvous@WHEN] \
        [--api-fault REGEX=STATUS] [--json PATH]

WHEN is seconds after the start, or `step=N` (when training reaches step N).

Modules, one concern each:
    render      helm template -> objects (the chart copied first; dependency build there)
    podspec     containers, volumes, env resolved as the kubelet does (downward API, $(VAR))
    scheduler   node assignment from a cluster profile (selectors, affinity, taints, requests)
    network     one netns per pod, eth0 by veth to a bridge, 198.18.0.0/15, hosts files
    process     container = ip netns exec + unshare (mount, pid, uts) + bind mounts
    controller  StatefulSet controller and kubelet: pods, init containers, back-off, deletion
    faults      fault arguments
    progress    [train] line parsing, live table or plain lines
    summary     the --json summary (re-forms with cause and seconds)
    runner      one run: setup, loop, end condition, cleanup
    apiserver   fake kube-apiserver over HTTPS with Node fixtures (nodes/)
"""
