"""The generic mini-cluster: API server, node fixtures, StatefulSet controller, scheduler,
kubelet, pod spec and volumes, DNS. It knows Kubernetes and nothing of any chart; the
container runtime is injected (runtime.py)."""
