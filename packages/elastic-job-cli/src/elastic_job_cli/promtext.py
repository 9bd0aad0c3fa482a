"""The workers' /metrics text (Prometheus exposition, read through the API server's pod
proxy) -> one value per series name; the state set as `elastic_job_pod_state{state=S}`.

The one place the command reads metric labels: the state set's, and `le` to skip histogram
buckets. The labels that name the job, the group and the pod are not read (one pod serves
one series of each name), so renaming them (e.g. `job` to a label of the project's own)
changes nothing here."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

STATE = "elastic_job_pod_state"


def parse(text: str) -> dict[str, float]:
    """Series of the `elastic_job_` family; labels other than the state are dropped (one
    pod serves one value per series)."""
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if not sample.name.startswith("elastic_job_"):
                continue
            if sample.name == STATE:
                out[f"{STATE}{{state={sample.labels.get(STATE, '')}}}"] = float(sample.value)
            elif "le" not in sample.labels:
                out[sample.name] = float(sample.value)
    return out
