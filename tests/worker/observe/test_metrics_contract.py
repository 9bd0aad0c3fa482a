"""The metrics' contract: the labels docs/contracts.md names are the series', and
prometheus-client is pinned alike in the venv, the package and the image."""

from __future__ import annotations

import re
from importlib.metadata import version

from elastic_worker.observe.metrics import LABELS

from worker.worker_helpers import ROOT


def test_prometheus_client_is_pinned_alike_in_the_venv_the_package_and_the_image() -> None:
    pin = re.search(
        r"^prometheus-client==(\S+)$", (ROOT / "requirements/dev.txt").read_text(), re.M
    )
    assert pin, "requirements/dev.txt must pin prometheus-client"
    assert version("prometheus-client") == pin[1]
    assert f'"prometheus-client=={pin[1]}"' in (ROOT / "images/worker/pyproject.toml").read_text()
    dockerfile = (ROOT / "images/worker/Dockerfile").read_text()
    assert f"ARG PROMETHEUS_CLIENT_VERSION={pin[1]}\n" in dockerfile
    assert '"prometheus-client==${PROMETHEUS_CLIENT_VERSION}"' in dockerfile


def test_the_contract_names_exactly_the_labels_the_series_carry() -> None:
    """docs/contracts.md "Metrics": "Every series has exactly the labels ..." lists LABELS."""
    text = (ROOT / "docs" / "contracts.md").read_text()
    sentence = text.split("Every series has exactly the labels", 1)[1].split("names of our own")[0]
    assert re.findall(r"`([a-z_]+)`", sentence) == list(LABELS), sentence
