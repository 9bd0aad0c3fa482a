"""Run one module of the injected worker with the libraries its role sees:

    python /opt/elastic-worker/bin/boot.py ROLE MODULE ARGS...

This file's directory is sys.path[0] when it starts (Python puts a script's directory
there); it is replaced at once by the bundle's lib/, and elastic_worker/bundle.py does the
rest (the roles, who sees what). Nothing here is set through the environment, so the
processes these start (the user's training processes) inherit none of it."""

import os
import sys

sys.path[0] = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "lib")

from elastic_worker import bundle  # noqa: E402 - importable only from here on

bundle.boot(sys.argv[1:])
