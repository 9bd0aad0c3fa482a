"""The chart README's walkthrough, as a user pastes it: its `helm install` renders, and
every object it names (StatefulSets, pods, the test pod) is one that install makes, in the
namespace it uses."""

from __future__ import annotations

import re
import shlex
import subprocess
from pathlib import Path

from chart_render import ELASTIC_JOB, HELM3, ROOT

README = ELASTIC_JOB / "README.md"


def walkthrough() -> str:
    text = README.read_text()
    start = text.index("## Walkthrough")
    return text[start : text.index("\n## ", start + 1)]


def commands(section: str) -> list[list[str]]:
    """The shell commands of the section's code blocks, continuation lines joined."""
    blocks = re.findall(r"```sh\n(.*?)```", section, re.S)
    joined = "\n".join(blocks).replace("\\\n", " ")
    return [shlex.split(line) for line in joined.splitlines() if line.strip()]


def test_the_walkthroughs_install_renders_every_object_the_walkthrough_names(
    tmp_path: Path,
) -> None:
    section = walkthrough()
    cmds = commands(section)
    copied = next(c for c in cmds if c[0] == "cp")  # the values file the user starts from
    install = next(c for c in cmds if c[:2] == ["helm", "install"])
    release, chart = install[2], install[3]
    args = [a if a != copied[2] else str(ROOT / copied[1]) for a in install[4:]]
    args = [a for a in args if a != "--create-namespace"]
    namespace = args[args.index("-n") + 1]
    rendered = subprocess.run(
        [str(HELM3), "template", release, str(ROOT / chart), *args],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert rendered.returncode == 0, rendered.stderr
    kinds = re.findall(r"^kind: (\w+)\nmetadata:\n  name: (\S+)", rendered.stdout, re.M)
    statefulsets = {name: 0 for kind, name in kinds if kind == "StatefulSet"}
    for name in statefulsets:
        doc = rendered.stdout.split(f"  name: {name}\n", 1)[1]
        statefulsets[name] = int(re.search(r"^  replicas: (\d+)", doc, re.M)[1])  # type: ignore[index]
    pods = {name for kind, name in kinds if kind == "Pod"}
    named = set(re.findall(rf"`?({release}-elastic-job-[a-z0-9-]+)`?", section))
    assert named, "the walkthrough names no object"
    for name in named:
        if name in statefulsets or name in pods:
            continue
        sts, _, ordinal = name.rpartition("-")
        assert sts in statefulsets, f"{name}: no such StatefulSet or pod in the install"
        assert int(ordinal) < statefulsets[sts], f"{name}: {sts} has {statefulsets[sts]} pods"
    for cmd in cmds:  # every kubectl and helm command works in the install's namespace
        if cmd[0] in ("kubectl", "helm") and cmd[1] != "template":
            assert cmd[cmd.index("-n") + 1] == namespace, cmd
            if cmd[0] == "helm":
                assert release in cmd, cmd
    assert f"app.kubernetes.io/instance={release}" in section
