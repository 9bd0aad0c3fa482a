"""charts/etcd-rendezvous templates/poddisruptionbudget.yaml."""

from __future__ import annotations

from chart_render import ETCD, RELEASE, objects, of_kind, one, selects

NAME = f"{RELEASE}-etcd-rendezvous"


def test_budget_keeps_the_member_available() -> None:
    """podDisruptionBudget: minAvailable 1, selecting the etcd pod."""
    objs = objects(ETCD)
    pdb = one(objs, "PodDisruptionBudget", NAME)
    assert pdb["spec"]["minAvailable"] == 1
    labels = one(objs, "StatefulSet", NAME)["spec"]["template"]["metadata"]["labels"]
    assert selects(pdb["spec"]["selector"]["matchLabels"], labels)


def test_disabled_renders_no_budget() -> None:
    """podDisruptionBudget.enabled=false: none."""
    assert not of_kind(
        objects(ETCD, sets=["podDisruptionBudget.enabled=false"]), "PodDisruptionBudget"
    )
