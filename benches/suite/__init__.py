"""scripts/bench: every figure beside torch's defaults, in one run.

figures.py   what each figure runs (bench-recovery's runs, the rendezvous, churn)
table.py     the table printed at the end
plots.py     bench.png, and the benchmarks page's plots (recovery by phase, goodput
             over time) from a bench.json
cli.py       the command line: which figures, how many repeats; bench.json
"""
