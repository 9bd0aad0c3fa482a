"""Images, as this machine stands in for them. No image is unpacked here: the image a
container names is a host environment, its variables (PATH: where its `python` and its
entrypoints are) and host paths bind-mounted where the image holds files. Which image is
which is the run's to say (chart.py: the project's images and the ones `--image` maps);
the kubelet only looks them up."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from localrun.cluster.runtime import BindMount


@dataclass(frozen=True)
class HostImage:
    env: Mapping[str, str]  # the image's own variables (PATH), under the container's env
    mounts: tuple[BindMount, ...] = ()  # files the image holds at fixed paths (read-only)


def repository(ref: str) -> str:
    """`registry/name:tag@sha256:...` -> `registry/name` (a registry's port kept)."""
    ref = ref.split("@", 1)[0]
    slash = ref.rfind("/")
    colon = ref.rfind(":")
    return ref[:colon] if colon > slash else ref


@dataclass(frozen=True)
class Images:
    default: HostImage  # any image not named below
    named: Mapping[str, HostImage] = field(default_factory=dict)  # reference or repository

    def resolve(self, ref: str) -> HostImage:
        """The image a container names: by its whole reference, else its repository."""
        return self.named.get(ref) or self.named.get(repository(ref)) or self.default
