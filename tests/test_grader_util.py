"""Helpers shared by the grader tests (no tests here): purpose-made git repos and the bundled tasks."""

from __future__ import annotations

from pathlib import Path

from sandbox_fixtures import commit_tree, git
from task_fixtures import build_bundled_tasks

ROOT = Path(__file__).resolve().parents[1]
def make_repo(repos_dir: Path, files: dict[str, str], name: str = "acme__calc") -> tuple[Path, str]:
    """A git repo `<repos_dir>/<name>` holding `files` in one commit; returns (path, commit)."""
    repo = repos_dir / name
    repo.mkdir(parents=True)
    return repo, commit_tree(repo, files)


def make_patch(repo: Path, changes: dict[str, str | None]) -> str:
    """The `git diff` of writing `changes` (None deletes) on top of HEAD; the repo is left unchanged."""
    for rel, text in changes.items():
        p = repo / rel
        if text is None:
            p.unlink()
        else:
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text(text)
    git(repo, "add", "-A")
    patch = git(repo, "diff", "--cached", "HEAD")
    git(repo, "reset", "-q", "--hard", "HEAD")
    return patch


def bundled_tasks(base: Path) -> Path:
    """Build the bundled tasks once per test session (examples/build_tasks.py, offline and fast)."""
    return build_bundled_tasks(base)


CALC = '''def add(a, b):
    return a - b


def sub(a, b):
    return a - b


def mul(a, b):
    return a * b
'''
