"""The worker Dockerfile: hadolint clean, pinned base, console script, non-root."""

from __future__ import annotations

import re
import subprocess

from worker.worker_helpers import BIN, ROOT

DOCKERFILE = ROOT / "images" / "worker" / "Dockerfile"


def test_hadolint_is_clean() -> None:
    hadolint = BIN / "hadolint"
    assert hadolint.exists(), f"{hadolint} is missing: run scripts/bootstrap"
    result = subprocess.run(  # noqa: PLW1510 - the code is asserted
        [str(hadolint), "--no-color", str(DOCKERFILE)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_base_image_is_a_pinned_ngc_pytorch_tag_and_overridable() -> None:
    text = DOCKERFILE.read_text()
    match = re.search(r"^ARG BASE_IMAGE=(\S+)$", text, re.M)
    assert match, "ARG BASE_IMAGE=... is missing"
    assert re.fullmatch(r"nvcr\.io/nvidia/pytorch:\d\d\.\d\d-py3", match.group(1))
    assert re.search(r"^FROM \$\{BASE_IMAGE\}$", text, re.M)


def test_entrypoint_is_the_console_script_and_the_user_is_not_root() -> None:
    text = DOCKERFILE.read_text()
    assert 'ENTRYPOINT ["elastic-worker"]' in text
    users = re.findall(r"^USER (\S+)$", text, re.M)
    assert users and users[-1].split(":")[0] not in {"root", "0"}
    pyproject = (ROOT / "images/worker/pyproject.toml").read_text()
    assert 'elastic-worker = "elastic_worker.main:main"' in pyproject


def test_the_reference_script_is_installed_where_the_contract_says() -> None:
    text = DOCKERFILE.read_text()
    assert "WORKDIR /opt/elastic-worker" in text
    assert "COPY images/worker/examples ./examples" in text  # -> .../examples/train.py
    assert (ROOT / "images/worker/examples/train.py").is_file()
