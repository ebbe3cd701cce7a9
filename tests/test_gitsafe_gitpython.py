"""Issue 41, item 4: the one hardened git helper (`sandbox.integrity.gitsafe`) built on GitPython's `git.Git`
command object. What GitPython does for it (stdin, exact bytes out, the timeout that kills git's children, the
stdout stream of `stream()`, the working directory taken as is), the file-size cap in front of it, and the rule
that nothing else in the product runs git: no second wrapper, no GitPython outside gitsafe, no `git.Repo`.
The attack tests (hooks, filters, fsmonitor, hostile config, inherited GIT_* variables, redirected `.git`) are
tests/test_gitsafe.py, tests/test_sandbox_apply.py and the Docker ones in tests/test_hardening_agent_git.py."""

from __future__ import annotations

import ast
import io
import os
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

from sandbox.integrity import gitsafe

ROOT = Path(__file__).resolve().parents[1]
ENV = {"PATH": os.environ["PATH"], "HOME": "/nonexistent", "GIT_CONFIG_NOSYSTEM": "1",
       "GIT_CONFIG_GLOBAL": os.devnull, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t.invalid",
       "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t.invalid"}
# Every product package, the benchmarks, scripts and example scripts (not the task repositories they ship).
SCANNED = ("gagar", "sandbox", "grader", "inference", "sft", "synth", "trainer", "hardening", "bench", "scripts")


def _repo(root: Path, files: dict[str, bytes]) -> tuple[Path, str]:
    root.mkdir(parents=True)
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "base"]):
        subprocess.run(["git", *args], cwd=root, env=ENV, check=True, capture_output=True)
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, env=ENV, check=True, capture_output=True, text=True)
    return root, head.stdout.strip()


def test_stdin_in_and_exact_bytes_out(tmp_path: Path) -> None:
    """`input` reaches git's stdin; `binary` output is git's bytes untouched (trailing newlines included: GitPython
    strips one unless told not to, which would corrupt a diff or a blob)."""
    data = b"\x00\xffbinary\n\n"
    repo, _ = _repo(tmp_path / "r", {"blob.bin": data, "t.txt": b"line\n\n"})
    sha = gitsafe.git("hash-object", "-w", "--stdin", cwd=repo, input=data).strip()
    assert gitsafe.git("cat-file", "blob", sha, cwd=repo, binary=True) == data
    assert gitsafe.git("cat-file", "blob", "HEAD:t.txt", cwd=repo) == "line\n\n"
    text = "é unicode\n"
    sha = gitsafe.git("hash-object", "--stdin", cwd=repo, input=text).strip()
    assert sha == subprocess.run(["git", "hash-object", "--stdin"], cwd=repo, env=ENV, input=text,
                                 capture_output=True, text=True).stdout.strip()
    res = gitsafe.run("cat-file", "-e", "0" * 40, cwd=repo)
    assert not res.ok and res.rc != 0


def test_timeout_kills_git_and_what_it_started(tmp_path: Path) -> None:
    """Past the timeout the call returns rc 124 at once, and the program git started is killed too (a plain
    `subprocess.run` timeout kills git alone and leaves its children running)."""
    repo, _ = _repo(tmp_path / "r", {"f": b"x\n"})
    marker = tmp_path / "still-running"
    t0 = time.monotonic()
    res = gitsafe.run("-c", f"alias.slow=!sleep 3; touch {marker}", "slow", cwd=repo, timeout=1)
    assert res.rc == 124 and "timed out after 1s" in res.err
    assert time.monotonic() - t0 < 2.9
    time.sleep(3.5)
    assert not marker.exists()


def test_stream_reads_while_git_runs_and_reports_failure(tmp_path: Path) -> None:
    repo, base = _repo(tmp_path / "r", {"a.py": b"x = 1\n", "pkg/b.txt": b"b\n"})
    with gitsafe.stream("archive", "--format=tar", base, git_dir=repo / ".git", trusted_dir=repo) as out:
        names = tarfile.open(fileobj=io.BytesIO(out.read())).getnames()
    assert {"a.py", "pkg/b.txt"} <= set(names)
    with pytest.raises(gitsafe.GitError, match="not a tree object"):
        with gitsafe.stream("archive", "--format=tar", "0" * 40, git_dir=repo / ".git") as out:
            out.read()
    # The caller's own error wins over git's (git dies of SIGPIPE when the reader gives up).
    with pytest.raises(KeyError):
        with gitsafe.stream("archive", "--format=tar", base, git_dir=repo / ".git"):
            raise KeyError("mine")
    with gitsafe.untrusted(repo), pytest.raises(gitsafe.UntrustedTree):
        with gitsafe.stream("archive", base, git_dir=repo / ".git"):
            pass


def test_a_dollar_or_tilde_in_the_path_is_taken_literally(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """GitPython expands `$VAR` and `~` in a working directory given as a string; gitsafe passes a Path."""
    monkeypatch.setenv("GAGAR_ELSEWHERE", str(tmp_path / "other"))
    _repo(tmp_path / "other", {"other.txt": b"o\n"})
    repo, _ = _repo(tmp_path / "$GAGAR_ELSEWHERE", {"mine.txt": b"m\n"})
    assert gitsafe.git("ls-files", cwd=str(repo)).split() == ["mine.txt"]
    assert gitsafe.git("ls-files", git_dir=str(repo / ".git"), work_tree=str(repo)).split() == ["mine.txt"]


@pytest.mark.skipif(gitsafe.PRLIMIT is None, reason="prlimit (util-linux) is not installed")
def test_max_file_bytes_caps_what_git_writes(tmp_path: Path) -> None:
    repo, _ = _repo(tmp_path / "r", {"f": b"x\n"})
    big = os.urandom(2 << 20)  # incompressible: the loose object is as large
    capped = gitsafe.run("hash-object", "-w", "--stdin", cwd=repo, input=big, max_file_bytes=1 << 20)
    assert not capped.ok
    assert gitsafe.run("hash-object", "-w", "--stdin", cwd=repo, input=big).ok


def test_importing_works_without_git_and_a_call_says_what_is_missing(tmp_path: Path) -> None:
    """GitPython's import fails where git is not installed; gagar's git-free commands import gitsafe all the
    same (it imports GitPython on first use), and a git call then raises GitError naming the problem."""
    code = ("import sandbox.integrity.gitsafe as g\n"
            "try:\n    g.run('status')\nexcept g.GitError as e:\n    print('GitError:', e)\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                          env={"PATH": str(tmp_path), "PYTHONPATH": str(ROOT)}, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("GitError: git is not usable on this host")


def test_gitpython_runs_nothing_a_hostile_working_directory_plants(tmp_path: Path) -> None:
    """GitPython's import runs `git version` in the process's working directory, with the process's
    environment. Started inside a repository whose `.git/config` names fsmonitor, pager, hooks and an include
    (and with GIT_DIR, GIT_CONFIG_PARAMETERS and GIT_EXTERNAL_DIFF in the environment it was started with),
    gagar's git calls run none of them; plain git in the same place runs them (the controls)."""
    m = tmp_path / "markers"
    m.mkdir()
    hostile, _ = _repo(tmp_path / "hostile", {"f": b"x\n"})
    (hostile / ".git" / "evil.inc").write_text(f"[core]\n\tpager = touch {m}/include; cat\n")
    with open(hostile / ".git" / "config", "a") as fh:
        fh.write(f"[core]\n\tfsmonitor = touch {m}/fsmonitor; true\n\tpager = touch {m}/pager; cat\n"
                 "[include]\n\tpath = evil.inc\n")
    (hostile / ".git" / "hooks" / "post-checkout").write_text(f"#!/bin/sh\ntouch {m}/hook\n")
    os.chmod(hostile / ".git" / "hooks" / "post-checkout", 0o755)
    (hostile / "f").write_text("changed\n")
    trusted, base = _repo(tmp_path / "trusted", {"t": b"t\n"})
    (trusted / "t").write_text("changed\n")
    env = {**ENV, "PYTHONPATH": str(ROOT), "GIT_DIR": str(hostile / ".git"),
           "GIT_CONFIG_PARAMETERS": f"'core.fsmonitor'='touch {m}/params; true'",
           "GIT_EXTERNAL_DIFF": f"touch {m}/extdiff; true"}
    code = ("from sandbox.integrity import gitsafe\n"
            f"gd, wt = {str(trusted / '.git')!r}, {str(trusted)!r}\n"
            "gitsafe.run('diff', git_dir=gd, work_tree=wt)\n"  # GIT_EXTERNAL_DIFF would win over diff.external
            "print(gitsafe.git('rev-parse', 'HEAD', git_dir=gd).strip())\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=hostile, env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == base
    assert list(m.iterdir()) == []
    # The controls: plain git there runs what the environment names, and without it what the config names.
    subprocess.run(["git", "status"], cwd=hostile, env=env, capture_output=True)
    assert {p.name for p in m.iterdir()} == {"params"}
    subprocess.run(["git", "status"], cwd=hostile, env={**env, "GIT_CONFIG_PARAMETERS": ""}, capture_output=True)
    assert "fsmonitor" in {p.name for p in m.iterdir()}


def _product_files() -> list[Path]:
    files = [p for d in SCANNED for p in (ROOT / d).rglob("*.py") if "__pycache__" not in p.parts]
    return files + sorted((ROOT / "examples").glob("*.py"))


def _violations(path: Path) -> list[str]:
    """GitPython imported, or git started by a subprocess call with an argv literal, outside gitsafe."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import) and any(a.name == "git" or a.name.startswith("git.") for a in node.names):
            found.append(f"{node.lineno}: import git")
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "git":
            found.append(f"{node.lineno}: from {node.module} import")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.args \
                and isinstance(node.func.value, ast.Name) and node.func.value.id == "subprocess":
            argv = node.args[0]
            if isinstance(argv, (ast.List, ast.Tuple)) and argv.elts and isinstance(argv.elts[0], ast.Constant) \
                    and str(argv.elts[0].value).rsplit("/", 1)[-1] == "git":
                found.append(f"{node.lineno}: subprocess.{node.func.attr}(['git', ...])")
    return found


def test_gitsafe_is_the_only_way_the_product_runs_git() -> None:
    files = _product_files()
    assert len(files) > 100
    bad = {str(p.relative_to(ROOT)): v for p in files if p.name != "gitsafe.py" and (v := _violations(p))}
    assert bad == {}


def test_the_scan_above_sees_a_second_wrapper(tmp_path: Path) -> None:
    p = tmp_path / "m.py"
    p.write_text("import subprocess\nimport git\nfrom git.repo import Repo\n"
                 "subprocess.run(['git', 'status'])\nsubprocess.Popen(('/usr/bin/git', 'log'))\n"
                 "subprocess.run(['bash', '-c', 'git status'])\n")
    assert [v.split(":")[0] for v in _violations(p)] == ["2", "3", "4", "5"]
