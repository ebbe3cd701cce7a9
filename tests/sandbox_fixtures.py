"""Helpers for the sandbox tests: tiny real git repos, instances and patches made with `git diff`, and Docker
checks. A plain module (imported by the test files), not a conftest, so it stays out of other areas' tests."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

GIT_ENV = {
    **os.environ,
    "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t.invalid", "GIT_COMMITTER_NAME": "t",
    "GIT_COMMITTER_EMAIL": "t@t.invalid", "GIT_AUTHOR_DATE": "2024-01-01T00:00:00Z",
    "GIT_COMMITTER_DATE": "2024-01-01T00:00:00Z", "GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_NOSYSTEM": "1",
}
REPO = "acme/calc"
CALC = "def add(a, b):\n    return a - b\n\n\ndef neg(a):\n    return -a\n"
TESTS_BASE = "from calc import add, neg\n\n\ndef test_neg():\n    assert neg(2) == -2\n"
TESTS_NEW = TESTS_BASE + "\n\ndef test_add():\n    assert add(2, 3) == 5\n"
FIX = "def add(a, b):\n    return a + b\n\n\ndef neg(a):\n    return -a\n"


def git(cwd: Path, *args: str) -> str:
    """Host git on a test's own repository, with a fixed identity and date so that commit ids (and whatever a
    test seeds from them) are the same in every run."""
    return subprocess.run(["git", *args], cwd=cwd, env=GIT_ENV, check=True, capture_output=True,
                          text=True).stdout


def commit_tree(root: Path, files: dict[str, str] | None = None, message: str = "base") -> str:
    """Write `files` under `root`, commit everything (initialising the repository if needed); the commit id."""
    for name, body in (files or {}).items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(body)
    if not (root / ".git").exists():
        git(root, "init", "-q")
    git(root, "add", "-A")
    git(root, "commit", "-qm", message)
    return git(root, "rev-parse", "HEAD").strip()


def docker_ready() -> str | None:
    """None when the engine answers and the python image exists, else why not."""
    try:
        import docker

        c = docker.from_env(timeout=10)
        c.ping()
        c.images.get("gagar-python:latest")
    except Exception as exc:  # noqa: BLE001 - any failure means "skip", with the reason shown
        return f"Docker sandbox not available ({exc}); run `make docker images`"
    return None


def require_docker() -> None:
    reason = docker_ready()
    if reason:
        pytest.skip(reason)


def leftover_containers(run_id: str | None = None, pid: int | None = None) -> list[str]:
    """Containers of `run_id` left by this process (or by `pid`, a child it started) or by one that has exited.
    The engine is shared: another live process (a colleague running the same test, with the same run id) may
    have containers of its own."""
    import docker

    from sandbox.cleanup import owner_alive
    from sandbox.container import OWNER_LABEL

    labels = ["gagar.sandbox=1"] + ([f"gagar.run={run_id}"] if run_id else [])
    rows = docker.from_env().api.containers(all=True, filters={"label": labels})
    mine = f":{pid or os.getpid()}"
    return [r["Names"][0].lstrip("/") for r in rows
            if (owner := (r.get("Labels") or {}).get(OWNER_LABEL, "")).endswith(mine) or not owner_alive(owner)]


class CalcTask:
    """A real git repo `acme/calc` with a bug in `add`, its instance, and a way to make patches from edits."""

    def __init__(self, root: Path, test_cmd: str = "python -m pytest tests") -> None:
        self.root = root
        self.repos_dir = root / "repos"
        self.repo = self.repos_dir / REPO.replace("/", "__")
        self.repo.mkdir(parents=True)
        (self.repo / "tests").mkdir()
        (self.repo / "calc.py").write_text(CALC)
        (self.repo / "tests" / "test_calc.py").write_text(TESTS_BASE)
        git(self.repo, "init", "-q", "-b", "main")
        git(self.repo, "add", "-A")
        git(self.repo, "commit", "-qm", "base")
        self.base_commit = git(self.repo, "rev-parse", "HEAD").strip()
        self.test_patch = self.diff({"tests/test_calc.py": TESTS_NEW})
        self.instance = {
            "instance_id": "acme__calc-1", "repo": REPO, "base_commit": self.base_commit,
            "patch": self.diff({"calc.py": FIX}), "test_patch": self.test_patch,
            "FAIL_TO_PASS": json.dumps(["tests/test_calc.py::test_add"]),
            "PASS_TO_PASS": ["tests/test_calc.py::test_neg"], "problem_statement": "add() subtracts",
            "test_cmd": test_cmd, "test_framework": "pytest", "language": "python",
        }

    def diff(self, files: dict[str, str | None]) -> str:
        """The `git diff` of writing `files` (None deletes) on top of base_commit."""
        scratch = self.root / "scratch"
        if scratch.exists():
            shutil.rmtree(scratch)
        git(self.root, "clone", "-q", str(self.repo), str(scratch))
        for rel, text in files.items():
            p = scratch / rel
            if text is None:
                p.unlink()
            else:
                p.parent.mkdir(parents=True, exist_ok=True)
                p.write_text(text)
        git(scratch, "add", "-A")
        out = git(scratch, "diff", "--cached", "--binary")
        shutil.rmtree(scratch)
        return out

    def calc_patch(self, body: str, prelude: str = "") -> str:
        """A patch replacing add() with `body` (indented code) and `prelude` (module-level code)."""
        src = prelude + "def add(a, b):\n" + "".join(f"    {ln}\n" for ln in body.splitlines())
        return self.diff({"calc.py": src + "\n\ndef neg(a):\n    return -a\n"})

    def write_inputs(self, preds: list[dict], name: str = "p") -> tuple[Path, Path]:
        inst = self.root / "instances.jsonl"
        inst.write_text(json.dumps(self.instance) + "\n")
        pp = self.root / f"{name}.jsonl"
        pp.write_text("".join(json.dumps({"model_name_or_path": "test", **p}) + "\n" for p in preds))
        return inst, pp


def results_by_rollout(run_dir: Path) -> dict[str, dict]:
    out = {}
    for line in (run_dir / "results.jsonl").read_text().splitlines():
        if line.strip():
            d = json.loads(line)
            out[str(d["rollout_id"])] = d
    return out
