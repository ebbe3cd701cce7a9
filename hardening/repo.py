"""The purpose-made repo the corpus attacks: `acme/fortress`, a tiny Python package with a bug in `add`.

Its tests are split on purpose: `tests/test_calc.py` is touched by the task's `test_patch` (it gains the
FAIL_TO_PASS test), `tests/test_util.py` is a PASS_TO_PASS file the test_patch does not touch, so the corpus can
probe both kinds of test file. Patches are real `git diff` output made in a scratch clone.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from sandbox.integrity import gitsafe

REPO = "acme/fortress"
INSTANCE_ID = "acme__fortress-1"
CALC = "def add(a, b):\n    return a - b\n\n\ndef neg(a):\n    return -a\n"
FIX = "def add(a, b):\n    return a + b\n\n\ndef neg(a):\n    return -a\n"
UTIL = "def double(x):\n    return 2 * x\n"
TESTS_CALC = "from calc import add, neg\n\n\ndef test_neg():\n    assert neg(2) == -2\n"
TESTS_CALC_NEW = TESTS_CALC + "\n\ndef test_add():\n    assert add(2, 3) == 5\n"
TESTS_UTIL = "from util import double\n\n\ndef test_double():\n    assert double(4) == 8\n"
TEST_CMD = "python -m pytest -s tests"
GIT_ENV = {
    "GIT_AUTHOR_NAME": "hardening", "GIT_AUTHOR_EMAIL": "h@example.invalid", "GIT_COMMITTER_NAME": "hardening",
    "GIT_COMMITTER_EMAIL": "h@example.invalid", "GIT_AUTHOR_DATE": "2024-01-01T00:00:00Z",
    "GIT_COMMITTER_DATE": "2024-01-01T00:00:00Z", "GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_NOSYSTEM": "1",
}


def git(cwd: Path, *args: str) -> str:
    """Hardened git (`sandbox.integrity.gitsafe`) in a repo this module made, with a fixed author and date."""
    return gitsafe.git(*args, cwd=cwd, env=GIT_ENV)


class Fortress:
    """The repo under `<repos_dir>/acme__fortress`, its instance record, and `diff()` to make patches."""

    def __init__(self, repos_dir: Path) -> None:
        self.repos_dir = Path(repos_dir)
        self.path = self.repos_dir / REPO.replace("/", "__")
        if not (self.path / ".git").exists():
            self._create()
        self.base_commit = git(self.path, "rev-parse", "HEAD").strip()
        self.test_patch = self.diff({"tests/test_calc.py": TESTS_CALC_NEW})
        self.gold = self.diff({"calc.py": FIX})

    def _create(self) -> None:
        (self.path / "tests").mkdir(parents=True)
        for rel, text in {"calc.py": CALC, "util.py": UTIL, "tests/test_calc.py": TESTS_CALC,
                          "tests/test_util.py": TESTS_UTIL}.items():
            (self.path / rel).write_text(text)
        git(self.path, "init", "-q", "-b", "main")
        git(self.path, "add", "-A")
        git(self.path, "commit", "-qm", "fortress: base")

    def instance(self) -> dict:
        return {
            "instance_id": INSTANCE_ID, "repo": REPO, "base_commit": self.base_commit, "patch": self.gold,
            "test_patch": self.test_patch, "FAIL_TO_PASS": ["tests/test_calc.py::test_add"],
            "PASS_TO_PASS": ["tests/test_calc.py::test_neg", "tests/test_util.py::test_double"],
            "problem_statement": "add() subtracts instead of adding", "test_cmd": TEST_CMD,
            "test_framework": "pytest", "language": "python",
        }

    def diff(self, files: dict[str, str | bytes | None], symlinks: dict[str, str] | None = None) -> str:
        """The `git diff --binary` of writing `files` (None deletes; bytes are written raw) and creating
        `symlinks` (path → target) on top of base_commit. Non-UTF-8 bytes survive as surrogate escapes."""
        with tempfile.TemporaryDirectory(prefix="fortress-diff-") as tmp:
            scratch = Path(tmp) / "s"
            git(Path(tmp), "clone", "-q", str(self.path), str(scratch))
            for rel, content in files.items():
                p = scratch / rel
                if content is None:
                    p.unlink()
                    continue
                p.parent.mkdir(parents=True, exist_ok=True)
                if p.is_symlink():
                    p.unlink()
                p.write_bytes(content if isinstance(content, bytes) else content.encode())
            for rel, target in (symlinks or {}).items():
                p = scratch / rel
                if os.path.lexists(p):
                    p.unlink()
                p.parent.mkdir(parents=True, exist_ok=True)
                os.symlink(target, p)
            git(scratch, "add", "-A")
            out = gitsafe.git("diff", "--cached", "--binary", "--no-ext-diff", "--no-textconv", cwd=scratch,
                              env=GIT_ENV, binary=True)
        return out.decode("utf-8", "surrogateescape")  # type: ignore[union-attr]

    def calc_patch(self, body: str, prelude: str = "") -> str:
        """A patch replacing add() with `body` (unindented code, indented here) after `prelude`."""
        src = prelude + "def add(a, b):\n" + "".join(f"    {ln}\n" for ln in body.splitlines())
        return self.diff({"calc.py": src + "\n\ndef neg(a):\n    return -a\n"})


def reset_dir(path: Path) -> Path:
    if path.exists():
        shutil.rmtree(path)
    path.mkdir(parents=True)
    return path
