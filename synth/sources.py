"""Where tasks come from: a PyPI sdist or a local git repository, made into the task repository.

An sdist `NAME==VERSION` is fetched as a file from pip's configured package index (`synth.index`: its sha256
checked against the index's, and the pin when there is one, while it downloads; never built, so none of the
project's code runs on the host), unpacked, and committed as the only commit of a fresh repository, with a fixed author,
committer and date, so the base commit is the same on every machine. Its repository is named `pypi/<name>`
(PEP 503 normalised name) and lives at `<out>/repos/pypi__<name>`. A local repository keeps its commit (HEAD, or
`rev`): only that commit is copied (`sandbox.integrity.gitsafe.export_commit`); it is named `<owner>/<name>` when
its directory is called `<owner>__<name>`, else `local/<dir name>`.

Each task's broken tree is a commit on top of the base, on a branch of its own named by its instance id
(`TASK_REFS`, as SWE-smith keeps one branch per task: a plain `git clone` brings every task and can check out
its `base_commit`, and `git gc` keeps them), written by one `git fast-import` per batch; its diffs come from one
`git diff-tree --stdin`. Every consumer of the repository
(`gagar eval`, the grader, the agent) copies only the task's own commit (depth 1), so the parent — the fixed
code — never reaches a policy. All git runs through `sandbox.integrity.gitsafe` on repositories gagar made.
"""

from __future__ import annotations

import re
import shutil
import tarfile
import tempfile
import zipfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from sandbox.integrity import gitsafe
from sandbox.report import file_sha256

SDIST = re.compile(r"^([A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?)==([A-Za-z0-9][A-Za-z0-9.+!_-]*)$")
FIXED_TIME = "1705320000 +0000"  # 2024-01-15T12:00:00Z, as the bundled tasks
IDENTITY = {"GIT_AUTHOR_NAME": "Gagar Synth", "GIT_AUTHOR_EMAIL": "synth@gagar.invalid",
            "GIT_COMMITTER_NAME": "Gagar Synth", "GIT_COMMITTER_EMAIL": "synth@gagar.invalid",
            "GIT_AUTHOR_DATE": f"@{FIXED_TIME}", "GIT_COMMITTER_DATE": f"@{FIXED_TIME}"}
TASK_REFS = "refs/heads/"  # each task's commit: branch `<instance id>` (the clean base is `main`)
SAFE_PATH = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_./+-]*$")
NOT_LIBRARY = re.compile(r"(^|/)(tests?|testing|docs?|examples?|benchmarks?|bench|scripts?|tools|\.[^/]*)/"
                         r"|(^|/)(test_[^/]*|[^/]*_tests?|conftest|setup|noxfile|fabfile|tasks|_version|version)\.py$")
TEST_FILE = re.compile(r"(^|/)(test_[^/]*|[^/]*_test)\.py$")


class SourceError(Exception):
    """A project that cannot give tasks (no such sdist, no tests, a hash mismatch); the run goes on without it."""


@dataclass
class Source:
    """One project to synthesise from: `sdist` (`NAME==VERSION`) or `path` (a local git repository), and how
    to run its tests. A line of a sources file, and of the manifest a run writes."""

    sdist: str | None = None
    path: str | None = None
    rev: str = "HEAD"
    sha256: str | None = None  # the sdist's, pinned: a different download is refused
    repo: str | None = None  # owner/name (default: pypi/<name>, or from the directory name)
    version: str | None = None  # SWE-bench's version: the sdist's; a local repo's default is its short commit
    tests: list[str] = field(default_factory=list)  # paths the baseline runs (default: what pytest finds)
    pytest_args: list[str] = field(default_factory=list)  # extra pytest arguments for every run
    env: dict[str, Any] | None = None  # the environment spec (else --env-specs, else a default)
    split: str | None = None  # force `train` or `heldout`

    @classmethod
    def from_dict(cls, d: Any, where: str) -> Source:
        if isinstance(d, str):
            d = {"path": d} if "==" not in d else {"sdist": d}
        if not isinstance(d, dict):
            raise ValueError(f"{where}: a source is an object with `sdist` or `path`, got {type(d).__name__}")
        known = set(cls.__dataclass_fields__)
        unknown = sorted(set(d) - known - {"base_commit", "status", "reason", "stats", "sdist_file"})
        if unknown:
            raise ValueError(f"{where}: unknown key(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
        src = cls(**{k: v for k, v in d.items() if k in known})
        if bool(src.sdist) == bool(src.path):
            raise ValueError(f"{where}: give exactly one of `sdist` (NAME==VERSION) or `path` (a git repository)")
        if src.sdist and not SDIST.match(src.sdist):
            raise ValueError(f"{where}: sdist {src.sdist!r} is not NAME==VERSION (e.g. toolz==1.0.0)")
        if src.repo is not None and not re.fullmatch(r"[\w.-]+/[\w.-]+", src.repo):
            raise ValueError(f"{where}: repo {src.repo!r} is not owner/name")
        if src.env is not None:
            from sandbox.env.spec import EnvSpec, SpecError

            try:
                EnvSpec.from_dict(src.env, f"{where}: env")
            except SpecError as exc:
                raise ValueError(str(exc)) from exc
        if src.split not in (None, "train", "heldout"):
            raise ValueError(f"{where}: split must be `train` or `heldout`, got {src.split!r}")
        for key in ("tests", "pytest_args"):
            v = getattr(src, key)
            if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
                raise ValueError(f"{where}: `{key}` must be a list of strings")
        return src

    @property
    def label(self) -> str:
        return self.sdist or str(self.path)

    def repo_name(self) -> str:
        if self.repo:
            return self.repo
        if self.sdist:
            return "pypi/" + re.sub(r"[-_.]+", "-", SDIST.match(self.sdist).group(1)).lower()  # type: ignore[union-attr]
        name = Path(str(self.path)).resolve().name
        if "__" in name:
            owner, _, rest = name.partition("__")
            if owner and rest:
                return f"{owner}/{rest}"
        return f"local/{name}"

    def to_dict(self) -> dict[str, Any]:
        """The non-default fields (what a sources file would say)."""
        defaults = Source()
        return {k: v for k, v in asdict(self).items() if v != getattr(defaults, k)}


@dataclass
class Prepared:
    """A project ready for mutation: its task repository at the base commit, and its files."""

    source: Source
    repo: str
    clone: Path
    base_commit: str
    version: str
    sha256: str | None
    sources: dict[str, str]  # library .py files (repo-relative path → text): where bugs go
    modes: dict[str, str]
    test_files: list[str]
    files: list[str]  # every tracked path at the base commit


def git(repo: Path, *args: str, input: str | bytes | None = None, binary: bool = False) -> str | bytes:
    res = gitsafe.run(*args, cwd=repo, env=IDENTITY, input=input, binary=binary)
    if not res.ok:
        raise SourceError(f"git {' '.join(a for a in args[:2])} failed in {repo}: {res.err[-400:]}")
    return res.out


def download_sdist(spec: str, dest: Path, pinned: str | None = None) -> tuple[Path, str]:
    """The sdist archive of `NAME==VERSION` in `dest`: fetched as a file from pip's configured package index,
    its sha256 checked while it downloads (against the index's and the pin), never built or run
    (`synth.index`). A file already in `dest` with the expected hash is reused."""
    from synth.index import FetchError, download, find_sdist, pip_config

    name, version = SDIST.match(spec).groups()  # type: ignore[union-attr]
    try:
        cfg = pip_config()
        found = find_sdist(name, version, cfg, pinned)
        want = pinned or found.sha256
        have = dest / Path(found.filename).name
        if want and have.is_file() and file_sha256(have) == want.lower():
            return have, want.lower()
        return download(found, dest, cfg, pinned)
    except FetchError as exc:
        raise SourceError(str(exc)) from exc


def unpack(archive: Path, dest: Path) -> None:
    """Unpack an sdist into `dest`, without its single top-level directory; unsafe members are refused."""
    with tempfile.TemporaryDirectory(prefix="gagar-unpack-") as tmp:
        root = Path(tmp)
        try:
            if archive.name.endswith(".zip"):
                with zipfile.ZipFile(archive) as zf:
                    for info in zf.infolist():
                        p = Path(info.filename)
                        if p.is_absolute() or ".." in p.parts:
                            raise SourceError(f"{archive.name}: unsafe member {info.filename!r}")
                    zf.extractall(root)
            else:
                with tarfile.open(archive) as tf:
                    tf.extractall(root, filter="data")
        except (tarfile.TarError, zipfile.BadZipFile, OSError) as exc:
            raise SourceError(f"cannot unpack {archive.name}: {exc}") from exc
        tops = list(root.iterdir())
        top = tops[0] if len(tops) == 1 and tops[0].is_dir() else root
        dest.mkdir(parents=True, exist_ok=True)
        for p in top.iterdir():
            shutil.move(str(p), dest / p.name)


def _commit_tree(tree: Path, message: str) -> str:
    git(tree, "init", "-q", "-b", "main", "--template=")
    git(tree, "add", "-A", "-f")
    git(tree, "commit", "-q", "--no-verify", "-m", message)
    return str(git(tree, "rev-parse", "HEAD")).strip()


def prepare(source: Source, out: Path, state: dict[str, Any]) -> Prepared:
    """Make (or reuse) the task repository of `source` under `out/repos`; `state` is what the last run recorded
    for it (its base commit), so a re-run keeps the repository and its task commits."""
    repo = source.repo_name()
    clone = out / "repos" / repo.replace("/", "__")
    sha256 = None
    if source.sdist:
        archive, sha256 = download_sdist(source.sdist, out / "sdists", source.sha256 or state.get("sha256"))
        version = source.version or SDIST.match(source.sdist).group(2)  # type: ignore[union-attr]
        base = state.get("base_commit")
        if not (base and state.get("sha256") == sha256 and _has_commit(clone, base)):
            shutil.rmtree(clone, ignore_errors=True)
            with tempfile.TemporaryDirectory(prefix="gagar-sdist-tree-", dir=out) as tmp:
                tree = Path(tmp) / "tree"
                unpack(archive, tree)
                base = _commit_tree(tree, f"{repo} {version}, unpacked from {archive.name}")
                clone.parent.mkdir(parents=True, exist_ok=True)
                shutil.move(str(tree), clone)
    else:
        path = Path(str(source.path))
        try:
            base = gitsafe.resolve_commit(path, source.rev)
        except gitsafe.GitError as exc:
            raise SourceError(f"{path}: not a git repository with commit {source.rev} ({exc})") from exc
        version = source.version or base[:12]
        if not _has_commit(clone, base):
            shutil.rmtree(clone, ignore_errors=True)
            try:
                gitsafe.export_commit(path, base, clone)
            except gitsafe.GitError as exc:
                raise SourceError(f"cannot copy {path} at {base[:12]}: {exc}") from exc
    modes, texts = _library_files(clone, base)
    files = _tracked(clone, base)
    tests = test_files(files, source.tests)
    if not texts:
        raise SourceError("it has no Python source files outside its tests")
    return Prepared(source, repo, clone, base, version, sha256, texts, modes, tests, files)


def test_files(files: list[str], given: list[str]) -> list[str]:
    """The test files pytest would collect: under each given path (`--tests`, a source's `tests`), the files it
    names itself and the `test_*.py` / `*_test.py` files below it; with none given, those anywhere. A project
    whose tests are named otherwise (unittest's `test*.py`: pytimeparse's `tests/testtimeparse.py`) is told
    which files look like tests and how to name them; SourceError when there are none."""
    roots = [g.split("::", 1)[0].strip("/") for g in given]
    if not roots:
        found = [p for p in files if TEST_FILE.search(p)]
    else:
        found = [p for p in files if p.endswith(".py") and any(
            p == r or ((r in ("", ".") or p.startswith(r + "/")) and TEST_FILE.search(p)) for r in roots)]
    if found:
        return found
    named = [p for p in files if re.search(r"(^|/)test[^/]*\.py$", p) and not p.endswith("__init__.py")]
    if roots:
        there = [p for p in named if any(r in ("", ".") or p.startswith(r + "/") for r in roots)]
        hint = f"; test files there: {', '.join(there[:3])} — name the files themselves" if there else ""
        raise SourceError(f"no test file under the given test paths {', '.join(given)} (pytest collects "
                          f"test_*.py or *_test.py files in a directory, and any .py file named directly{hint})")
    if named:
        raise SourceError(f"its tests are not named as pytest finds them (test_*.py or *_test.py): "
                          f"{', '.join(named[:3])}{' …' if len(named) > 3 else ''}; name them with --tests (a "
                          "source's `tests`)")
    raise SourceError("it ships no tests (no test_*.py or *_test.py file)")


def _has_commit(clone: Path, sha: str) -> bool:
    if not (clone / ".git").is_dir():
        return False
    return gitsafe.run("cat-file", "-e", f"{sha}^{{commit}}", cwd=clone).ok


def _tracked(clone: Path, commit: str) -> list[str]:
    out = str(git(clone, "ls-tree", "-r", "--name-only", "-z", commit))
    return [p for p in out.split("\0") if p]


def _library_files(clone: Path, commit: str) -> tuple[dict[str, str], dict[str, str]]:
    """(path → mode, path → text) of the .py files bugs may go into: not tests, docs, examples or set-up."""
    listing = str(git(clone, "ls-tree", "-r", "-z", commit))
    blobs = {}
    for entry in listing.split("\0"):
        if not entry:
            continue
        meta, path = entry.split("\t", 1)
        mode, kind, sha = meta.split()
        if kind == "blob" and mode in ("100644", "100755") and path.endswith(".py") and SAFE_PATH.match(path) \
                and not NOT_LIBRARY.search(path):
            blobs[path] = (mode, sha)
    if not blobs:
        return {}, {}
    data = git(clone, "cat-file", "--batch", input="".join(f"{sha}\n" for _, sha in blobs.values()), binary=True)
    texts: dict[str, str] = {}
    pos = 0
    for path in blobs:
        nl = data.index(b"\n", pos)  # type: ignore[union-attr]
        size = int(data[pos:nl].split()[2])
        body = data[nl + 1:nl + 1 + size]
        pos = nl + 1 + size + 1
        try:
            texts[path] = body.decode("utf-8")  # type: ignore[union-attr]
        except UnicodeDecodeError:
            continue
    return {p: blobs[p][0] for p in texts}, texts


def write_commits(prepared: Prepared, changes: dict[str, tuple[str, str]], ref_prefix: str) -> dict[str, str]:
    """One commit per entry `{name: (path, new text)}` on top of the base commit, as `ref_prefix + name`
    (one `git fast-import` for all of them; fixed identity and date, so the same change is the same sha).
    Returns `{name: sha}`."""
    if not changes:
        return {}
    stream = bytearray()
    for name, (path, text) in changes.items():
        body = text.encode("utf-8")
        msg = f"{prepared.repo} {prepared.version}\n".encode()
        stream += (f"commit {ref_prefix}{name}\nauthor {IDENTITY['GIT_AUTHOR_NAME']} <{IDENTITY['GIT_AUTHOR_EMAIL']}> "
                   f"{FIXED_TIME}\ncommitter {IDENTITY['GIT_COMMITTER_NAME']} <{IDENTITY['GIT_COMMITTER_EMAIL']}> "
                   f"{FIXED_TIME}\ndata {len(msg)}\n").encode() + msg
        stream += f"from {prepared.base_commit}\nM {prepared.modes[path]} inline {path}\ndata {len(body)}\n".encode()
        stream += body + b"\n"
    git(prepared.clone, "fast-import", "--quiet", "--force", input=bytes(stream))
    out = str(git(prepared.clone, "rev-parse", *[f"{ref_prefix}{name}" for name in changes]))
    return dict(zip(changes, out.split(), strict=True))


def diffs(prepared: Prepared, commits: dict[str, str], *, reverse: bool = False) -> dict[str, str]:
    """`{name: git diff base → commit}`, or with `reverse` commit → base (the fix), from one git process."""
    if not commits:
        return {}
    # A line `<a> <b>` of commits means "a, with parent b": diff-tree echoes `<a>`, then prints b → a.
    # Blocks come in input order.
    pairs = {name: (prepared.base_commit, sha) if reverse else (sha, prepared.base_commit)
             for name, sha in commits.items()}
    out = str(git(prepared.clone, "diff-tree", "--stdin", "-p", "--no-color", "--no-ext-diff", "--no-textconv",
                  "--no-renames", input="".join(f"{a} {b}\n" for a, b in pairs.values())))
    blocks: list[list[str]] = []
    for line in out.splitlines(keepends=True):
        if re.fullmatch(r"[0-9a-f]{40}\n?", line):
            blocks.append([])
        elif blocks:
            blocks[-1].append(line)
    if len(blocks) != len(pairs):
        raise SourceError(f"git diff-tree gave {len(blocks)} diffs for {len(pairs)} commits in {prepared.clone}")
    return {name: "".join(b).rstrip("\n") + "\n" for name, b in zip(pairs, blocks, strict=True)}


def drop_refs(prepared: Prepared, refs: list[str]) -> None:
    if refs:
        git(prepared.clone, "update-ref", "--stdin", input="".join(f"delete {r}\n" for r in refs))
