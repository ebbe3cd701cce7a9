"""Issue 11, part A, without containers: the hardened git helper (`sandbox.integrity.gitsafe`), the diff of an untrusted
tree without git in it (`sandbox.integrity.treediff`), and "no future" in the group workspace (real git throughout).

The host-side attacks here are planted directly on disk (what an agent's shell could do); the same attacks
through the agent's `run` tool in a real container are in tests/test_hardening_agent_git.py."""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import zlib
from pathlib import Path

import pytest
from sandbox_fixtures import GIT_ENV

from sandbox.integrity import gitsafe
from sandbox.integrity.treediff import Limits, TreeDiffError, tree_diff
from sandbox.workspace import GroupWorkspace

# Nothing of the caller's environment but PATH: no user config can reach the git calls under test.
ENV = {**{k: v for k, v in GIT_ENV.items() if k.startswith("GIT_")}, "PATH": os.environ["PATH"], "HOME": "/nonexistent"}
FUTURE_TEXT = "FUTURE-FIX-7f3a9c"


def sh(cwd: Path, *args: str) -> str:
    """Plain git for building fixtures in trees the test itself wrote."""
    return subprocess.run(["git", *args], cwd=cwd, env=ENV, check=True, capture_output=True, text=True).stdout


def make_repo_with_future(root: Path) -> tuple[Path, str, list[str]]:
    """`root/acme__future`: a base commit, then later commits (the fix), a tag, a branch, a stash-like dangling
    commit, a dangling blob and a remote — all holding FUTURE_TEXT. Returns (repo, base sha, future shas)."""
    repo = root / "acme__future"
    (repo / "pkg").mkdir(parents=True)
    (repo / "pkg" / "mod.py").write_text("def f():\n    return 1\n")
    (repo / "README").write_text("base\n")
    sh(repo, "init", "-q", "-b", "main")
    sh(repo, "add", "-A")
    sh(repo, "commit", "-qm", "base")
    base = sh(repo, "rev-parse", "HEAD").strip()
    (repo / "pkg" / "mod.py").write_text(f"def f():\n    return 2  # {FUTURE_TEXT}\n")
    sh(repo, "commit", "-qam", f"the fix {FUTURE_TEXT}")
    fix = sh(repo, "rev-parse", "HEAD").strip()
    sh(repo, "tag", "-a", "v1", "-m", f"tag {FUTURE_TEXT}")
    sh(repo, "checkout", "-qb", "later")
    (repo / "later.txt").write_text(f"{FUTURE_TEXT} later\n")
    sh(repo, "add", "-A")
    sh(repo, "commit", "-qm", "later")
    later = sh(repo, "rev-parse", "HEAD").strip()
    blob = subprocess.run(["git", "hash-object", "-w", "--stdin"], cwd=repo, env=ENV, input=f"{FUTURE_TEXT} loose",
                          capture_output=True, text=True, check=True).stdout.strip()
    sh(repo, "remote", "add", "origin", "https://example.invalid/acme/future.git")
    sh(repo, "checkout", "-q", "main")
    sh(repo, "gc", "-q")  # the future in a pack too, not only loose objects
    return repo, base, [fix, later, blob]


def assert_no_future(tree: Path, base: str, future: list[str]) -> None:
    """Every way to reach later history from a copy finds nothing (run as the test: the copy is ours)."""
    gd = tree / ".git"
    assert sh(tree, "rev-parse", "HEAD").strip() == base
    for sha in future:
        assert subprocess.run(["git", "cat-file", "-e", sha], cwd=tree, env=ENV).returncode != 0, sha
    assert sh(tree, "log", "--all", "--format=%H").split() == [base]
    assert sh(tree, "for-each-ref").strip() == ""
    assert sh(tree, "remote").strip() == "" and sh(tree, "tag").strip() == ""
    fsck = subprocess.run(["git", "fsck", "--lost-found", "--no-progress"], cwd=tree, env=ENV,
                          capture_output=True, text=True)
    assert fsck.returncode == 0 and "dangling" not in fsck.stdout + fsck.stderr
    assert not (gd / "lost-found").exists() or not any((gd / "lost-found").rglob("*"))
    assert not (gd / "FETCH_HEAD").exists() and not (gd / "ORIG_HEAD").exists() and not (gd / "logs").exists()
    assert not (gd / "packed-refs").exists()
    # The object files themselves: every loose object inflated, every pack's contents via git, raw bytes too.
    everything = subprocess.run(["git", "cat-file", "--batch-all-objects", "--batch", "--unordered"], cwd=tree,
                                env=ENV, check=True, capture_output=True).stdout
    assert FUTURE_TEXT.encode() not in everything and b"return 1" in everything
    for p in gd.rglob("*"):
        if p.is_file():
            raw = p.read_bytes()
            assert FUTURE_TEXT.encode() not in raw, p
            if "objects" in p.parts and len(p.name) == 38:
                assert FUTURE_TEXT.encode() not in zlib.decompress(raw), p


def test_export_commit_has_no_future(tmp_path: Path) -> None:
    repo, base, future = make_repo_with_future(tmp_path)
    # The fixture is real: the source reaches all of it.
    for sha in future:
        assert subprocess.run(["git", "cat-file", "-e", sha], cwd=repo, env=ENV).returncode == 0
    dest = tmp_path / "copy"
    assert gitsafe.export_commit(repo, base, dest) == base
    assert (dest / "pkg" / "mod.py").read_text() == "def f():\n    return 1\n"
    assert_no_future(dest, base, future)
    with pytest.raises(gitsafe.GitError, match="no commit"):
        gitsafe.export_commit(repo, "0" * 40, tmp_path / "nope")


@pytest.mark.parametrize("shared", [False, True])
def test_group_workspace_copies_have_no_future(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                               shared: bool) -> None:
    """Eval and agent trees are `GroupWorkspace.copy()`s: plain copies and object-sharing copies alike."""
    repo, base, future = make_repo_with_future(tmp_path / "repos")
    if shared:
        monkeypatch.setattr("sandbox.workspace.SHARED_CLONE_ABOVE", 0)
    with GroupWorkspace(tmp_path / "repos", "acme/future", base, tmp_root=tmp_path) as ws:
        assert ws.shared_objects is shared
        assert_no_future(ws.base, base, future)
        copy = ws.copy()
        assert_no_future(copy, base, future)
        assert sh(copy, "status", "--porcelain") == ""
        assert ws.git_dir == ws.base / ".git" and copy not in ws.git_dir.parents


def test_hardened_env_drops_inherited_git_variables(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """GIT_CONFIG_PARAMETERS / GIT_EXTERNAL_DIFF / GIT_CONFIG_GLOBAL in gagar's own environment name commands;
    the helper drops them (proved with the same variables making plain git run the command). GitPython copies
    `os.environ` into every call, so they are gone from the process environment after the call."""
    repo = tmp_path / "r"
    repo.mkdir()
    sh(repo, "init", "-q")
    (repo / "f").write_text("a\n")
    sh(repo, "add", "f")
    sh(repo, "commit", "-qm", "x")
    (repo / "f").write_text("b\n")
    marker = tmp_path / "marker"
    evil_cfg = tmp_path / "evil.cfg"
    evil_cfg.write_text(f"[core]\n\tfsmonitor = touch {marker}-global; true\n")
    monkeypatch.setenv("GIT_CONFIG_PARAMETERS", f"'core.fsmonitor'='touch {marker}-params; true'")
    monkeypatch.setenv("GIT_EXTERNAL_DIFF", f"touch {marker}-extdiff; true")
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", str(evil_cfg))
    hostile = dict(os.environ)
    out = gitsafe.git("diff", "--no-ext-diff", git_dir=repo / ".git", work_tree=repo)
    gitsafe.git("status", "--porcelain", git_dir=repo / ".git", work_tree=repo)
    assert "+b" in out and not list(tmp_path.glob("marker*"))
    assert not [k for k in os.environ if k.startswith("GIT_")]
    # Control: the same environment makes plain git run them.
    subprocess.run(["git", "diff"], cwd=repo, capture_output=True, env=hostile)
    assert {p.name for p in tmp_path.glob("marker*")} >= {"marker-params", "marker-extdiff"}
    env = gitsafe.hardened_env()
    assert env["GIT_CONFIG_NOSYSTEM"] == "1" and env["GIT_CONFIG_GLOBAL"] == os.devnull
    assert "GIT_CONFIG_PARAMETERS" not in env and "GIT_EXTERNAL_DIFF" not in env


def test_inherited_repository_variables_do_not_redirect_a_call(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """gagar started from a git hook (a pre-commit running the tests) inherits GIT_DIR, GIT_INDEX_FILE and
    GIT_WORK_TREE naming the user's repository: a call on a repository gagar made must still act on that one."""
    user, mine = tmp_path / "user", tmp_path / "mine"
    for repo, name in ((user, "user.txt"), (mine, "mine.txt")):
        repo.mkdir()
        sh(repo, "init", "-q")
        (repo / name).write_text("x\n")
        sh(repo, "add", name)
        sh(repo, "commit", "-qm", name)
    monkeypatch.setenv("GIT_DIR", str(user / ".git"))
    monkeypatch.setenv("GIT_WORK_TREE", str(user))
    monkeypatch.setenv("GIT_INDEX_FILE", str(user / ".git" / "index"))
    assert gitsafe.git("ls-files", cwd=mine).split() == ["mine.txt"]
    assert gitsafe.git("ls-files", git_dir=mine / ".git", work_tree=mine).split() == ["mine.txt"]


def test_the_child_sees_exactly_the_hardened_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What a git child really gets (printed by a shell alias the trusted caller defines) is `hardened_env()`:
    no inherited GIT_* variable, HOME nowhere, editors no-ops, the repository the call names."""
    repo = tmp_path / "r"
    repo.mkdir()
    sh(repo, "init", "-q")
    monkeypatch.setenv("GIT_SSH_COMMAND", "touch /tmp/never")
    monkeypatch.setenv("EDITOR", "touch /tmp/never")
    monkeypatch.setenv("GAGAR_TEST_KEPT", "1")
    out = gitsafe.git("-c", "alias.showenv=!env -0", "showenv", cwd=repo)
    child = dict(kv.split("=", 1) for kv in out.split("\0") if "=" in kv)
    want = gitsafe.hardened_env({"GIT_CEILING_DIRECTORIES": str(tmp_path.resolve())})
    # git adds its own bookkeeping to an alias's environment (GIT_PREFIX, GIT_EXEC_PATH, and the `-c` options
    # passed on as GIT_CONFIG_PARAMETERS), the shell its own; nothing else.
    added = set(child) - set(want)
    assert added <= {"GIT_PREFIX", "GIT_EXEC_PATH", "GIT_CONFIG_PARAMETERS", "PWD", "OLDPWD", "SHLVL", "_"}, added
    assert "core.hooksPath" in child["GIT_CONFIG_PARAMETERS"] and "touch" not in child["GIT_CONFIG_PARAMETERS"]
    for k in ("HOME", "XDG_CONFIG_HOME", "EDITOR", "VISUAL", "GIT_CONFIG_GLOBAL", "GIT_CONFIG_NOSYSTEM",
              "GIT_CEILING_DIRECTORIES", "GAGAR_TEST_KEPT"):
        assert child[k] == want[k], k
    assert child["PATH"].endswith(want["PATH"])  # git puts its exec path in front
    assert child["HOME"] == "/nonexistent" and child["EDITOR"] == ":" and "GIT_SSH_COMMAND" not in child


def _reference_diff(pristine: Path, tree: Path, tmp: Path) -> str:
    """What `git add -A` + `git diff --cached --binary` print for `tree` (a benign tree the test wrote)."""
    ref = tmp / "ref"
    shutil.copytree(pristine, ref, symlinks=True)
    for p in list(ref.iterdir()):
        if p.name != ".git":
            shutil.rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink()
    for p in tree.iterdir():
        if p.name != ".git":
            (shutil.copytree(p, ref / p.name, symlinks=True) if p.is_dir() and not p.is_symlink()
             else shutil.copy2(p, ref / p.name, follow_symlinks=False))
    sh(ref, "add", "-A", "--", ".", ":(exclude,glob)**/__pycache__/**", ":(exclude,glob)**/*.pyc")
    return sh(ref, "diff", "--cached", "--binary", "--no-color")


def _benign_repo(tmp_path: Path) -> tuple[Path, str]:
    src = tmp_path / "src"
    (src / "pkg" / "deep").mkdir(parents=True)
    (src / "a.py").write_text("x = 1\n")
    (src / "pkg" / "b.py").write_text("y = 1\n")
    (src / "pkg" / "deep" / "c.txt").write_text("c\n")
    (src / ".gitignore").write_text("build/\n*.log\n")
    (src / "pkg" / ".gitignore").write_text("*.tmp\n!keep.tmp\n")
    (src / "run.sh").write_text("#!/bin/sh\n")
    os.chmod(src / "run.sh", 0o755)
    (src / "gone.txt").write_text("bye\n")
    os.symlink("a.py", src / "link")
    (src / "blob.bin").write_bytes(bytes(range(256)))
    sh(src, "init", "-q")
    sh(src, "add", "-A")
    sh(src, "commit", "-qm", "base")
    return src, sh(src, "rev-parse", "HEAD").strip()


def test_tree_diff_matches_git_on_a_benign_tree(tmp_path: Path) -> None:
    src, base = _benign_repo(tmp_path)
    pristine = tmp_path / "pristine"
    gitsafe.export_commit(src, base, pristine)
    tree = tmp_path / "tree"
    shutil.copytree(pristine, tree, symlinks=True)
    assert tree_diff(tree, pristine / ".git", base) == ""
    (tree / "a.py").write_text("x = 2\n")
    os.chmod(tree / "a.py", 0o755)
    (tree / "gone.txt").unlink()
    (tree / "new dir").mkdir()
    (tree / "new dir" / "n.py").write_text("n\n")
    (tree / "build").mkdir()
    (tree / "build" / "out.o").write_text("ignored\n")
    (tree / "x.log").write_text("ignored\n")
    (tree / "pkg" / "scratch.tmp").write_text("ignored\n")
    (tree / "pkg" / "keep.tmp").write_text("kept by a negation\n")
    (tree / "pkg" / "__pycache__").mkdir()
    (tree / "pkg" / "__pycache__" / "b.cpython-311.pyc").write_bytes(b"\0\1")
    (tree / "link").unlink()
    os.symlink("pkg/b.py", tree / "link")
    (tree / "blob.bin").write_bytes(bytes(range(255, -1, -1)))
    (tree / "pkg" / "deep" / "c.txt").unlink()
    (tree / "pkg" / "deep").rmdir()
    got = tree_diff(tree, pristine / ".git", base)
    assert got == _reference_diff(pristine, tree, tmp_path)
    for needle in ("+x = 2", "new mode 100755", "deleted file mode 100644", "b/new dir/n.py", "pkg/keep.tmp",
                   "GIT binary patch", "+pkg/b.py"):
        assert needle in got, needle
    for absent in ("out.o", "x.log", "scratch.tmp", "__pycache__"):
        assert absent not in got, absent
    # The answer applies to a fresh copy of the base (as the evaluation will apply it).
    fresh = tmp_path / "fresh"
    gitsafe.export_commit(src, base, fresh)
    subprocess.run(["git", "apply", "-"], cwd=fresh, input=got.encode(), check=True, env=ENV)


def test_tree_diff_never_runs_what_the_tree_plants(tmp_path: Path) -> None:
    """Filters, fsmonitor, hooks, pager, external diff, textconv, includes, a `gitdir:` redirect and a nested
    repo, all planted in the tree's own `.git` and `.gitattributes`: the diff runs none of them, yet plain git
    in the same tree runs them (the control)."""
    src, base = _benign_repo(tmp_path)
    pristine = tmp_path / "pristine"
    gitsafe.export_commit(src, base, pristine)
    tree = tmp_path / "tree"
    shutil.copytree(pristine, tree, symlinks=True)
    m = tmp_path / "markers"
    m.mkdir()
    gd = tree / ".git"
    (gd / "evil.inc").write_text(f"[core]\n\tfsmonitor = touch {m}/include; true\n")
    with open(gd / "config", "a") as fh:
        fh.write(f'[filter "evil"]\n\tclean = touch {m}/filter; cat\n\tsmudge = touch {m}/filter; cat\n'
                 f'[diff "evil"]\n\ttextconv = touch {m}/textconv; cat\n'
                 f"[core]\n\tpager = touch {m}/pager; cat\n[diff]\n\texternal = touch {m}/extdiff; true\n"
                 "[include]\n\tpath = evil.inc\n")
    for hook in ("pre-commit", "post-checkout", "post-index-change", "reference-transaction"):
        (gd / "hooks").mkdir(exist_ok=True)
        (gd / "hooks" / hook).write_text(f"#!/bin/sh\ntouch {m}/hook-{hook}\n")
        os.chmod(gd / "hooks" / hook, 0o755)
    (tree / ".gitattributes").write_text("* filter=evil diff=evil\n")
    (tree / "a.py").write_text("x = 3\n")
    nested = tree / "sub"
    (nested / ".git").mkdir(parents=True)
    (nested / ".git" / "config").write_text(f"[core]\n\tfsmonitor = touch {m}/nested; true\n")
    (nested / "f.txt").write_text("f\n")
    os.mkfifo(tree / "pipe")  # a reader that opens it blocking would hang
    got = tree_diff(tree, pristine / ".git", base)
    assert list(m.iterdir()) == []
    assert "+x = 3" in got and "b/.gitattributes" in got and "b/sub/f.txt" in got and "pipe" not in got
    assert ".git/" not in got.replace("diff --git", "")
    # Control: plain host git in the same tree runs what was planted.
    os.unlink(tree / "pipe")
    subprocess.run(["git", "-c", "safe.directory=*", "add", "-A"], cwd=tree, capture_output=True)
    subprocess.run(["git", "diff", "HEAD"], cwd=tree, capture_output=True)
    subprocess.run(["git", "commit", "-qm", "x"], cwd=tree, capture_output=True, env=ENV)
    fired = {p.name for p in m.iterdir()}
    assert {"filter", "include", "extdiff", "hook-pre-commit"} <= fired, fired


def test_tree_diff_gitdir_redirect_and_symlinks(tmp_path: Path) -> None:
    """A `.git` file redirecting to a planted git dir, a `.gitignore` symlinked to a host file, and a link to a
    host secret: the diff reads none of them (a link is its target's name, never its content)."""
    src, base = _benign_repo(tmp_path)
    pristine = tmp_path / "pristine"
    gitsafe.export_commit(src, base, pristine)
    tree = tmp_path / "tree"
    shutil.copytree(pristine, tree, symlinks=True)
    secret = tmp_path / "SECRET.txt"
    secret.write_text("s3cr3t-host-text\n")
    shutil.rmtree(tree / ".git")
    (tree / ".evil").mkdir()
    (tree / ".git").write_text("gitdir: .evil\n")
    (tree / ".gitignore").unlink()
    os.symlink(secret, tree / ".gitignore")
    os.symlink(secret, tree / "leak")
    got = tree_diff(tree, pristine / ".git", base)
    assert "s3cr3t-host-text" not in got and f"+{secret}" in got


def test_tree_diff_limits(tmp_path: Path) -> None:
    src, base = _benign_repo(tmp_path)
    pristine = tmp_path / "pristine"
    gitsafe.export_commit(src, base, pristine)
    tree = tmp_path / "tree"
    shutil.copytree(pristine, tree, symlinks=True)
    (tree / "big.bin").write_bytes(b"x" * 5000)
    with pytest.raises(TreeDiffError, match="cap"):
        tree_diff(tree, pristine / ".git", base, limits=Limits(max_file_bytes=4096))
    (tree / "big.bin").unlink()
    deep = tree
    for _ in range(6):
        deep = deep / "d"
    deep.mkdir(parents=True)
    (deep / "f").write_text("f\n")
    with pytest.raises(TreeDiffError, match="deeper"):
        tree_diff(tree, pristine / ".git", base, limits=Limits(max_depth=4))
    with pytest.raises(TreeDiffError, match="entries"):
        tree_diff(tree, pristine / ".git", base, limits=Limits(max_entries=5))


def test_agent_answer_past_the_limits_is_empty_with_a_reason(tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """A tree the diff cannot read within its caps gives no answer (a failed rollout), not a crash of the
    episode batch; the reason reaches the trajectory's events through `diff_error`."""
    from sandbox.integrity import treediff
    from trainer.agent.tools import AgentTools

    src, base = _benign_repo(tmp_path)
    pristine = tmp_path / "pristine"
    gitsafe.export_commit(src, base, pristine)
    tree = tmp_path / "tree"
    shutil.copytree(pristine, tree, symlinks=True)
    tools = AgentTools(tree, container=None, test_cmd="true", pristine_git_dir=pristine / ".git", base_commit=base)
    (tree / "a.py").write_text("x = 5\n")
    assert "+x = 5" in tools.diff() and tools.diff_error is None
    (tree / "huge.bin").write_bytes(b"\0" * 4097)
    monkeypatch.setattr("trainer.agent.tools.tree_diff",
                        functools.partial(treediff.tree_diff, limits=Limits(max_file_bytes=4096)))
    assert tools.diff() == ""
    assert "huge.bin" in (tools.diff_error or "")


def test_untrusted_trees_are_refused(tmp_path: Path) -> None:
    """The guard the agent scaffold holds around each agent's tree: any host git aimed at it (git dir, work
    tree or cwd, at or below the root) is refused, while the diff against the pristine git dir still works."""
    src, base = _benign_repo(tmp_path)
    pristine = tmp_path / "pristine"
    gitsafe.export_commit(src, base, pristine)
    tree = tmp_path / "tree"
    shutil.copytree(pristine, tree, symlinks=True)
    (tree / "a.py").write_text("x = 9\n")
    with gitsafe.untrusted(tree):
        for kw in ({"cwd": tree}, {"git_dir": tree / ".git"}, {"git_dir": pristine / ".git", "work_tree": tree},
                   {"cwd": tree / "pkg"}):
            with pytest.raises(gitsafe.UntrustedTree):
                gitsafe.run("status", **kw)
        assert "+x = 9" in tree_diff(tree, pristine / ".git", base)
    assert gitsafe.run("status", cwd=tree).ok  # released with the context
