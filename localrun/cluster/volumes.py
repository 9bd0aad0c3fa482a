"""The kubelet's volumes: a host directory (or a tmpfs) for each volumeMount of a
container. emptyDir: a directory per pod incarnation (medium Memory: a tmpfs of its
sizeLimit); PVC: one directory per claim, shared; volumeClaimTemplates: one per pod, kept
across recreation; configMap/secret/projected: their files; the service-account token;
and the files an image holds (`images`: cluster/images.py), since no image is unpacked here."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from localrun.cluster import podspec
from localrun.cluster.images import HostImage, Images
from localrun.cluster.pod import Pod
from localrun.cluster.podspec import SERVICEACCOUNT_PATH, Container, Volume
from localrun.cluster.runtime import BindMount

Obj = dict[str, Any]


@dataclass(frozen=True)
class VolumeSources:
    """What volumes are made from: the rendered objects and the host directories."""

    workdir: Path  # PVCs live under workdir/pvc
    configmaps: Mapping[str, Mapping[str, str]]
    secrets: Mapping[str, Mapping[str, str]]
    service_accounts: Mapping[str, Obj]
    serviceaccount_dir: Path | None  # token, ca.crt, namespace of the API server
    images: Images = field(default_factory=lambda: Images(HostImage({})))  # each image here


def mounts(pod: Pod, c: Container, src: VolumeSources) -> list[BindMount]:
    """The container's mounts, its volumeMounts first (they win over the defaults)."""
    assert pod.dir is not None
    out: list[BindMount] = []
    targets: set[str] = set()
    for m in c.mounts:
        vol = pod.sts.volumes.get(m.volume)
        if vol is None:
            raise podspec.PodSpecError(f"volumeMount {m.volume!r} names no volume")
        path, tmpfs = _source(pod, vol, src)
        if m.sub_path and not tmpfs:
            path = path / m.sub_path
            path.mkdir(parents=True, exist_ok=True)
        out.append(BindMount(str(path) if not tmpfs else "", m.path, m.read_only, tmpfs))
        targets.add(m.path.rstrip("/"))
    wants_sa = podspec.wants_serviceaccount(pod.sts.pod_spec, src.service_accounts)
    if wants_sa and src.serviceaccount_dir and SERVICEACCOUNT_PATH not in targets:
        out.append(BindMount(str(src.serviceaccount_dir), SERVICEACCOUNT_PATH, True))
    # A volume mounted at or above a path of the image hides the image's files there.
    out += [m for m in src.images.resolve(c.image).mounts if not _under(m.target, targets)]
    return out


def _under(path: str, targets: set[str]) -> bool:
    parts = path.rstrip("/").split("/")
    return any("/".join(parts[:n]) in targets for n in range(2, len(parts) + 1))


def _source(pod: Pod, vol: Volume, src: VolumeSources) -> tuple[Path, str]:
    """(host directory, "") or (Path(), tmpfs size) for one volume."""
    assert pod.dir is not None
    if vol.kind == "emptyDir":
        if vol.medium == "Memory":
            size = podspec.quantity(vol.size_limit) if vol.size_limit else 2**30
            return Path(), str(int(size))
        d = pod.dir / "volumes" / vol.name
    elif vol.kind == "pvc":
        d = src.workdir / "pvc" / vol.claim
    elif vol.kind == "claimTemplate":
        d = src.workdir / "pvc" / f"{vol.claim}-{pod.name}"
    elif vol.kind == "hostPath":
        return Path(vol.source.get("path", "/")), ""
    elif vol.kind in ("configMap", "secret", "projected"):
        d = pod.dir / "volumes" / vol.name
        d.mkdir(parents=True, exist_ok=True)
        _write_projection(vol, d, src)
        return d, ""
    else:
        raise podspec.PodSpecError(f"volume {vol.name!r}: kind not supported by the runner")
    d.mkdir(parents=True, exist_ok=True)
    return d, ""


def _write_projection(vol: Volume, d: Path, src: VolumeSources) -> None:
    sources: list[tuple[str, Obj]] = []
    if vol.kind in ("configMap", "secret"):
        sources.append((vol.kind, vol.source))
    else:
        for s in vol.source.get("sources") or []:
            sources.extend((k, v) for k, v in s.items())
    for kind, obj in sources:
        if kind == "serviceAccountToken" and src.serviceaccount_dir:
            tok = src.serviceaccount_dir / "token"
            (d / obj.get("path", "token")).write_text(tok.read_text())
            continue
        if kind not in ("configMap", "secret"):
            continue
        name = obj.get("name") or obj.get("secretName", "")
        data = (src.configmaps if kind == "configMap" else src.secrets).get(name)
        if data is None:
            if obj.get("optional"):
                continue
            raise podspec.PodSpecError(f"{kind} {name!r} is not rendered")
        items = obj.get("items")
        pairs = [(i["key"], i["path"]) for i in items] if items else [(k, k) for k in data]
        for key, path in pairs:
            target = d / path
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(data.get(key, ""))
