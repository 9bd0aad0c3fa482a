"""What an image is here (cluster/images.py, chart.images) and `--image NAME=VENV`: a
container of a mapped image runs from that environment, with nothing of the project's; the
project's images keep the checkout's venv and their files; a volume over an image's path
hides the image's files there."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from localrun import chart
from localrun.cli import UsageError, build_parser, config_from_args, normalize_argv
from localrun.cluster.images import HostImage, Images, repository
from localrun.cluster.runtime import BindMount
from localrun.host.runtime import loopback_rewrite

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("ref", "repo"),
    [
        ("nvcr.io/nvidia/pytorch:25.10-py3", "nvcr.io/nvidia/pytorch"),
        ("registry:5000/team/trainer", "registry:5000/team/trainer"),
        ("registry:5000/team/trainer:1.0@sha256:" + "a" * 64, "registry:5000/team/trainer"),
    ],
)
def test_repository_drops_tag_and_digest_but_not_a_registry_port(ref: str, repo: str) -> None:
    assert repository(ref) == repo


def test_an_image_is_found_by_its_reference_then_its_repository_else_the_default() -> None:
    ours, theirs, pinned = HostImage({"PATH": "/ours"}), HostImage({"PATH": "/t"}), HostImage({})
    images = Images(ours, {"team/trainer": theirs, "team/trainer:2.0": pinned})
    assert images.resolve("team/trainer:1.0") is theirs
    assert images.resolve("team/trainer:2.0") is pinned
    assert images.resolve("ghcr.io/elastic-job/worker:0.1.0") is ours


def _statefulset(*init: tuple[str, str]) -> dict[str, object]:
    containers = [{"name": n, "image": i} for n, i in init]
    return {"spec": {"template": {"spec": {"initContainers": containers, "containers": []}}}}


def test_a_mapped_image_runs_from_its_venv_and_holds_nothing_of_the_projects(
    tmp_path: Path,
) -> None:
    images = chart.images(ROOT, [_statefulset()], ["/venv/bin", "/usr/bin"],
                          {"team/trainer": tmp_path}, "/usr/bin:/bin")  # fmt: skip
    theirs = images.resolve("team/trainer:1.0")
    assert theirs.env == {"PATH": f"{tmp_path}/bin:/usr/bin:/bin"} and theirs.mounts == ()
    ours = images.resolve("ghcr.io/elastic-job/worker:0.1.0")
    assert ours.env == {"PATH": "/venv/bin:/usr/bin"}
    assert [m.target for m in ours.mounts] == [chart.IMAGE_EXAMPLES]


def test_the_image_that_injects_holds_the_bundle_built_from_the_checkout() -> None:
    init = "ghcr.io/elastic-job/init-topology:0.1.0"
    sts = _statefulset(("init-topology", init), (chart.INJECT_CONTAINER, init))
    image = chart.images(ROOT, [sts], ["/venv/bin"], {}, "/bin").resolve(init)
    (bundle,) = image.mounts
    assert bundle.target == chart.BUNDLE_IMAGE_PATH and bundle.read_only
    assert (Path(bundle.source) / "bin" / "inject").is_file()
    assert (Path(bundle.source) / "bundle.json").is_file()


def _config(*argv: str):  # type: ignore[no-untyped-def]
    args = build_parser().parse_args(normalize_argv(["run", "-f", __file__, *argv]))
    return config_from_args(args)


def test_image_option_maps_a_name_to_a_venv(tmp_path: Path) -> None:
    cfg = _config(f"--image=team/trainer={Path(sys.prefix)}")
    assert cfg.images == {"team/trainer": Path(sys.prefix).resolve()}


@pytest.mark.parametrize("value", ["team/trainer", "=/venv", "team/trainer=/nonexistent"])
def test_a_bad_image_option_is_one_usage_line(value: str) -> None:
    with pytest.raises(UsageError, match=r"^--image .*(NAME=VENV|bin/python does not exist)"):
        _config(f"--image={value}")


def test_loopback_rewrites_the_longest_mount_path_first() -> None:
    """/opt/elastic-worker-bundle is not /opt/elastic-worker followed by '-bundle'."""
    mounts = [
        BindMount("/h/pod", "/opt/elastic-worker"),
        BindMount("/h/b", "/opt/elastic-worker-bundle"),
    ]
    _, argv = loopback_rewrite(
        {}, ["/opt/elastic-worker-bundle/bin/inject", "/opt/elastic-worker"], mounts, {}
    )
    assert argv == ["/h/b/bin/inject", "/h/pod"]


def test_a_volume_at_or_above_an_images_path_hides_the_images_files_there() -> None:
    """As in a container: the worker image's examples under an emptyDir at /opt/elastic-worker
    are gone (the injected bundle brings its own)."""
    from localrun.cluster.volumes import _under  # noqa: PLC0415

    assert _under("/opt/elastic-worker/examples", {"/opt/elastic-worker"})
    assert _under("/opt/elastic-worker/examples", {"/opt/elastic-worker/examples"})
    assert not _under("/opt/elastic-worker-bundle", {"/opt/elastic-worker"})
    assert not _under("/opt/elastic-worker", {"/opt/elastic-worker/examples"})
