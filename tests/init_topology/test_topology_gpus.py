"""The GPU rule: the model from the first label that names it (feature discovery first),
the count from what pods can be given, else discovery labels."""

from __future__ import annotations

from init_topology.mapping import gpus


def test_gpu_count_prefers_allocatable_then_discovery_labels() -> None:
    labels = {"nvidia.com/gpu.product": "NVIDIA-L4", "nvidia.com/gpu.count": "4"}
    assert gpus(labels, {"nvidia.com/gpu": "2"}) == ("NVIDIA-L4", "2")
    assert gpus(labels, {}) == ("NVIDIA-L4", "4")
    assert gpus({}, {"nvidia.com/gpu": "0"}) == ("", "0")
    assert gpus({"karpenter.k8s.aws/instance-gpu-count": "1"}, {}) == ("", "1")


def test_gpu_model_from_coreweaves_gpu_class_label() -> None:
    """CoreWeave's gpu.nvidia.com/class names the model when feature discovery does not."""
    assert gpus({"gpu.nvidia.com/class": "H100_NVLINK_80GB"}, {"nvidia.com/gpu": "8"}) == (
        "H100_NVLINK_80GB",
        "8",
    )
    both = {"gpu.nvidia.com/class": "H100_NVLINK_80GB", "nvidia.com/gpu.product": "NVIDIA-H100"}
    assert gpus(both, {})[0] == "NVIDIA-H100"


def test_gpu_model_prefers_feature_discovery_over_provider_labels() -> None:
    labels = {
        "cloud.google.com/gke-accelerator": "nvidia-l4",
        "nvidia.com/gpu.product": "NVIDIA-L4",
    }
    assert gpus(labels, {})[0] == "NVIDIA-L4"
