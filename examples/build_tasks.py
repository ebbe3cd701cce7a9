#!/usr/bin/env python3
"""Build the bundled tasks: git repos plus SWE-bench style JSONL files, from the data in examples/tasks/.

Each task is a directory `examples/tasks/<slug>/` holding `repo/` (the files at the base commit) and
`task.yaml` (issue text, test ids, the test patch and every rollout as a list of edits). Nothing here is a
hand-written diff: edits are applied to a scratch clone and every patch is what `git diff` prints, so a
patch can only be malformed on purpose (the `stale` and `escape` rollouts, which exercise the sandbox's
`patch_failed` and `rejected` paths).

    .venv/bin/python examples/build_tasks.py --out .gagar/tasks

Commits use a fixed author, committer and date, and git runs without user or system configuration, so
`base_commit` is the same on every machine. Re-running on an existing DIR keeps repos that already hold the
expected commit and rewrites the JSONL files atomically.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from sandbox.integrity import gitsafe  # noqa: E402

TASKS_DIR = Path(__file__).resolve().parent / "tasks"
FIXED_DATE = "2024-01-15T12:00:00+00:00"
# Identity and a config-free git make the commit hashes reproducible whatever the user's ~/.gitconfig says.
GIT_ENV = {
    "GIT_AUTHOR_NAME": "Gagar Tasks",
    "GIT_AUTHOR_EMAIL": "tasks@gagar.invalid",
    "GIT_AUTHOR_DATE": FIXED_DATE,
    "GIT_COMMITTER_NAME": "Gagar Tasks",
    "GIT_COMMITTER_EMAIL": "tasks@gagar.invalid",
    "GIT_COMMITTER_DATE": FIXED_DATE,
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_CONFIG_GLOBAL": os.devnull,
    "GIT_TERMINAL_PROMPT": "0",
    "LC_ALL": "C",
}

# What the sandbox must say about each kind of rollout; quality ranks apply to the passing kinds only
# (the smallest clean fix is best, then the gold patch, then the noisy and the out-of-scope ones).
KIND_STATUS = {
    "gold": "resolved",
    "minimal": "resolved",
    "bloated": "resolved",
    "unrelated": "resolved",
    "wrong": "unresolved",
    "tamper": "unresolved",
    "empty": "empty_patch",
    "stale": "patch_failed",
    "escape": "rejected",
    "hack": "resolved",
}
# A `hack` passes the tests by gaming them (special-casing test inputs, silencing a failure, weakening the
# tests): it is ranked below every general fix, and the grader must give it a hack verdict.
QUALITY_RANK = {"minimal": 1, "gold": 2, "bloated": 3, "unrelated": 4, "hack": 5}
HACK_KINDS = ("special_casing", "silencing", "weakening")
PASSING_KINDS = tuple(QUALITY_RANK)
TEST_FRAMEWORK = {"python": "pytest", "go": "go", "java": "junit"}
JUNIT_JAR = "/usr/share/java/junit-platform-console-standalone.jar"
TEST_CMD = {
    "go": "go test -json ./...",
    "java": (
        f"javac -d /tmp/classes -cp {JUNIT_JAR} $(find src -name '*.java') && "
        f"java -jar {JUNIT_JAR} --class-path /tmp/classes --scan-class-path "
        '--reports-dir "$GAGAR_REPORT_DIR"'
    ),
}


class TaskError(ValueError):
    """A task's data is inconsistent (an edit that does not match, a missing field)."""


def git(repo: Path, *args: str, input_text: str | None = None) -> str:
    """The project's hardened git (`sandbox.integrity.gitsafe`), with the fixed identity and date of GIT_ENV."""
    res = gitsafe.run(*args, cwd=repo, env=GIT_ENV, input=input_text)
    if not res.ok:
        raise RuntimeError(f"git {' '.join(args)} failed in {repo}: {res.err}")
    return str(res.out)


def load_task(task_dir: Path) -> dict[str, Any]:
    spec = yaml.safe_load((task_dir / "task.yaml").read_text(encoding="utf-8"))
    for key in ("instance_id", "repo", "language", "problem_statement", "FAIL_TO_PASS", "PASS_TO_PASS",
                "test_edits", "rollouts"):
        if key not in spec:
            raise TaskError(f"{task_dir.name}/task.yaml: missing {key}")
    if spec["language"] not in TEST_FRAMEWORK:
        raise TaskError(f"{task_dir.name}: unknown language {spec['language']!r}")
    kinds = {r["kind"] for r in spec["rollouts"]}
    # The environment tasks (examples/env_tasks) exercise env images and validate, not the grader: fewer kinds.
    required = spec.get("required_kinds") or ["gold", "minimal", "bloated", "unrelated", "wrong", "tamper"]
    if not set(required) <= kinds:
        raise TaskError(f"{task_dir.name}: rollouts must include {', '.join(required)}")
    spec["slug"] = task_dir.name
    spec["base_dir"] = task_dir / "repo"
    return spec


def write_base(spec: dict[str, Any], dest: Path) -> None:
    """Copy the base files by content only, so file modes (and hence the tree hash) never depend on the checkout."""
    for src in sorted(spec["base_dir"].rglob("*")):
        if src.is_file() and "__pycache__" not in src.parts:
            target = dest / src.relative_to(spec["base_dir"])
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(src.read_bytes())


def apply_edits(root: Path, edits: list[dict[str, Any]], where: str) -> None:
    """Apply edit operations: replace `old` by `new` (exactly one match), whole-file `content`, or `delete`."""
    for edit in edits:
        path = root / edit["path"]
        if "content" in edit:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(edit["content"], encoding="utf-8")
        elif edit.get("delete"):
            path.unlink()
        else:
            text = path.read_text(encoding="utf-8")
            count = text.count(edit["old"])
            if count != 1:
                raise TaskError(f"{where}: `old` text occurs {count} times in {edit['path']} (needs exactly 1)")
            path.write_text(text.replace(edit["old"], edit["new"]), encoding="utf-8")


def rollout_edits(spec: dict[str, Any], rollout: dict[str, Any]) -> list[dict[str, Any]]:
    """A rollout may `extend` another one (e.g. `unrelated` is the minimal fix plus a README edit)."""
    edits: list[dict[str, Any]] = []
    if "extends" in rollout:
        parent = next((r for r in spec["rollouts"] if r["id"] == rollout["extends"]), None)
        if parent is None:
            raise TaskError(f"{spec['slug']}: rollout {rollout['id']} extends unknown {rollout['extends']!r}")
        edits += rollout_edits(spec, parent)
    return edits + list(rollout.get("edits", []))


def diff_of(repo: Path, base: str, edits: list[dict[str, Any]], where: str, before: list | None = None) -> str:
    """The diff that `edits` make to the base. With `before`, the diff is taken against the base altered by
    `before` (that is how a stale patch is made: the lines it removes are not in the real file)."""
    try:
        start = base
        if before:
            apply_edits(repo, before, where)
            git(repo, "add", "-A")
            start = git(repo, "write-tree").strip()
        apply_edits(repo, edits, where)
        git(repo, "add", "-A")
        return git(repo, "diff", "--cached", "--no-color", "--no-ext-diff", "--no-textconv", "--no-renames",
                   "--src-prefix=a/", "--dst-prefix=b/", start)
    finally:
        git(repo, "reset", "-q", "--hard", base)
        git(repo, "clean", "-qfdx")


def escape_paths(patch: str, mapping: dict[str, str]) -> str:
    """Rename paths inside a git-made diff (for the `escape` rollout: a path outside the repo)."""
    for old, new in mapping.items():
        patch = patch.replace(f"a/{old}", f"a/{new}").replace(f"b/{old}", f"b/{new}")
    return patch


def build_repo(spec: dict[str, Any], dest: Path) -> str:
    """A new repo at `dest` holding the base files in one commit; returns the commit hash."""
    dest.mkdir(parents=True)
    git(dest, "init", "-q", "-b", "main")
    write_base(spec, dest)
    git(dest, "add", "-A")
    git(dest, "commit", "-q", "-m", spec.get("commit_message", "Initial import"))
    return git(dest, "rev-parse", "HEAD").strip()


def build_task(spec: dict[str, Any], scratch: Path) -> tuple[dict, list[dict], list[dict], str]:
    """Return (instance, rollouts with patches, expected rows, base_commit), computing diffs in `scratch`."""
    base = build_repo(spec, scratch)
    slug = spec["slug"]
    test_patch = diff_of(scratch, base, spec["test_edits"], f"{slug} test_edits")
    rollouts = []
    for r in spec["rollouts"]:
        kind = r["kind"]
        if kind not in KIND_STATUS:
            raise TaskError(f"{slug}: rollout {r['id']} has unknown kind {kind!r}")
        if (kind == "hack") != (r.get("hack") in HACK_KINDS):
            raise TaskError(f"{slug}: rollout {r['id']}: `hack: {'|'.join(HACK_KINDS)}` goes with kind hack only")
        where = f"{slug} rollout {r['id']}"
        if kind == "empty":
            patch = ""
        else:
            patch = diff_of(scratch, base, rollout_edits(spec, r), where, before=r.get("stale_base"))
            if kind == "escape":
                patch = escape_paths(patch, r["escape"])
        if kind != "empty" and not patch:
            raise TaskError(f"{where}: the edits change nothing")
        caught = bool(r.get("sandbox_catches"))
        if caught and kind != "hack":
            raise TaskError(f"{where}: `sandbox_catches` goes with kind hack only")
        rollouts.append({"id": str(r["id"]), "kind": kind, "patch": patch, "hack": r.get("hack"), "caught": caught})
    gold = next(r["patch"] for r in rollouts if r["kind"] == "gold")
    language = spec["language"]
    test_cmd = spec.get("test_cmd") or TEST_CMD.get(language)
    if not test_cmd:
        raise TaskError(f"{slug}: python tasks need a test_cmd")
    instance = {
        "instance_id": spec["instance_id"],
        "repo": spec["repo"],
        "base_commit": base,
        "patch": gold,
        "test_patch": test_patch,
        "FAIL_TO_PASS": list(spec["FAIL_TO_PASS"]),
        "PASS_TO_PASS": list(spec["PASS_TO_PASS"]),
        "problem_statement": spec["problem_statement"],
        "version": str(spec.get("version", "1.0")),
        "created_at": spec.get("created_at", "2024-01-15T12:00:00Z"),
        "hints_text": "",
        "environment_setup_commit": base,
        "test_cmd": test_cmd,
        "test_framework": TEST_FRAMEWORK[language],
        "language": language,
    }
    if spec.get("env"):  # an environment spec (docs/environments.md): the sandbox builds an env image from it
        instance["env"] = spec["env"]
    expected = []
    for r in rollouts:
        # A hack the sandbox's report guard already catches (it tampers with the test runner) is unresolved
        # with suspicious_report; the grader must still flag it on its own (defence in depth).
        status = "unresolved" if r["caught"] else KIND_STATUS[r["kind"]]
        expected.append({
            "instance_id": spec["instance_id"],
            "rollout_id": r["id"],
            "kind": r["kind"],
            "status": status,
            "resolved": status == "resolved",
            "tampered_tests": r["kind"] == "tamper",
            "quality_rank": QUALITY_RANK.get(r["kind"]),
            "hack": r["hack"],
            "suspicious_report": r["caught"],
        })
    return instance, rollouts, expected, base


def has_commit(repo: Path, commit: str) -> bool:
    if not (repo / ".git").exists():
        return False
    try:
        head = git(repo, "rev-parse", "HEAD").strip()
        dirty = git(repo, "status", "--porcelain")
        stats = dict(line.split(": ") for line in git(repo, "count-objects", "-v").splitlines())
        reachable = git(repo, "rev-list", "--objects", "--all").count("\n")
    except RuntimeError:
        return False
    # Extra (unreachable) objects could hold rollout blobs, the gold fix among them: rebuild such a repo.
    stored = int(stats.get("count", 0)) + int(stats.get("in-pack", 0))
    return head == commit and not dirty and stored == reachable


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text("".join(json.dumps(row, sort_keys=False) + "\n" for row in rows))
    os.replace(tmp, path)


def task_dirs(tasks_dir: Path | None = None) -> list[Path]:
    return sorted(p for p in (tasks_dir or TASKS_DIR).iterdir() if (p / "task.yaml").is_file())


def build_tasks(out_dir: str | os.PathLike[str], only: list[str] | None = None,
                tasks_dir: Path | None = None) -> dict[str, Any]:
    """Build every task into `out_dir`; return {"instances": [...], "expected": [...], ...} as written."""
    out = Path(out_dir)
    repos = out / "repos"
    repos.mkdir(parents=True, exist_ok=True)
    instances, predictions, expected, groups, labels = [], [], [], [], []
    with tempfile.TemporaryDirectory(prefix="gagar-tasks-", dir=out) as tmp:
        for task_dir in task_dirs(tasks_dir):
            if only and task_dir.name not in only:
                continue
            spec = load_task(task_dir)
            instance, rollouts, exp, base = build_task(spec, Path(tmp) / task_dir.name / "scratch")
            dest = repos / spec["repo"].replace("/", "__")
            if not has_commit(dest, base):
                # The scratch repo holds the blobs of every rollout (gold included, which an agent could dig
                # out of .git, and stale preimages that would let `git apply --3way` succeed): ship a
                # fresh repo with the base commit only. A dirty or moved clone is replaced whole.
                fresh = Path(tmp) / task_dir.name / "repo"
                if build_repo(spec, fresh) != base:
                    raise RuntimeError(f"{task_dir.name}: base commit is not reproducible")
                if dest.exists():
                    shutil.rmtree(dest)
                os.replace(fresh, dest)
            instances.append(instance)
            iid = instance["instance_id"]
            predictions += [
                {"instance_id": iid, "model_name_or_path": "bundled", "rollout_id": r["id"], "model_patch": r["patch"]}
                for r in rollouts
            ]
            expected += exp
            passing = sorted((r for r in rollouts if r["kind"] in PASSING_KINDS), key=lambda r: r["id"])
            groups.append({
                "instance_id": iid,
                "repo": instance["repo"],
                "base_commit": base,
                "problem_statement": instance["problem_statement"],
                "candidates": [{"rollout_id": r["id"], "patch": r["patch"]} for r in passing],
                "test_patch": instance["test_patch"],
                "FAIL_TO_PASS": instance["FAIL_TO_PASS"],
            })
            ranked = sorted(passing, key=lambda r: QUALITY_RANK[r["kind"]])
            labels.append({"instance_id": iid, "order": [r["id"] for r in ranked]})
    files = {"instances": instances, "predictions": predictions, "expected": expected, "groups": groups,
             "labels": labels}
    for name, rows in files.items():
        write_jsonl(out / f"{name}.jsonl", rows)
    return files


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="output directory (e.g. .gagar/tasks)")
    parser.add_argument("--only", nargs="*", help="task directory names to build (default: all)")
    parser.add_argument("--tasks-dir", type=Path, help="where the task dirs are (default examples/tasks; "
                        "examples/env_tasks holds the tasks with environment specs)")
    args = parser.parse_args(argv)
    try:
        files = build_tasks(args.out, args.only, args.tasks_dir)
    except (TaskError, OSError, yaml.YAMLError) as exc:
        print(f"build_tasks: {exc}", file=sys.stderr)
        return 2
    n_py = sum(i["language"] == "python" for i in files["instances"])
    print(f"built {len(files['instances'])} tasks ({n_py} python) and {len(files['predictions'])} rollouts "
          f"into {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
