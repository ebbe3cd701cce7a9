"""apply_patch fallback chain and restore_task_tests on real git repos in tmp dirs (no Docker)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from sandbox.apply import apply_patch, audit_tree, restore_task_tests
from sandbox.patchcheck import PatchRejected, validate_patch

GIT = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "init.defaultBranch=main"]
TEN = "".join(f"line {i}\n" for i in range(1, 11))


def git(root: Path, *args: str) -> str:
    return subprocess.run([*GIT, *args], cwd=root, check=True, capture_output=True, text=True).stdout.strip()


def commit(root: Path, files: dict[str, str | bytes | None], msg: str = "c") -> str:
    for rel, content in files.items():
        p = root / rel
        if content is None:
            p.unlink()
            continue
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(content.encode() if isinstance(content, str) else content)
    git(root, "add", "-A")
    git(root, "commit", "-qm", msg)
    return git(root, "rev-parse", "HEAD")


def make_repo(root: Path, files: dict[str, str | bytes]) -> str:
    root.mkdir(parents=True)
    git(root, "init", "-q")
    return commit(root, files, "base")


def staged_diff(root: Path, files: dict[str, str | bytes]) -> bytes:
    for rel, content in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(content.encode() if isinstance(content, str) else content)
    git(root, "add", "-A")
    out = subprocess.run([*GIT, "diff", "--cached", "--binary"], cwd=root, check=True, capture_output=True).stdout
    git(root, "reset", "-q", "--hard")
    git(root, "clean", "-qfdx")
    return out


@pytest.fixture
def repo(tmp_path: Path) -> tuple[Path, str]:
    root = tmp_path / "repo"
    base = make_repo(root, {"f.txt": TEN, "tests/test_a.py": "def test_a():\n    assert True\n"})
    return root, base


def test_plain_git_apply(repo) -> None:
    root, base = repo
    patch = staged_diff(root, {"f.txt": TEN.replace("line 5", "five")})
    out = apply_patch(root, patch, base_commit=base)
    assert out.applied and out.method == "git apply"
    assert "five" in (root / "f.txt").read_text()


def test_needs_3way(repo) -> None:
    root, _ = repo
    patch = staged_diff(root, {"f.txt": TEN.replace("line 5", "five")})  # made against the old commit
    base = commit(root, {"f.txt": TEN.replace("line 2", "two")})  # context of the hunk changed since
    out = apply_patch(root, patch, base_commit=base)
    assert out.method == "git apply --3way", out.log
    assert "$ git apply (exit 1)" in out.log
    assert (root / "f.txt").read_text() == TEN.replace("line 2", "two").replace("line 5", "five")


def test_needs_fuzz_and_reject_is_not_counted(repo) -> None:
    root, _ = repo
    # A hand-written diff -u style patch (no index line, so --3way cannot help) whose first context line is stale.
    patch = ("--- a/f.txt\n+++ b/f.txt\n@@ -2,7 +2,7 @@\n LINE 2\n line 3\n line 4\n-line 5\n+five\n"
             " line 6\n line 7\n line 8\n")
    base = git(root, "rev-parse", "HEAD")
    out = apply_patch(root, patch, base_commit=base)
    assert out.applied and out.method == "patch --fuzz", out.log
    for step in ("$ git apply (exit 1)", "$ git apply --3way (exit 1)", "$ git apply --reject (exit 1)"):
        assert step in out.log
    assert "five" in (root / "f.txt").read_text()
    assert not list(root.rglob("*.rej")) and not list(root.rglob("*.orig"))


def test_nothing_applies_leaves_base(repo) -> None:
    root, base = repo
    patch = "--- a/f.txt\n+++ b/f.txt\n@@ -1,2 +1,2 @@\n-nope\n+yes\n nada\n"
    (root / "junk.txt").write_text("left over from an earlier run")
    out = apply_patch(root, patch, base_commit=base)
    assert not out.applied and out.method is None
    assert out.log.count("$ ") == 4  # all four methods tried
    assert git(root, "status", "--porcelain") == "" and (root / "f.txt").read_text() == TEN


def test_binary_patch_applied(repo) -> None:
    root, base = repo
    payload = bytes(range(256)) * 8
    patch = staged_diff(root, {"data/blob.bin": payload})
    out = apply_patch(root, patch, base_commit=base)
    assert out.applied and out.info.has_binary
    assert (root / "data/blob.bin").read_bytes() == payload


def test_non_utf8_patch_applied(tmp_path: Path) -> None:
    root = tmp_path / "r"
    base = make_repo(root, {"latin.txt": b"caf\xe9\n"})
    patch = staged_diff(root, {"latin.txt": b"caf\xe9 cr\xe8me\n"})
    out = apply_patch(root, patch, base_commit=base)
    assert out.applied and (root / "latin.txt").read_bytes() == b"caf\xe9 cr\xe8me\n"


def test_inside_symlink_applied(repo) -> None:
    root, base = repo
    link = "diff --git a/lnk b/lnk\nnew file mode 120000\n--- /dev/null\n+++ b/lnk\n@@ -0,0 +1 @@\n+f.txt\n" \
           "\\ No newline at end of file\n"
    out = apply_patch(root, link, base_commit=base)
    assert out.applied and os.readlink(root / "lnk") == "f.txt"


def test_gnu_patch_would_write_b_double_slash_but_we_reject(repo, tmp_path: Path) -> None:
    root, base = repo
    evil = "--- /dev/null\n+++ b//etc/evil\n@@ -0,0 +1 @@\n+pwned\n"
    # Why validation runs first: GNU patch itself strips the leading slash and writes etc/evil with exit 0.
    probe = tmp_path / "probe"
    shutil.copytree(root, probe, symlinks=True)
    proc = subprocess.run(["patch", "--batch", "-p1"], input=evil.encode(), cwd=probe, capture_output=True)
    assert proc.returncode == 0 and (probe / "etc/evil").read_text() == "pwned\n"
    with pytest.raises(PatchRejected, match="absolute"):
        apply_patch(root, evil, base_commit=base)
    assert not (root / "etc").exists()


def test_rejects_git_hook(repo) -> None:
    root, base = repo
    patch = "--- /dev/null\n+++ b/.git/hooks/post-checkout\n@@ -0,0 +1 @@\n+touch /tmp/pwned\n"
    with pytest.raises(PatchRejected, match=".git"):
        apply_patch(root, patch, base_commit=base)
    assert not (root / ".git/hooks/post-checkout").exists()


def test_audit_finds_escaping_symlink_and_git_changes(repo, tmp_path: Path) -> None:
    root, _ = repo
    from sandbox.apply import _git_state

    before = _git_state(root)
    assert audit_tree(root, before) == []
    os.symlink(tmp_path, root / "escape")
    os.symlink(".git", root / "gitlink")
    (root / ".git/hooks/pre-commit").write_text("#!/bin/sh\n")
    problems = "\n".join(audit_tree(root, before))
    assert "escape: symlink resolves outside" in problems
    assert "gitlink: symlink points into .git" in problems
    assert ".git/hooks/pre-commit" in problems


TEST_PATCH = ("--- a/tests/test_a.py\n+++ b/tests/test_a.py\n@@ -1,2 +1,5 @@\n def test_a():\n     assert True\n"
              "+\n+def test_new():\n+    assert 1 + 1 == 2\n")


def test_restore_untampered(repo) -> None:
    root, base = repo
    model = staged_diff(root, {"f.txt": TEN.replace("line 1\n", "one\n")})
    out = apply_patch(root, model, base_commit=base)
    res = restore_task_tests(root, base_commit=base, test_patch=TEST_PATCH, model_patch_info=out.info)
    assert not res.tampered and res.touched == []
    assert "test_new" in (root / "tests/test_a.py").read_text()
    assert (root / "f.txt").read_text().startswith("one\n")  # the model's change survives


def test_restore_reverts_tampering(repo) -> None:
    root, base = repo
    model = staged_diff(root, {
        "f.txt": TEN.replace("line 1\n", "one\n"),
        "tests/test_a.py": "def test_a():\n    pass\n\ndef test_new():\n    pass\n",
        "tests/conftest.py": "import pytest\n@pytest.hookimpl\ndef pytest_runtest_call(item):\n    pass\n",
        "pytest.ini": "[pytest]\naddopts = -p no:junitxml\n",
    })
    out = apply_patch(root, model, base_commit=base)
    res = restore_task_tests(root, base_commit=base, test_patch=TEST_PATCH, model_patch_info=out.info)
    assert res.tampered
    assert res.touched == ["pytest.ini", "tests/conftest.py", "tests/test_a.py"]
    assert not (root / "tests/conftest.py").exists() and not (root / "pytest.ini").exists()
    assert (root / "tests/test_a.py").read_text() == (
        "def test_a():\n    assert True\n\ndef test_new():\n    assert 1 + 1 == 2\n")
    assert (root / "f.txt").read_text().startswith("one\n")


def test_restore_removes_symlinked_parent(repo) -> None:
    root, base = repo
    # A model that replaced tests/ by a symlink to its own folder cannot redirect the restore.
    shutil.rmtree(root / "tests")
    (root / "fake").mkdir()
    (root / "fake/test_a.py").write_text("def test_a():\n    pass\n")
    os.symlink("fake", root / "tests")
    info = validate_patch("--- a/f.txt\n+++ b/f.txt\n@@ -1 +1 @@\n-line 1\n+one\n", root)
    restore_task_tests(root, base_commit=base, test_patch=TEST_PATCH, model_patch_info=info)
    assert not (root / "tests").is_symlink() and "test_new" in (root / "tests/test_a.py").read_text()
    assert (root / "fake/test_a.py").read_text() == "def test_a():\n    pass\n"


def test_restore_after_model_deleted_and_renamed_tests(repo) -> None:
    root, base = repo
    commit(root, {"tests/test_b.py": "def test_b():\n    assert True\n"})
    base = git(root, "rev-parse", "HEAD")

    # the model deletes one test file the task owns and renames another away
    git(root, "rm", "-q", "tests/test_a.py")
    git(root, "mv", "tests/test_b.py", "tests/old_b.py")
    model = subprocess.run([*GIT, "diff", "--cached", "-M"], cwd=root, check=True, capture_output=True).stdout
    git(root, "reset", "-q", "--hard")
    out = apply_patch(root, model, base_commit=base)
    assert out.applied and not (root / "tests/test_b.py").exists()
    res = restore_task_tests(root, base_commit=base, test_patch=TEST_PATCH, model_patch_info=out.info,
                             extra_protected=["tests/test_b.py"])
    assert res.tampered and res.touched == ["tests/test_a.py", "tests/test_b.py"]
    assert "test_new" in (root / "tests/test_a.py").read_text()
    assert (root / "tests/test_b.py").read_text() == "def test_b():\n    assert True\n"


PYPROJECT = '[project]\nname = "x"\nversion = "1"\n\n[tool.pytest.ini_options]\naddopts = "-q"\n'


@pytest.mark.parametrize(
    "new, tampered",
    [
        (PYPROJECT.replace('version = "1"', 'version = "2"'), False),  # unrelated edit survives
        (PYPROJECT.replace('"-q"', '"-q -p evil_plugin"'), True),  # a plugin of the model's choosing
    ],
    ids=["version-bump", "pytest-addopts"],
)
def test_restore_pyproject_pytest_section(tmp_path: Path, new: str, tampered: bool) -> None:
    root = tmp_path / "r"
    base = make_repo(root, {"pyproject.toml": PYPROJECT, "setup.cfg": "[metadata]\nname = x\n"})
    model = staged_diff(root, {"pyproject.toml": new, "setup.cfg": "[metadata]\nname = y\n"})
    out = apply_patch(root, model, base_commit=base)
    res = restore_task_tests(root, base_commit=base, test_patch="", model_patch_info=out.info)
    assert res.tampered is tampered and res.touched == (["pyproject.toml"] if tampered else [])
    assert (root / "pyproject.toml").read_text() == (PYPROJECT if tampered else new)
    assert (root / "setup.cfg").read_text() == "[metadata]\nname = y\n"


def test_restore_setup_cfg_pytest_section_added(tmp_path: Path) -> None:
    root = tmp_path / "r"
    base = make_repo(root, {"setup.cfg": "[metadata]\nname = x\n"})
    model = staged_diff(root, {"setup.cfg": "[metadata]\nname = x\n\n[tool:pytest]\naddopts = -p no:junitxml\n"})
    out = apply_patch(root, model, base_commit=base)
    res = restore_task_tests(root, base_commit=base, test_patch="", model_patch_info=out.info)
    assert res.tampered and (root / "setup.cfg").read_text() == "[metadata]\nname = x\n"
