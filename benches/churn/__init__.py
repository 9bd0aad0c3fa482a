"""scripts/bench-churn: a silent loss and goodput under churn, through the local run of
the chart (scripts/bench's figures `silent` and `goodput`).

    localrun.py   one `elastic-local run` of the chart: its events and pods' lines, stamped
    profiles.py   what is compared: torch's defaults through the chart, a fixed-size job,
                  the scripts of the silent figure
    silent.py     a pod's link down for good: seconds until the survivors train at 2
    goodput.py    a pod lost every T s: kept samples per wall second, and over time
    report.py     the table's rows and the plot's panels
    cli.py        the command line, and the figures as scripts/bench runs them
"""
