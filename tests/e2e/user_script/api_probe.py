"""The etcd-v3 scenarios' job command: from inside a worker pod, ask the job's etcd (the
one the local run started from the chart's rendered command) which APIs it serves, print
one line, then run the reference train.py with the remaining arguments in this process.

    [probe] etcd <endpoint>: v2 API HTTP 404, v3 API version 3.4.23

Only local rank 0 asks (once per attempt), so the line appears once per pod and round.
"""

from __future__ import annotations

import json
import os
import runpy
import sys
import urllib.error
import urllib.request

TRAIN = "/opt/elastic-worker/examples/train.py"


def status(url: str, data: bytes | None = None) -> str:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, data), timeout=5) as resp:
            body = json.load(resp)
    except urllib.error.HTTPError as exc:
        return f"HTTP {exc.code}"
    except (OSError, ValueError) as exc:
        return f"error {exc}"
    return f"version {body['version']}" if "version" in body else "HTTP 200"


def main() -> None:
    if os.environ.get("LOCAL_RANK") == "0":
        base = f"http://{os.environ['ELASTIC_RDZV_ENDPOINT']}"
        v2 = status(f"{base}/v2/keys/")
        v3 = status(f"{base}/v3/maintenance/status", b"{}")
        print(f"[probe] etcd {base}: v2 API {v2}, v3 API {v3}", flush=True)
    sys.argv = [TRAIN, *sys.argv[1:]]
    runpy.run_path(TRAIN, run_name="__main__")


if __name__ == "__main__":
    main()
