"""Each `podman build` / `docker build` the images' READMEs and Dockerfiles show builds as
scripts/build-images does: its image's Dockerfile with -f, from that image's context."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import re
import shlex
import sys
from pathlib import Path
from types import ModuleType

import pytest
from testlib import ROOT


def build_images() -> ModuleType:
    loader = importlib.machinery.SourceFileLoader(
        "build_images", str(ROOT / "scripts/build-images")
    )
    spec = importlib.util.spec_from_loader("build_images", loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["build_images"] = module  # its dataclasses look their module up
    loader.exec_module(module)
    return module


IMAGES = {image.name: image for image in build_images().IMAGES}
DOCS = sorted(
    p
    for name in IMAGES
    for p in (ROOT / "images" / name).glob("*")
    if p.name in ("README.md", "Dockerfile")
)
COMMAND = re.compile(r"\b(?:podman|docker) build\b[^\n`]*")


def commands(doc: Path) -> list[list[str]]:
    return [shlex.split(m[0], comments=True) for m in COMMAND.finditer(doc.read_text())]


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_each_build_command_builds_its_image_as_build_images_does(doc: Path) -> None:
    image = IMAGES[doc.parent.name]
    found = commands(doc)
    for argv in found:
        assert "-f" in argv, f"{doc.name}: {shlex.join(argv)} names no Dockerfile"
        dockerfile = ROOT / argv[argv.index("-f") + 1]
        context = ROOT / argv[-1]
        assert (dockerfile, context) == (image.dockerfile, image.context), shlex.join(argv)


def test_the_docs_show_a_build_command_for_each_image() -> None:
    shown = {doc.parent.name for doc in DOCS if commands(doc)}
    assert shown == set(IMAGES)
