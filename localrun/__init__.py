"""elastic-local: the elastic-job chart's rendered pods, run on one machine.

    elastic-local run --chart charts/elastic-job -f values-examples/cpu-smoke.yaml \\
        [--set k=v] [--kill POD@WHEN[:DOWN]] [--preempt POD@WHEN[:DOWN]] \\
        [--partition POD@WHEN[:DURATION]] [--scale GROUP=N@WHEN] [--restart-rendezvous@WHEN] \\
        [--api-fault REGEX=STATUS] [--json PATH]

WHEN is seconds after the start, or `step=N` (when training reaches step N).

Layers (localrun/README.md has the map, module by module):
    cluster/    a generic mini-cluster: API server, nodes, StatefulSet controller,
                scheduler, kubelet on an injected container runtime; knows no chart
    host/       this machine's runtime: namespaces, DNS files, processes, mountpoints
    chart.py    everything the local run knows about the elastic-job chart
    lines.py    the lines its pods print, and their one parser (parse_line)
    state.py    the run state (one parser feeds it; view.py and the summary read it)
    records.py  the state's records: a re-form, a pod, an exit-barrier wait, a round
    cli.py      the command line and the fault grammar; faults.py what faults do
    run.py      one run (runsetup.py, runend.py, runbase.py); render.py helm template
"""
