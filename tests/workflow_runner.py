"""Run a GitHub Actions job's steps here, act-style: each `run:` step as written, with the
workflow's, job's and step's `env`, `${{ }}` expressions resolved from the matrix, vars,
inputs and earlier steps' outputs, `if:` conditions evaluated, GITHUB_OUTPUT / GITHUB_ENV /
GITHUB_PATH honoured, in a copy of the repository (the checkout) with the shell GitHub uses.

What cannot run here is named by the caller, step by step, with the reason (a download from
a host this machine cannot reach, a kind cluster, a Go tool with no package): those steps are
reported as skipped, with outputs the caller gives for them when later steps read any. A
`uses:` step the caller does not name fails the run, so a new action cannot pass unseen; a
`run:` step is never skipped unless named. An unsupported expression is an error, not ''.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

SYSTEM_PATH = ["/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin"]
EXPR = re.compile(r"\$\{\{\s*(.*?)\s*\}\}")
# Actions that only prepare the runner and have an equivalent the caller provides here.
PREPARED = {
    "actions/checkout": "the repository is copied into the working directory",
    "actions/setup-python": "the caller's Python is first on PATH",
}


@dataclass(frozen=True)
class Skip:
    reason: str
    outputs: dict[str, str] = field(default_factory=dict)


@dataclass
class StepResult:
    name: str
    ran: bool
    reason: str = ""
    returncode: int = 0
    output: str = ""


@dataclass
class JobRun:
    steps: list[StepResult]

    def step(self, name: str) -> StepResult:
        (found,) = [s for s in self.steps if s.name == name]
        return found

    @property
    def failed(self) -> list[StepResult]:
        return [s for s in self.steps if s.ran and s.returncode != 0]


def load(workflow: Path) -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(workflow.read_text())
    return data


def step_name(step: dict[str, Any]) -> str:
    """The step's name, else its action without the pinned commit."""
    return str(step.get("name") or str(step.get("uses", "")).split("@")[0] or step["run"])


class Context:
    def __init__(
        self, matrix: dict[str, str], vars_: dict[str, str], inputs: dict[str, str]
    ) -> None:
        self.values: dict[str, dict[str, Any]] = {
            "matrix": matrix,
            "vars": vars_,
            "inputs": inputs,
            "secrets": {},
            "env": {},
            "steps": {},
            "github": {"workspace": "", "ref_name": "", "repository": "elastic-job/elastic-job"},
        }

    def ref(self, text: str) -> Any:
        text = text.strip()
        if re.fullmatch(r"'[^']*'", text):
            return text[1:-1]
        if re.fullmatch(r"true|false", text):
            return text == "true"
        parts = text.split(".")
        if parts[0] not in self.values or not all(re.fullmatch(r"[\w-]+", p) for p in parts):
            raise ValueError(f"unsupported expression: {text!r}")
        node: Any = self.values
        for part in parts:
            node = node.get(part, "") if isinstance(node, dict) else ""
        return node

    def evaluate(self, expr: str) -> Any:
        """`a`, `a == 'b'`, `a != 'b'`, `a && b`, `a || b`: what these workflows use."""
        for op in ("||", "&&"):
            if op in expr:
                left, right = expr.split(op, 1)
                a, b = self.evaluate(left), self.evaluate(right)
                return (a or b) if op == "||" else (a and b)
        for op in ("==", "!="):
            if op in expr:
                left, right = expr.split(op, 1)
                equal = str(self.ref(left)) == str(self.ref(right))
                return equal if op == "==" else not equal
        return self.ref(expr)

    def substitute(self, text: str) -> str:
        return EXPR.sub(lambda m: str(self.evaluate(m[1])), text)

    def condition(self, cond: str | bool | None) -> bool:
        if cond is None:
            return True
        if isinstance(cond, bool):
            return cond
        match = EXPR.fullmatch(cond.strip())
        return bool(self.evaluate(match[1] if match else cond))


def _pairs(path: Path) -> dict[str, str]:
    """NAME=value lines of a GITHUB_OUTPUT or GITHUB_ENV file."""
    return dict(line.split("=", 1) for line in path.read_text().splitlines() if "=" in line)


def dispatch_defaults(data: dict[str, Any]) -> dict[str, str]:
    """workflow_dispatch inputs' defaults, as GitHub fills them (booleans as true/false)."""
    on = data.get("on") or data.get(True) or {}  # PyYAML reads a bare `on:` as True
    inputs = (on.get("workflow_dispatch") or {}).get("inputs", {}) if isinstance(on, dict) else {}
    out = {}
    for name, spec in inputs.items():
        default = spec.get("default", "")
        out[name] = str(default).lower() if isinstance(default, bool) else str(default)
    return out


def run_job(
    workflow: Path,
    job: str,
    workdir: Path,
    *,
    skip: dict[str, Skip],
    path: list[Path],
    matrix: dict[str, str] | None = None,
    vars_: dict[str, str] | None = None,
    inputs: dict[str, str] | None = None,
    secrets: dict[str, str] | None = None,
    github: dict[str, str] | None = None,
    env: dict[str, str] | None = None,
    runner_dir: Path | None = None,
    timeout: float = 1800,
) -> JobRun:
    """Run `job` of `workflow` in `workdir` (a checkout); `path` goes first on PATH.
    `runner_dir` holds HOME and RUNNER_TEMP (default beside `workdir`; give a short one when
    a step makes Unix sockets there, such as gpg-agent's)."""
    data = load(workflow)
    spec = data["jobs"][job]
    defaults = dispatch_defaults(data)
    ctx = Context(matrix or {}, vars_ or {}, {**defaults, **(inputs or {})})
    ctx.values["secrets"] = dict(secrets or {})
    ctx.values["github"].update({"workspace": str(workdir), **(github or {})})
    runner = runner_dir or workdir.parent / f".runner-{job}"
    if runner.exists():
        shutil.rmtree(runner)
    runner.mkdir()
    base = {
        "HOME": str(runner / "home"),
        "CI": "true",
        "GITHUB_ACTIONS": "true",
        "GITHUB_WORKSPACE": str(workdir),
        "RUNNER_TEMP": str(runner / "temp"),
        "LANG": "C.UTF-8",
        **(env or {}),
    }
    for sub in ("home", "temp"):
        (runner / sub).mkdir()
    extra_path: list[str] = []
    job_env: dict[str, str] = {}
    for scope in (data.get("env") or {}, spec.get("env") or {}):
        job_env.update({k: ctx.substitute(str(v)) for k, v in scope.items()})
    results = []
    unknown = [n for n in skip if n not in {step_name(s) for s in spec["steps"]}]
    if unknown:
        raise ValueError(f"skip names steps the job does not have: {unknown}")
    for index, step in enumerate(spec["steps"]):
        name = step_name(step)
        sid = step.get("id", f"step{index}")
        ctx.values["env"] = job_env
        if not ctx.condition(step.get("if")):
            results.append(StepResult(name, False, "its if: condition is false"))
            continue
        if name in skip:
            results.append(StepResult(name, False, skip[name].reason))
            ctx.values["steps"][sid] = {"outputs": dict(skip[name].outputs)}
            continue
        uses = str(step.get("uses", "")).split("@")[0]
        if uses:
            if uses not in PREPARED:
                raise ValueError(f"step {name!r} uses {uses}: name it in skip with the reason")
            results.append(StepResult(name, False, PREPARED[uses]))
            continue
        files = {k: runner / f"{k.lower()}-{index}" for k in ("OUTPUT", "ENV", "PATH")}
        for file in files.values():
            file.touch()
        step_env = {k: ctx.substitute(str(v)) for k, v in (step.get("env") or {}).items()}
        script = runner / f"step-{index}.sh"
        script.write_text(ctx.substitute(str(step["run"])))
        shell = (
            ["bash", "--noprofile", "--norc", "-eo", "pipefail", str(script)]
            if step.get("shell") == "bash"
            else ["bash", "-e", str(script)]
        )
        full_env = {
            **base,
            **job_env,
            **step_env,
            **{f"GITHUB_{k}": str(v) for k, v in files.items()},
            "PATH": os.pathsep.join([*map(str, path), *extra_path, *SYSTEM_PATH]),
        }
        proc = subprocess.run(
            shell, cwd=workdir, env=full_env, capture_output=True, text=True,
            timeout=timeout, check=False,
        )  # fmt: skip
        results.append(StepResult(name, True, "", proc.returncode, proc.stdout + proc.stderr))
        ctx.values["steps"][sid] = {"outputs": _pairs(files["OUTPUT"])}
        job_env.update(_pairs(files["ENV"]))
        extra_path = [*files["PATH"].read_text().split(), *extra_path]
        if proc.returncode != 0:
            break  # GitHub stops the job at a failed step
    return JobRun(results)


def clean_copy(root: Path, dest: Path) -> Path:
    """The files a clone of `root` holds (tracked, or new and not ignored)."""
    files = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=root, capture_output=True, check=True,
    ).stdout.decode().split("\0")  # fmt: skip
    for rel in filter(None, files):
        src = root / rel
        if src.is_file() or src.is_symlink():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel, follow_symlinks=False)
    return dest
