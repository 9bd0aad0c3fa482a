"""`elastic-job` against a real local job (issue 11): one `elastic-local run` with metrics
and Events on, its API server reached from the host through the kubeconfig the run writes.

While it trains the test evicts the pod of rank 0 (as `kubectl drain` does) and keeps it
away until the others re-form, and later SIGKILLs another pod; it checks status and list
during training, status after the eviction, `logs --rank0 -f` saying that rank 0 moved
and following the new one to the end, `events` listing the eviction, the kill and the
re-forms in time order, `logs --save` keeping the evicted pod's log, and `cost` priced on
the fixtures' node labels.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from localrun_e2e import RELEASE, ROOT, pod, root_with_namespaces, runner_argv, train_command

pytestmark = [
    pytest.mark.netns,
    pytest.mark.slow,
    pytest.mark.skipif(bool(root_with_namespaces()), reason=root_with_namespaces() or "ok"),
]

CLI = [sys.executable, "-m", "elastic_job_cli.cli"]
STEPS = 120  # 60 s of training at 0.5 s a step: room for up to three evictions
PRICES = "currency: USD\nprices:\n  c-4x-amd64-linux:\n    spot: 0.05\n    on-demand: 0.17\n"


def cli(kubeconfig: Path, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CLI, "--kubeconfig", str(kubeconfig), *args],
        capture_output=True, text=True, timeout=timeout, check=False,
    )  # fmt: skip


def background(kubeconfig: Path, *args: str, out: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [*CLI, "--kubeconfig", str(kubeconfig), *args],
        stdout=out.open("w"), stderr=out.with_suffix(".err").open("w"), text=True,
    )  # fmt: skip


def status(kubeconfig: Path) -> dict[str, Any]:
    done = cli(kubeconfig, "status", RELEASE, "-o", "json")
    assert done.returncode == 0, done.stderr
    data: dict[str, Any] = json.loads(done.stdout)
    return data


def wait_for(what: str, check: Any, timeout: float) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(1)
    raise AssertionError(f"timed out waiting for {what}")


def reformed_since(kubeconfig: Path, reforms: int) -> Any:
    """A check: the job trains again after more than `reforms` re-forms."""

    def check() -> dict[str, Any] | None:
        s = status(kubeconfig)
        more = (s["reforms"] or 0) > reforms
        return s if more and s["state"] == "training" and s["world_size"] >= 2 else None

    return check


def rank0_of(status_now: dict[str, Any]) -> str:
    return str(next(p["name"] for p in status_now["pods"] if p["group_rank"] == 0))


def evict_rank0_and_keep_it_away(kubeconfig: Path, first: dict[str, Any]) -> dict[str, Any]:
    """Evict the pod that holds rank 0 (as kubectl drain does), and each pod its
    StatefulSet makes again under that name, until the others train without it (a node
    lost with no replacement yet); then let it come back. The status while it was away,
    with "rank0" (the evicted pod) and "evicted" (how often).

    torch gives the ranks of a round to the same pods as long as they are all there, so
    only a round without the pod moves rank 0 away from it."""
    from kubernetes import client, config  # type: ignore[import-untyped]  # noqa: PLC0415
    from kubernetes.client.rest import ApiException  # type: ignore[import-untyped]  # noqa: PLC0415

    core = client.CoreV1Api(config.new_client_from_config(str(kubeconfig)))
    victim = rank0_of(first)
    body = {"metadata": {"name": victim, "namespace": "default"}}
    evictions, away, away_at, deadline = 0, None, 0.0, time.monotonic() + 180
    while time.monotonic() < deadline:
        try:
            core.create_namespaced_pod_eviction(victim, "default", body)
            evictions += 1
        except ApiException as exc:
            assert exc.status == 404, exc  # between its deletion and its next incarnation
        now = status(kubeconfig)
        others = [p for p in now["pods"] if p["name"] != victim]
        if (
            away is None
            and now["state"] == "training"
            and any(p["group_rank"] == 0 for p in others)
        ):
            away, away_at = {**now, "rank0": victim, "evicted": evictions}, time.monotonic()
        if away is not None and time.monotonic() > away_at + 3:  # the followers poll each 1 s
            break
        time.sleep(0.5)
    assert away is not None, f"the job never trained without {victim}"
    return away


def test_the_command_on_a_real_job_across_evictions_that_move_rank_0(tmp_path: Path) -> None:
    out = tmp_path / "out"
    kubeconfig = out / "kubeconfig"
    save = tmp_path / "saved"
    evicted: list[str] = []
    rank0 = ""
    runner = subprocess.Popen(
        [*runner_argv(RELEASE), "--set", train_command(STEPS, 5, 0.5),
         "--set", "monitoring.enabled=true", "--set", "events.enabled=true",
         "--output", str(out), "--json", str(tmp_path / "summary.json"), "--timeout", "400",
         "--plain", "--backoff=2:20", "--linger", "15",
         # late in training, after the evictions: a SIGKILL (exit 137) for `events`
         "--kill", f"{pod(2)}@step={STEPS - 25}:3"],
        cwd=ROOT, stdout=(tmp_path / "runner.txt").open("w"), stderr=subprocess.STDOUT,
    )  # fmt: skip
    followers: list[subprocess.Popen[str]] = []
    try:
        wait_for("the kubeconfig", kubeconfig.exists, 120)

        def training() -> dict[str, Any] | None:
            s = status(kubeconfig)
            ok = s["state"] == "training" and s["world_size"] == 3 and (s["last_step"] or 0) >= 3
            return s if ok else None

        # -- status while it trains: the job line and every pod's state from its metrics
        during = wait_for("training at world size 3", training, 240)
        assert (during["min_nodes"], during["max_nodes"], during["metrics"]) == (2, 3, "on")
        ranks = {p["name"]: p["group_rank"] for p in during["pods"]}
        assert sorted(ranks.values()) == [0, 1, 2], during
        assert {p["capacity_type"] for p in during["pods"]} <= {"spot", "on-demand"}
        assert all(p["state"] == "training" and p["node"] for p in during["pods"]), during
        text = cli(kubeconfig, "status", RELEASE).stdout
        assert text.startswith(f"job {RELEASE} (namespace default): training, world size 3")
        assert_list(kubeconfig, during)

        followers.append(background(kubeconfig, "logs", RELEASE, "--rank0", "-f", "--tail", "5",
                                    out=tmp_path / "rank0.txt"))  # fmt: skip
        followers.append(background(kubeconfig, "logs", RELEASE, "--save", str(save),
                                    out=tmp_path / "save.txt"))  # fmt: skip
        followers.append(background(kubeconfig, "events", RELEASE, "-w",
                                    out=tmp_path / "events-w.txt"))  # fmt: skip
        time.sleep(3)

        # -- status after rank 0's pod was lost: a re-form, its cost, at world size 2
        away = evict_rank0_and_keep_it_away(kubeconfig, during)
        rank0, evicted = away["rank0"], [away["rank0"]]
        assert away["world_size"] == 2 and (away["reforms"] or 0) >= 1, away
        assert away["last_reform_seconds"] is not None and away["last_reform_seconds"] > 0
        after = wait_for("training at 3 again", reformed_since(kubeconfig, away["reforms"]), 180)
        assert after["world_size"] == 3, after

        assert_cost(kubeconfig, tmp_path)

        assert runner.wait(timeout=400) == 0, (tmp_path / "runner.txt").read_text()[-3000:]
        for f in followers[:2]:
            assert f.wait(timeout=60) == 0
    finally:
        for f in followers:
            if f.poll() is None:
                f.send_signal(signal.SIGINT)
        for f in followers:
            try:
                f.wait(timeout=10)
            except subprocess.TimeoutExpired:
                f.kill()
        if runner.poll() is None:
            runner.terminate()
            runner.wait(timeout=120)

    assert_what_the_followers_kept(tmp_path, rank0, evicted, save)


def assert_list(kubeconfig: Path, during: dict[str, Any]) -> None:
    # -- list while it trains: the job in one row, from the same metrics as status
    listed = cli(kubeconfig, "list", "-o", "json")
    assert listed.returncode == 0, listed.stderr
    (row,) = [i for i in json.loads(listed.stdout)["items"] if i["name"] == RELEASE]
    assert (row["namespace"], row["state"], row["world_size"]) == ("default", "training", 3), row
    assert (row["min_nodes"], row["max_nodes"], row["metrics"]) == (2, 3, "on"), row
    assert row["rounds"] == during["round"] and row["restarts_left"] == during["restarts_left"]
    assert isinstance(row["restarts_left"], int) and row["age_seconds"] > 0, row
    table = cli(kubeconfig, "list", "-A").stdout.splitlines()
    assert table[0].split() == ["NAMESPACE", "NAME", "STATE", "WORLD", "MIN", "MAX", "ROUNDS",
                                "RESTARTS-LEFT", "AGE"], table  # fmt: skip
    assert table[1].split()[:6] == ["default", RELEASE, "training", "3", "2", "3"], table


def assert_cost(kubeconfig: Path, tmp_path: Path) -> None:
    # -- cost while it runs: node-hours on the fixtures' instance type, spot and
    # on-demand, some share lost to the re-form
    prices = tmp_path / "prices.yaml"
    prices.write_text(PRICES)
    cost = cli(kubeconfig, "cost", RELEASE, "--prices", str(prices), "-o", "json")
    assert cost.returncode == 0, cost.stderr
    c = json.loads(cost.stdout)
    # two spot nodes for three pods (localrun/cluster/nodes.py "local"): both kinds are used
    assert {(x["instance_type"], x["capacity_type"]) for x in c["lines"]} == {
        ("c-4x-amd64-linux", "spot"), ("c-4x-amd64-linux", "on-demand")
    }  # fmt: skip
    assert c["node_hours"] > 0 and c["total"] > 0 and c["unpriced"] == []
    assert 0 < c["reform_share"] < 1, c


def assert_what_the_followers_kept(
    tmp_path: Path, rank0: str, evicted: list[str], save: Path
) -> None:
    # -- logs --rank0 -f: said that rank 0 moved, and followed the new one to the end
    said = (tmp_path / "rank0.err").read_text()
    assert f"following rank 0: {rank0}" in said, said
    assert f"rank 0 moved from {rank0} to " in said, said
    assert f"job {RELEASE} is complete" in said, said
    followed = (tmp_path / "rank0.txt").read_text()
    assert f"[train] step={STEPS} " in followed, followed[-2000:]

    # -- events: the eviction, then the re-form, in time order
    events = (tmp_path / "events-w.txt").read_text().splitlines()
    eviction = [
        i for i, e in enumerate(events) if f"pod/{evicted[0]}" in e and "EvictionByEvictionAPI" in e
    ]
    reforms = [
        i for i, e in enumerate(events) if "Reformed" in e and "re-formed at world size" in e
    ]
    assert eviction and reforms and eviction[0] < reforms[-1], "\n".join(events)
    assert any("JobCompleted" in e for e in events), "\n".join(events)
    killed = [e for e in events if f"pod/{pod(2)}" in e and "ContainerExited" in e]
    assert killed and "exited 137: killed (SIGKILL)" in killed[0], "\n".join(events)

    # -- logs --save: the evicted pod's first container log is kept, beside its new one
    runs = sorted((save / evicted[0]).glob("worker-*.log"))
    by_uid: dict[str, str] = {}
    for r in runs:
        uid = r.name.split("-")[1]
        by_uid[uid] = by_uid.get(uid, "") + r.read_text()
    # the evicted pod, the incarnations evicted before they trained, and the last one
    trained = [uid for uid, text in by_uid.items() if "[train] step=" in text]
    assert len(by_uid) >= 2 and len(trained) >= 2, {u: t[-300:] for u, t in by_uid.items()}
    saved = (tmp_path / "save.err").read_text()
    assert "saving the logs" in saved and f"job {RELEASE} is complete" in saved, saved
    assert {p.name for p in save.iterdir()} >= {pod(0), pod(1), pod(2)}
