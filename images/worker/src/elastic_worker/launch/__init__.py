"""torchrun, launched and supervised.

argv.py           torchrun's command line and environment (pure functions)
attempt_line.py   the attempt shim torchrun runs before the program, the line it
                  writes, and that line read back (with the log it goes to)
supervisor.py     torchrun started, signalled, watched for completion, its exit code,
                  its wait in torch's exit barrier told
torchrun.py       what runs torch's torchrun: the job's exit barrier timeout, and the
                  success of its workers reported
"""
