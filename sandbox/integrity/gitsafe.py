"""The one way gagar runs git on the host: trusted configuration only, and never a git dir a policy could write.

Why: git runs commands named in its configuration and in the work tree (hooks, `core.fsmonitor`, clean/smudge
filters and textconv drivers named by `.gitattributes`, `core.pager`, `diff.external`, `core.sshCommand`, and
`include.path` pulls in more of them). A policy that can write a repository's `.git` — an agent with a shell in
its container, or tests running there — can plant any of these, and the next host-side git command in that
repository runs them as the host user. So every host git call goes through `run()`/`git()`/`stream()` here:

- the environment is rebuilt: no `GIT_*` variable of gagar's own environment reaches git
  (`GIT_CONFIG_PARAMETERS`, `GIT_EXTERNAL_DIFF`, `GIT_SSH_COMMAND`, `GIT_DIR`, … could inject commands or
  redirect the call), `GIT_CONFIG_NOSYSTEM=1`, `GIT_CONFIG_GLOBAL=/dev/null`, `GIT_ATTR_NOSYSTEM=1`,
  `HOME`/`XDG_CONFIG_HOME` point at `/nonexistent` (Debian's home for daemon users: never created, so no
  per-user file can be read; a temp dir would show up in the hardening suite's leaked-temp-dir check), editors
  are `:` (git's no-op), no askpass, no prompts, no optional locks;
- `-c` options switch off what trusted config could still name: hooks, fsmonitor, pager, external diff,
  global attributes/excludes files, credential helpers, every transport but `file`, automatic gc;
- a repository is named explicitly (`git_dir`, or `cwd` for repos gagar made itself, with discovery fenced by
  `GIT_CEILING_DIRECTORIES`), and `safe.directory` is only ever the one trusted source path, never `*`.

What remains is the repository's own `.git/config`, which git always reads. That is why the rule for callers
is: **never pass a git dir a policy could have written.** Trees a policy wrote are read by
`sandbox.integrity.treediff` (plain file reads, no git in the tree) and diffed against the pristine git dir kept
outside the mounted tree. `export_commit` makes such pristine repositories: the base commit only, no later
history (the "no future" rule: a work tree must not reveal commits after `base_commit`, e.g. the task's fix).

Built on GitPython's `git.Git` command object, and on nothing else of GitPython: one object per call, bound to
the call's directory (given as a `Path`, which GitPython resolves without expanding `$VAR`/`~`), carrying the
hardened variables as its environment (`update_environment`); its `execute` runs the argv built here (the
hardened `-c` options, then the caller's arguments, behind `prlimit` when a file-size cap is asked), feeds
stdin, kills git and its children on timeout and streams stdout for `stream()`. The `-c` options go in that
argv, not in GitPython's persistent git options: those are added only by its subcommand dispatch
(`Git().status(...)`), which takes the executable from a process-wide class attribute (so no `prlimit` in front
of it) and rewrites `_` to `-` in the first argument (callers pass global options such as `-c x=y` or `--bare`
first). Never `git.Repo`: it parses `.git/config` with its own reader and keeps `git cat-file` processes open in
the repository. GitPython starts every git from a copy of `os.environ` and can only add variables to it, never
remove one (gitpython-developers/GitPython#924), so this module keeps the `GIT_*` family (except GitPython's own
`GIT_PYTHON_*` settings, which git never reads) out of gagar's process environment: removed before GitPython is
first imported (its import runs `git version`) and again before every call. Nothing in gagar needs them: all of
its git goes through here.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING

if TYPE_CHECKING:
    import git as gitpython

GIT = shutil.which("git") or "git"
PRLIMIT = shutil.which("prlimit")  # util-linux: caps the size of any file a git command writes
NO_HOME = "/nonexistent"
HARDENED_CONFIG = (
    "core.hooksPath=/dev/null",
    "core.fsmonitor=false",
    "core.untrackedCache=false",
    "core.pager=cat",
    "core.attributesFile=/dev/null",
    "core.excludesFile=/dev/null",
    "core.askPass=",
    "core.sshCommand=false",
    "core.autocrlf=false",
    "core.symlinks=true",
    "diff.external=",  # empty: a diff command without --no-ext-diff fails instead of running anything
    "credential.helper=",
    "protocol.allow=never",
    "protocol.file.allow=always",
    "submodule.recurse=false",
    "gc.auto=0",
    "maintenance.auto=false",
    "advice.detachedHead=false",
    "init.templateDir=",
)
# Every call's environment is gagar's own (less the GIT_* family) with these on top. Programs git (or what it
# starts) would run are neutralised by value, since GitPython cannot unset a variable: `:` is git's no-op
# editor, an empty askpass or less preprocessor is ignored.
BASE_ENV = {
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_CONFIG_GLOBAL": os.devnull,
    "GIT_ATTR_NOSYSTEM": "1",
    "GIT_TERMINAL_PROMPT": "0",
    "GIT_OPTIONAL_LOCKS": "0",
    "GIT_PAGER": "cat",
    "GIT_EDITOR": ":",
    "GIT_SEQUENCE_EDITOR": ":",
    "PAGER": "cat",
    "EDITOR": ":",
    "VISUAL": ":",
    "SSH_ASKPASS": "",
    "LESSOPEN": "",
    "LESSCLOSE": "",
    "HOME": NO_HOME,
    "XDG_CONFIG_HOME": NO_HOME,
    "LANGUAGE": "C",  # GitPython sets these two on every call anyway
    "LC_ALL": "C",
}
_TIMEOUT_RC = 124
_env_lock = threading.Lock()


def _is_git_var(name: str) -> bool:
    """A variable git reads (GitPython's own GIT_PYTHON_* settings are not: git never looks at them)."""
    return name.startswith("GIT_") and not name.startswith("GIT_PYTHON_")


def _inherited_git_vars() -> list[str]:
    return [k for k in list(os.environ) if _is_git_var(k)]


def _scrub_process_env() -> None:
    """Drop the GIT_* family from gagar's own environment (see the module docstring: GitPython copies it)."""
    if _inherited_git_vars():
        with _env_lock:
            for k in _inherited_git_vars():
                os.environ.pop(k, None)


_scrub_process_env()
_gitpython_mod = None


def _gitpython():
    """GitPython, imported on first use: its import runs `git version` (no repository is read), and fails where
    git is not installed, which must not stop gagar's git-free commands from importing this module."""
    global _gitpython_mod
    if _gitpython_mod is None:
        _scrub_process_env()
        try:
            import git as mod
        except ImportError as exc:
            raise GitError(f"git is not usable on this host ({GIT}): {exc}") from exc
        _gitpython_mod = mod
    return _gitpython_mod


class GitError(RuntimeError):
    """A git command failed; the message names the command and git's own words."""


class UntrustedTree(GitError):
    """A host git command was aimed at a tree a policy can write (a bug in the caller, refused)."""


_untrusted: dict[Path, int] = {}
_untrusted_lock = threading.Lock()


@contextlib.contextmanager
def untrusted(tree: Path | str) -> Iterator[Path]:
    """While open, `run()` refuses any git dir, work tree or cwd at or under `tree` (e.g. an agent's work tree,
    writable from its container): a guard against a future host-side git call sneaking back in."""
    root = Path(tree).resolve()
    with _untrusted_lock:
        _untrusted[root] = _untrusted.get(root, 0) + 1
    try:
        yield root
    finally:
        with _untrusted_lock:
            _untrusted[root] -= 1
            if not _untrusted[root]:
                del _untrusted[root]


def _refuse_untrusted(*paths: Path | str | None) -> None:
    with _untrusted_lock:
        roots = list(_untrusted)
    for p in paths:
        if p is None or not roots:
            continue
        rp = Path(p).resolve()
        for root in roots:
            if rp == root or root in rp.parents:
                raise UntrustedTree(f"refusing to run git in {rp}: a policy can write {root} (its .git, hooks and "
                                    "attributes are untrusted); use sandbox.integrity.treediff")


@dataclass
class GitResult:
    rc: int
    out: str | bytes
    err: str

    @property
    def ok(self) -> bool:
        return self.rc == 0

    def text(self) -> str:
        """stdout and stderr together, for logs."""
        out = self.out.decode("utf-8", "replace") if isinstance(self.out, bytes) else self.out
        return (out + ("\n" if out and not out.endswith("\n") else "") + self.err).strip()


def hardened_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment every host git command gets (see the module docstring): gagar's own less the `GIT_*`
    family, `BASE_ENV` on top, then `extra`: GIT_* values the caller sets itself (e.g. a fixed author for
    reproducible commits) and the repository the call names."""
    env = {k: v for k, v in os.environ.items() if not _is_git_var(k)}
    return {**env, **_overlay(extra)}


def _overlay(extra: dict[str, str] | None) -> dict[str, str]:
    return {**BASE_ENV, **(extra or {})}


def _command(git_dir: Path | str | None, work_tree: Path | str | None, cwd: Path | str | None,
             trusted_dir: Path | str | None, env: dict[str, str] | None,
             max_file_bytes: int | None) -> tuple[gitpython.Git, list[str]]:
    """The call's `git.Git` object (bound to its directory, the hardened environment on it) and the argv
    before the caller's arguments. Refuses untrusted trees."""
    _refuse_untrusted(git_dir, work_tree, cwd)
    mod = _gitpython()
    argv = [PRLIMIT, f"--fsize={max_file_bytes}", "--", GIT] if max_file_bytes and PRLIMIT else [GIT]
    for opt in HARDENED_CONFIG:
        argv += ["-c", opt]
    if trusted_dir is not None:
        argv += ["-c", f"safe.directory={Path(trusted_dir).resolve()}"]
    extra = dict(env or {})
    if git_dir is not None:
        extra["GIT_DIR"] = str(Path(git_dir).resolve())
        if work_tree is not None:
            extra["GIT_WORK_TREE"] = str(Path(work_tree).resolve())
        cwd = work_tree if work_tree is not None else (cwd if cwd is not None else git_dir)
    elif cwd is not None:
        extra["GIT_CEILING_DIRECTORIES"] = str(Path(cwd).resolve().parent)
    _scrub_process_env()
    # A Path, not a str: GitPython resolves it as is (a str would have `$VAR` and `~` expanded).
    cmd = mod.Git(Path(cwd).resolve() if cwd is not None else None)
    cmd.update_environment(**_overlay(extra))
    return cmd, argv


def _text(data: str | bytes | None) -> str:
    """GitPython decodes stderr with surrogateescape; our messages must print anywhere."""
    if isinstance(data, str):
        data = data.encode("utf-8", "surrogateescape")
    return (data or b"").decode("utf-8", "replace").strip()


def run(*args: str, git_dir: Path | str | None = None, work_tree: Path | str | None = None,
        cwd: Path | str | None = None, trusted_dir: Path | str | None = None, input: str | bytes | None = None,
        binary: bool = False, env: dict[str, str] | None = None, timeout: float = 600,
        max_file_bytes: int | None = None) -> GitResult:
    """Run `git ARGS` hardened; never raises on a failing git (see `git()` for that).

    `git_dir`/`work_tree` name the repository explicitly (GIT_DIR/GIT_WORK_TREE). Without `git_dir`, `cwd` is
    the repository and discovery stops there (it never climbs into a parent repo). `trusted_dir` is a
    repository gagar did not create but trusts (the user's clone) that may be owned by another user: it is the
    one `safe.directory` allowed. `binary` returns stdout as bytes; `input` is fed to stdin. `max_file_bytes`
    caps the size of any file git writes (`RLIMIT_FSIZE`; git dies of SIGXFSZ past it), where `prlimit` exists.
    Past `timeout` seconds git and its children are killed and the result has rc 124.
    """
    cmd, argv = _command(git_dir, work_tree, cwd, trusted_dir, env, max_file_bytes)
    with contextlib.ExitStack() as stack:
        stdin = None
        if input is not None:
            # GitPython reads stdin from a file: an anonymous temp file (unlinked at once, nothing left behind).
            stdin = stack.enter_context(tempfile.TemporaryFile())
            stdin.write(input.encode("utf-8", "surrogateescape") if isinstance(input, str) else input)
            stdin.seek(0)
        try:
            rc, out, err = cmd.execute([*argv, *args], istream=stdin, with_extended_output=True,
                                       with_exceptions=False, stdout_as_string=False,
                                       strip_newline_in_stdout=False, kill_after_timeout=timeout, shell=False)
        except _gitpython().exc.GitCommandNotFound as exc:
            raise GitError(f"cannot run {argv[0]}: {exc}") from exc
    if rc < 0 and str(err).startswith("Timeout:"):  # GitPython's watchdog killed the process tree
        return GitResult(_TIMEOUT_RC, b"" if binary else "", f"git {' '.join(args[:2])} timed out after {timeout:g}s")
    out = out or b""
    return GitResult(rc, out if binary else out.decode("utf-8", "replace"), _text(err))


@contextlib.contextmanager
def stream(*args: str, git_dir: Path | str | None = None, work_tree: Path | str | None = None,
           cwd: Path | str | None = None, trusted_dir: Path | str | None = None,
           env: dict[str, str] | None = None) -> Iterator[IO[bytes]]:
    """`git ARGS` hardened (as `run()`), its stdout as a stream to read while git runs (e.g. `git archive`
    piped into a container). Raises `GitError` when git fails, once the stream is done with."""
    cmd, argv = _command(git_dir, work_tree, cwd, trusted_dir, env, None)
    try:
        proc = cmd.execute([*argv, *args], as_process=True, shell=False)
    except _gitpython().exc.GitCommandNotFound as exc:
        raise GitError(f"cannot run {argv[0]}: {exc}") from exc
    try:
        yield proc.stdout
    finally:
        proc.stdout.close()
        err = proc.stderr.read()
        try:
            proc.wait(stderr=err)
            ok = True
        except _gitpython().exc.GitCommandError:  # a non-zero exit; its message is rebuilt below
            ok = False
    if not ok:  # only when the caller's block succeeded: its own error is the better one otherwise
        raise GitError(f"git {' '.join(a for a in args[:3] if not a.startswith('-'))} failed: {_text(err)[-500:]}")


def git(*args: str, **kw) -> str:
    """`run(...)` that returns stdout and raises `GitError` when git fails."""
    res = run(*args, **kw)
    if not res.ok:
        raise GitError(f"git {' '.join(a for a in args[:3] if not a.startswith('-'))} failed: {res.err[-500:]}")
    return res.out  # type: ignore[return-value]


def git_dir_of(repo: Path | str) -> Path:
    """The git dir of a trusted repository given by its work tree (`repo/.git`) or as a bare repository."""
    repo = Path(repo)
    return repo / ".git" if (repo / ".git").exists() else repo


def source_git(repo: Path | str, *args: str, **kw) -> str:
    """`git ARGS` in a trusted source repository (the user's clone under --repos-dir, never a tree a policy
    wrote), which may be owned by another user: its path is the one `safe.directory`. Raises `GitError`."""
    return git(*args, git_dir=git_dir_of(repo), trusted_dir=repo, **kw)


def resolve_commit(source: Path | str, rev: str) -> str:
    """The full sha of `rev` in the trusted repository `source`; `GitError` when it has no such commit."""
    source = Path(source)
    res = run("rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}", git_dir=git_dir_of(source),
              trusted_dir=source)
    if not res.ok or not str(res.out).strip():
        raise GitError(f"{source} has no commit {rev}")
    return str(res.out).strip()


def export_commit(source: Path | str, rev: str, dest: Path | str, *, checkout: bool = True) -> str:
    """Make `dest` a fresh repository holding only commit `rev` of the trusted repository `source`.

    A depth-1 fetch of that one commit into an empty `git init` (no templates): the commit keeps its sha (the
    task's `base_commit` still names it, `.git/shallow` lists it), and nothing after it exists in `dest` —
    no later commits, branches, tags, remotes, reflogs or packed objects, not even FETCH_HEAD. With `checkout`
    the work tree is checked out at the commit (detached HEAD). Returns the sha.
    """
    source, dest = Path(source), Path(dest)
    # A full sha goes straight to the fetch (one git call fewer per group); anything else is resolved first.
    sha = rev if re.fullmatch(r"[0-9a-f]{40}", rev) else resolve_commit(source, rev)
    dest.mkdir(parents=True, exist_ok=True)
    git("init", "--quiet", "--template=", str(dest), cwd=dest.parent)
    gd = dest / ".git"
    # unpackLimit=1 keeps the fetched objects as one pack: a rollout's copy of .git is then a dozen files.
    # allowAnySHA1InWant reaches the local upload-pack: a base_commit no branch tip names, on any protocol.
    res = run("-c", "fetch.unpackLimit=1", "-c", "uploadpack.allowAnySHA1InWant=true", "fetch", "--quiet",
              "--no-tags", "--no-write-fetch-head", "--depth=1", str(git_dir_of(source).resolve()), sha,
              git_dir=gd, trusted_dir=source)
    if not res.ok:
        resolve_commit(source, sha)  # raises the clear "has no commit" when that is the reason
        raise GitError(f"cannot fetch {sha} from {source}: {res.err[-500:]}")
    if checkout:
        git("-c", "core.logAllRefUpdates=false", "checkout", "--quiet", "--detach", sha, git_dir=gd,
            work_tree=dest)
    else:
        git("update-ref", "--no-deref", "HEAD", sha, git_dir=gd)
    shutil.rmtree(gd / "logs", ignore_errors=True)
    return sha
