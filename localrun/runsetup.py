"""A local run's setup: render, issue certificates, the network, the fake API server,
the mini-cluster, Prometheus when asked for, the fault injector."""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from localrun import chart, prometheus
from localrun.cluster import certmanager, podspec
from localrun.cluster.apiserver import FakeApiServer
from localrun.cluster.cluster import Cluster
from localrun.cluster.kubelet import KubeletConfig, PodEvents
from localrun.cluster.nodes import load_nodes
from localrun.cluster.volumes import VolumeSources
from localrun.faults import Injector
from localrun.host.network import LoopbackNetwork, Network, NetworkError
from localrun.host.runtime import HostRuntime
from localrun.kubestate import KubeState
from localrun.render import ROOT, Rendered, RenderError, render
from localrun.runbase import EXIT_FAILED, EXIT_USAGE, SYSTEM_PATH, RunnerBase, SetupError


class Setup(RunnerBase):
    def _setup(self) -> None:
        cfg = self.cfg
        self.outdir.mkdir(parents=True, exist_ok=True)
        sets = cfg.sets
        if cfg.prometheus:
            # Ours first: a user's own --set of the same key wins.
            sets = [*prometheus.LOCAL_VALUES, *cfg.sets]
            self.event("--prometheus: rendering with " + ", ".join(prometheus.LOCAL_VALUES))
        try:
            rendered = render(
                cfg.chart, cfg.values, sets, release=cfg.release, namespace=cfg.namespace
            )
        except RenderError as exc:
            raise SetupError(str(exc), EXIT_USAGE) from None
        (self.outdir / "rendered.json").write_text(json.dumps(rendered.objects, indent=1))
        if not rendered.statefulsets:
            raise SetupError("the chart rendered no StatefulSet", EXIT_USAGE)
        self._issue_certificates(rendered)
        self.network = self._network()
        nodes = load_nodes(cfg.profile)
        self.api = self._api_server(rendered, nodes, self.network.host_ip)
        self.cluster = self._cluster(rendered, nodes, self.network, self.api)
        if cfg.prometheus:
            self.prometheus = self._prometheus(rendered, self._render_cluster(), nodes)
        self.injector = Injector(
            cfg.faults,
            self.cluster,
            self.network,
            event=self.event,
            scale=self._scale_via_api,
            rank=self.state.pod_at_rank,
        )
        for name in self.injector.unknown_pods():
            self.event(f"warning: no StatefulSet makes a pod named {name!r}")
        for name in self.injector.unknown_nodes():
            self.event(f"warning: profile {cfg.profile!r} has no node named {name!r}")

    def _issue_certificates(self, rendered: Rendered) -> None:
        """The cluster's CA (made per run) issues every Certificate's Secret, as
        cert-manager would, and the TLS Secrets a user would bring; the run keeps a client
        certificate of its own for etcd."""
        present = set(rendered.secrets) | {
            c.get("spec", {}).get("secretName", "") for c in rendered.certificates
        }
        certificates = rendered.certificates + chart.brought_certificates(
            rendered.statefulsets, present
        )
        if not certificates:
            return
        try:
            ca = certmanager.CertificateAuthority(self.workdir / "pki")
            issued = certmanager.issue_all(ca, certificates)
            own = ca.sign("elastic-local", "elastic-local", [], ["client auth"])
        except certmanager.CertificateError as exc:
            raise SetupError(str(exc), EXIT_FAILED) from None
        for name, secret in issued.items():
            rendered.secrets.setdefault(name, secret)
            self.event(f"certificate issued: Secret {name}")
        self.client_tls = chart.ClientTls(ca.crt, own.crt, own.key)

    def _render_cluster(self) -> list[dict[str, Any]]:
        """charts/elastic-job-cluster as an admin installs it once: the PodMonitor and the
        alerts for every job."""
        sets = self.cfg.cluster_sets
        self.event(
            f"--prometheus: {prometheus.CLUSTER_RELEASE} in {prometheus.CLUSTER_NAMESPACE} with "
            + ", ".join([*prometheus.LOCAL_CLUSTER_VALUES, *sets])
        )
        try:
            objects = prometheus.render_cluster(sets)
        except RenderError as exc:
            raise SetupError(f"charts/elastic-job-cluster: {exc}", EXIT_USAGE) from None
        (self.outdir / "rendered-cluster.json").write_text(json.dumps(objects, indent=1))
        return objects

    def _prometheus(
        self, rendered: Rendered, cluster: list[dict[str, Any]], nodes: dict[str, Any]
    ) -> prometheus.Prometheus:
        """Debian's prometheus on 127.0.0.1, scraping the pods over the run's bridge (the
        cluster chart's PodMonitor, and the release's own if it has one) with the cluster
        chart's alerts, and a kube-state-metrics stand-in for the pods and Nodes the API
        server serves."""
        if isinstance(self.network, LoopbackNetwork):
            raise SetupError(
                "--prometheus needs network namespaces (run as root, without --loopback): "
                "without them every pod would serve its metrics on this machine's one port",
                EXIT_USAGE,
            )
        self.kubestate = KubeState(nodes)
        try:
            prometheus.check_metrics_served(rendered.statefulsets)
            prom = prometheus.Prometheus(
                self.outdir / "prometheus",
                prometheus.scrape_endpoints([*cluster, *rendered.objects]),
                prometheus.rule_groups([*cluster, *rendered.objects]),
                static={"kube-state-metrics": self.kubestate.start()},
            )
            self.prometheus = prom  # stopped at the end even if it fails to get ready
            prom.start()
        except prometheus.PrometheusError as exc:
            raise SetupError(str(exc), EXIT_FAILED) from None
        rules = sum(len(g.get("rules") or []) for g in prom.groups)
        self.state.prometheus_url = prom.url
        self.event(f"prometheus {prom.url} ({rules} alert rules; data in {prom.directory})")
        return prom

    def _network(self) -> Network:
        isolated = (
            not self.cfg.loopback
            and os.geteuid() == 0
            and shutil.which("unshare")
            and shutil.which("ip")
        )
        prefix = f"e{os.getpid()}"
        domain = self.cfg.cluster_domain
        network = Network(prefix, domain) if isolated else LoopbackNetwork(prefix, domain)
        self.network = network  # torn down at the end even if setup fails half-way
        try:
            network.setup()
        except NetworkError as exc:
            raise SetupError(f"network setup failed: {exc}", EXIT_FAILED) from None
        self.event(network.describe())
        return network

    def _api_server(self, rendered: Rendered, nodes: dict[str, Any], host: str) -> FakeApiServer:
        cfg = self.cfg
        api = FakeApiServer(
            nodes,
            host=host,
            port=0,
            workdir=self.workdir / "api",
            namespace=cfg.namespace,
            serviceaccount=chart.service_account(rendered.statefulsets),
        )
        self.api = api
        api.start()
        for path, status in cfg.api_faults:
            api.set_fault(path, status)
        for sts in rendered.statefulsets:
            meta = sts["metadata"]
            replicas = int(sts["spec"].get("replicas", 1))
            api.add_statefulset(meta.get("namespace", cfg.namespace), meta["name"], replicas, sts)
        api.on_scale = lambda ns, name, replicas: self.events.put(("scale", ns, name, replicas))
        api.log_source = self._log_source
        api.on_evict = lambda ns, name: self.events.put(("evict", ns, name))
        api.on_delete = lambda ns, name, grace, uid: self.events.put(
            ("delete", ns, name, grace, uid)
        )
        self.event(f"fake API server {api.url} with {len(nodes)} nodes ({cfg.profile})")
        # For kubectl and elastic-job on this machine: KUBECONFIG=<out>/kubeconfig.
        kubeconfig = self.outdir / "kubeconfig"
        kubeconfig.write_text(json.dumps(api.kubeconfig(cfg.namespace), indent=1))
        kubeconfig.chmod(0o600)
        self.event(f"kubeconfig for this run's API server: {kubeconfig}")
        return api

    def _cluster(
        self, rendered: Rendered, nodes: dict[str, Any], network: Network, api: FakeApiServer
    ) -> Cluster:
        cfg = self.cfg
        path = [str(Path(sys.prefix) / "bin"), str(ROOT / ".venv" / "bin"), SYSTEM_PATH]
        base_env = {"HOME": "/root", "LANG": "C.UTF-8", **api.env()}
        images = chart.images(ROOT, rendered.statefulsets, path, cfg.images, SYSTEM_PATH)
        for name, venv in cfg.images.items():
            self.event(f"image {name}: runs from {venv} (--image)")
        sources = VolumeSources(
            workdir=self.workdir,
            configmaps={n: podspec.configmap_data(o) for n, o in rendered.configmaps.items()},
            secrets={n: podspec.secret_data(o) for n, o in rendered.secrets.items()},
            service_accounts=rendered.service_accounts,
            serviceaccount_dir=api.serviceaccount_dir,
            images=images,
        )
        kubelet = KubeletConfig(
            workdir=self.workdir,
            logdir=self.outdir / "logs",
            base_env=base_env,
            backoff_base=cfg.backoff_base,
            backoff_cap=cfg.backoff_cap,
        )
        events = PodEvents(
            event=self.event,
            line=lambda pod, c, line, t: self.events.put(("line", pod, c, line, t)),
            container_started=self._container_started,
            container_exited=self._container_exited,
        )
        return Cluster(
            statefulsets=rendered.statefulsets,
            services=rendered.services,
            nodes=nodes,
            runtime=HostRuntime(network, self.mountpoints),
            kubelet=kubelet,
            sources=sources,
            events=events,
            namespace=cfg.namespace,
            domain=cfg.cluster_domain,
            timings=cfg.node_timings,
            now=time.monotonic(),
        )
