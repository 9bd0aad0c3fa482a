"""tests/docs checks the README's RBAC against renders with tests/charts' helpers
(chart_render); put that folder on the import path."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "charts"))
