"""`gagar sft history`: gold fixes from the history of real repositories, as SWE-bench instances.

The judge must read diffs of code it has never seen, so its training data has to come from many repositories,
not from a handful of bundled tasks. Every public repository's history is a source of real fixes: a commit that
changes library code *and* tests is, with few exceptions, a fix with its test. Each such commit becomes an
instance: `base_commit` its parent, `patch` its library diff, `test_patch` its test diff, `problem_statement`
its commit message. The judge's data builder (`gagar sft data`) then makes groups of known order around each
gold patch (degraded copies, a partial fix, a special-cased hack); nothing here runs the tests: the order of a
group is known by construction, not by a test verdict.

    gagar sft history --repos-dir CLONES --pins configs/judge_repos.txt --out .gagar/judge/history

`--pins` lists `owner/name commit [split]` lines: the history is read up to that commit, so a rerun on a newer
clone mines the same instances. The clones are read through `sandbox.integrity.gitsafe` (trusted sources only:
the user's clones). OUT gets `instances.jsonl` (each with its `split`, from the pins file) and `repos/` (one
symlink per repository to its clone, the `--repos-dir` of everything downstream).
"""

from __future__ import annotations

import json
import os
import random
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gagar.args import ArgumentParser
from grader.features import is_test_path
from grader.records import InputError, write_jsonl_atomic
from sandbox.integrity import gitsafe

# A fix small enough to be read in one screen and big enough to be cut in two (a partial fix needs two parts).
MIN_LINES, MAX_LINES, MAX_FILES = 2, 40, 2
MAX_MESSAGE_CHARS = 800
_SKIP_SUBJECT = re.compile(r"^(merge|revert|bump|release|prepare|version|update changelog|changelog|typo|docs?\b|"
                           r"style|lint|format|pre-commit|\[pre-commit)", re.I)
_TRAILER = re.compile(r"^(signed-off-by|co-authored-by|reviewed-by|cc|change-id):", re.I)


@dataclass(frozen=True)
class Pin:
    repo: str  # owner/name
    commit: str
    split: str  # train | heldout

    @property
    def dirname(self) -> str:
        return self.repo.replace("/", "__")


def read_pins(path: Path) -> list[Pin]:
    """`owner/name commit [train|heldout]` per line; `#` starts a comment."""
    pins = []
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise InputError(f"cannot read --pins {path}: {exc.strerror or exc}") from exc
    for n, line in enumerate(text.splitlines(), 1):
        words = line.split("#", 1)[0].split()
        if not words:
            continue
        split = words[2] if len(words) > 2 else "train"
        if len(words) not in (2, 3) or "/" not in words[0] or split not in ("train", "heldout") or \
                not re.fullmatch(r"[0-9a-f]{7,40}", words[1]):
            raise InputError(f"{path}:{n}: expected `owner/name commit [train|heldout]`, got {line.strip()!r}")
        pins.append(Pin(words[0], words[1], split))
    if not pins:
        raise InputError(f"{path}: no repositories listed")
    return pins


def _message(subject: str, body: str) -> str:
    lines = [ln for ln in body.strip().splitlines() if not _TRAILER.match(ln.strip())]
    text = subject.strip() + ("\n\n" + "\n".join(lines).strip() if any(ln.strip() for ln in lines) else "")
    return text if len(text) <= MAX_MESSAGE_CHARS else text[:MAX_MESSAGE_CHARS].rstrip() + " ..."


def _log(repo: Path, commit: str) -> list[dict[str, Any]]:
    """Every non-merge commit up to `commit` with its subject, body and per-file line counts."""
    out = gitsafe.source_git(repo, "log", "--no-merges", "--no-renames", "--numstat", "--format=%x1e%H%x1f%P%x1f%s%x1f%b%x1f",
                             commit, timeout=600)
    commits = []
    for chunk in out.split("\x1e")[1:]:
        sha, parents, subject, body, stat = (chunk.split("\x1f") + [""] * 5)[:5]
        files = []
        for row in stat.strip().splitlines():
            parts = row.split("\t")
            if len(parts) == 3:
                a, r, path = parts
                files.append((path, int(a) if a.isdigit() else -1, int(r) if r.isdigit() else -1))
        commits.append({"sha": sha, "parents": parents.split(), "subject": subject, "body": body, "files": files})
    return commits


def qualifies(files: list[tuple[str, int, int]], subject: str) -> bool:
    """A fix of Python library code with its test: 1-2 library files, 2-40 changed lines, tests touched."""
    if _SKIP_SUBJECT.match(subject.strip()):
        return False
    lib = [f for f in files if f[0].endswith(".py") and not is_test_path(f[0])]
    tests = [f for f in files if is_test_path(f[0])]
    others = [f for f in files if f not in lib and f not in tests]
    if not lib or not tests or len(lib) > MAX_FILES or any(a < 0 for _, a, _ in lib):
        return False
    # Changelogs and docs may come along; other code (a second language, build files) would make a mixed fix.
    if any(not re.search(r"(?i)(changes|changelog|history|news|\.rst$|\.md$|\.txt$)", p) for p, _, _ in others):
        return False
    size = sum(a + r for _, a, r in lib)
    return MIN_LINES <= size <= MAX_LINES and any(a > 0 for _, a, _ in lib)


def mine(repo: Path, pin: Pin, *, max_instances: int, seed: int = 0) -> list[dict[str, Any]]:
    """Up to `max_instances` gold-fix instances from `repo`'s history up to `pin.commit`, spread over it."""
    try:
        head = gitsafe.resolve_commit(repo, pin.commit)
        commits = [c for c in _log(repo, head) if len(c["parents"]) == 1 and qualifies(c["files"], c["subject"])]
    except gitsafe.GitError as exc:
        raise InputError(f"{pin.repo}: {exc}") from exc
    rng = random.Random(f"{pin.repo}:{seed}")
    rng.shuffle(commits)
    out = []
    for c in commits:
        if len(out) >= max_instances:
            break
        lib = [p for p, _, _ in c["files"] if p.endswith(".py") and not is_test_path(p)]
        tests = [p for p, _, _ in c["files"] if is_test_path(p)]
        base = c["parents"][0]
        patch = gitsafe.source_git(repo, "diff", "--no-color", "--no-ext-diff", "--no-textconv", base, c["sha"],
                                   "--", *lib)
        test_patch = gitsafe.source_git(repo, "diff", "--no-color", "--no-ext-diff", "--no-textconv", base,
                                        c["sha"], "--", *tests)
        if not patch.strip() or "Binary files" in patch:
            continue
        out.append({
            "instance_id": f"{pin.dirname}-{c['sha'][:10]}",
            "repo": pin.repo,
            "base_commit": base,
            "patch": patch,
            "test_patch": test_patch,
            "FAIL_TO_PASS": [],
            "PASS_TO_PASS": [],
            "problem_statement": _message(c["subject"], c["body"]),
            "language": "python",
            "split": pin.split,
            "fix_commit": c["sha"],
        })
    return out


def link_repos(repos_dir: Path, names: list[str], out: Path) -> None:
    """`out/<owner>__<name>` -> the clone, for each repository (replacing a stale link)."""
    out.mkdir(parents=True, exist_ok=True)
    for name in names:
        link = out / name
        target = (repos_dir / name).resolve()
        if link.is_symlink() or link.exists():
            if link.is_symlink() and link.resolve() == target:
                continue
            if not link.is_symlink():
                raise InputError(f"{link} exists and is not a link; remove it or choose another --out")
            link.unlink()
        os.symlink(target, link)


def main(argv: list[str]) -> int:
    p = ArgumentParser(prog="gagar sft history", description=__doc__.splitlines()[0])
    p.add_argument("--repos-dir", required=True, type=Path, help="holds the clones as <owner>__<name>")
    p.add_argument("--pins", required=True, type=Path, help="`owner/name commit [train|heldout]` per line")
    p.add_argument("--out", required=True, type=Path,
                   help="output folder: instances.jsonl and repos/ (for `gagar sft data` and `gagar eval`)")
    p.add_argument("--max-per-repo", type=int, default=40, help="instances per training repository")
    p.add_argument("--max-per-heldout-repo", type=int, default=12, help="instances per held-out repository")
    p.add_argument("--seed", type=int, default=0, help="which commits are kept when a repository has more")
    args = p.parse_args(argv)
    prog = "gagar sft history"
    try:
        if args.max_per_repo < 1 or args.max_per_heldout_repo < 1:
            raise InputError("--max-per-repo and --max-per-heldout-repo must be >= 1")
        pins = read_pins(args.pins)
        missing = [pin for pin in pins if not (args.repos_dir / pin.dirname).exists()]
        if missing:
            raise InputError(
                f"--repos-dir {args.repos_dir} lacks {len(missing)} clone(s): "
                + ", ".join(m.dirname for m in missing[:5])
                + f"; clone each: git clone https://github.com/{missing[0].repo} {args.repos_dir}/{missing[0].dirname}"
            )
        rows: list[dict[str, Any]] = []
        for pin in pins:
            cap = args.max_per_heldout_repo if pin.split == "heldout" else args.max_per_repo
            got = mine(args.repos_dir / pin.dirname, pin, max_instances=cap, seed=args.seed)
            print(f"{prog}: {pin.repo} ({pin.split}): {len(got)} fixes", flush=True)
            rows += got
        link_repos(args.repos_dir, sorted({pin.dirname for pin in pins}), args.out / "repos")
    except (InputError, OSError) as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 2
    write_jsonl_atomic(args.out / "instances.jsonl", rows)
    manifest = {"pins": [pin.__dict__ for pin in pins], "instances": len(rows), "seed": args.seed,
                "max_per_repo": args.max_per_repo, "max_per_heldout_repo": args.max_per_heldout_repo}
    (args.out / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    print(f"{prog}: {len(rows)} instances from {len(pins)} repositories -> {args.out}")
    return 0
