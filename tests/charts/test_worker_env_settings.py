"""The chart and the worker image agree on the worker's settings, whose one definition is
images/worker/src/elastic_worker/settings/definitions.py: the chart sets exactly the variables
defined as the chart's, `_validate.tpl` owns them, and the image's defaults are the chart's."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any

from chart_render import ELASTIC_JOB, container, env_of, objects, worker_statefulsets
from elastic_worker.settings import config
from elastic_worker.settings.definitions import BY_NAME, SETTINGS
from elastic_worker.settings.schema import Source

CHART_SET = {s.name for s in SETTINGS if s.source in {Source.VALUE, Source.DERIVED}}


def worker_env(helm: Path, **kwargs: Any) -> dict[str, Any]:
    sts = worker_statefulsets(objects(ELASTIC_JOB, helm=helm, **kwargs))
    return env_of(container(sts[0], "worker"))


def owned_names() -> list[str]:
    text = (ELASTIC_JOB / "templates" / "_validate.tpl").read_text()
    match = re.search(r"\$owned := list ((?:\"[A-Z0-9_]+\" ?)+)", text)
    assert match, "_validate.tpl has no $owned list"
    return re.findall(r'"([A-Z0-9_]+)"', match[1])


def test_every_elastic_variable_the_chart_sets_is_defined(helm: Path) -> None:
    set_by_chart = {name for name in worker_env(helm) if name.startswith("ELASTIC_")}
    assert set_by_chart == CHART_SET


def test_validate_owns_exactly_the_defined_chart_variables() -> None:
    """A user's worker.env may not repeat a variable the chart sets (docs/contracts.md)."""
    owned = owned_names()
    assert len(owned) == len(set(owned))
    assert {n for n in owned if n.startswith("ELASTIC_")} == CHART_SET
    # The others are the downward API's and the checkpoint mount's.
    for name in owned:
        assert name in BY_NAME or name in {"CHECKPOINT_DIR", "NODE_NAME"}, name


def test_the_images_defaults_are_what_the_chart_renders_by_default(helm: Path) -> None:
    """Each variable the chart sets from values.yaml parses, in the image, to the same
    Config as leaving it unset (or the image requires it)."""
    rendered = {k: v for k, v in worker_env(helm).items() if isinstance(v, str)}
    required = {k: rendered[k] for k in CHART_SET if BY_NAME[k].default is None}
    # Derived values depend on the release (names); they are not defaults to compare.
    derived = {k: rendered[k] for k in CHART_SET if BY_NAME[k].source is Source.DERIVED}
    base = {**required, **derived, "POD_NAME": "run42-worker-0"}
    with_chart = config.load(["train.py"], {**rendered, **base})
    image_only = config.load(["train.py"], dict(base))
    drift = {
        name: (getattr(image_only, name), getattr(with_chart, name))
        for name in (f.name for f in dataclasses.fields(config.Config))
        if getattr(image_only, name) != getattr(with_chart, name)
    }
    assert drift == {}, "image default -> chart default"
    compared = {s.name for s in SETTINGS if s.source is Source.VALUE and s.default is not None}
    assert compared <= rendered.keys()
