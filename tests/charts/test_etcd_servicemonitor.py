"""charts/etcd-rendezvous templates/servicemonitor.yaml (metrics.serviceMonitor)."""

from __future__ import annotations

from chart_render import ETCD, NAMESPACE, RELEASE, objects, of_kind, one, selects


def test_service_monitor_scrapes_the_metrics_port_of_the_client_service() -> None:
    """metrics.serviceMonitor.enabled: endpoint port `metrics` of the client Service, the
    interval and extra labels as set."""
    objs = objects(
        ETCD,
        sets=[
            "metrics.serviceMonitor.enabled=true",
            "metrics.serviceMonitor.interval=15s",
            "metrics.serviceMonitor.labels.release=prom",
        ],
    )
    monitor = one(objs, "ServiceMonitor")
    service = one(objs, "Service", f"{RELEASE}-etcd-rendezvous")
    assert selects(monitor["spec"]["selector"]["matchLabels"], service["metadata"]["labels"])
    assert "metrics" in {p["name"] for p in service["spec"]["ports"]}
    assert monitor["spec"]["endpoints"] == [
        {"port": "metrics", "path": "/metrics", "scheme": "http", "interval": "15s"}
    ]
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": [NAMESPACE]}
    assert monitor["metadata"]["labels"]["release"] == "prom"


def test_no_service_monitor_by_default() -> None:
    """Off by default: no CRD needed."""
    assert not of_kind(objects(ETCD), "ServiceMonitor")
