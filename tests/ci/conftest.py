"""tests/ci reuses tests/charts' helpers (chart_render: the strict Kubernetes validators
that stand in for kubeconform's default schemas); put that folder on the import path."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "charts"))
