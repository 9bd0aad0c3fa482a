"""scripts/bench-hangs: what a hung rank costs a job, with hang detection on and with
torch's defaults (off: the job waits gloo's process-group timeout, 30 min, or forever).

measure.py   one run: three elastic-worker agents on this machine train a user's script
             (tests/e2e/user_script/stalls.py) until one rank hangs; the seconds from the
             hang until the job trains again, or the cap
cli.py       the command line: which hangs, how many repeats, the cap; the table; --json
"""
