"""torchrun, launched and supervised.

argv.py           torchrun's command line and environment (pure functions)
supervisor.py     torchrun started, signalled, watched for completion, its exit code,
                  its wait in torch's exit barrier told; what the node-loss policy must
                  know of it told through its Hooks
torchrun.py       what runs torch's torchrun: the job's exit barrier timeout, and the
                  success of its workers reported

The attempt shim torchrun runs before the program, and its line, are ../attempt_line.py.
"""
