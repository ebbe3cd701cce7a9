"""`gagar tasks repos SET --out DIR`: a synthesized set's task repositories, rebuilt without running a test.

A set (`manifest.json`, `instances.jsonl`, `tasks_meta.jsonl`, as `gagar tasks synth` writes them and
`examples/synth/` commits them) does not carry its repositories: they are rebuilt from the pinned sources. Each
project's base commit is made exactly as the factory makes it (`synth.sources.prepare`: the sdist downloaded and
its sha256 checked, unpacked, committed with a fixed identity and date), each task's bug is found again by its
key among the file's candidates (`synth.mutate.find_mutations`) and written as the same commit on top
(`write_commits`). Every commit and every revert diff is compared with the instance's `base_commit` and `patch`:
a mismatch is an error, never a silently different task. Seconds per project, no Docker.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from synth import sources as src_mod
from synth.mutate import find_mutations


@dataclass
class Rebuilt:
    """What a rebuild made: tasks per repository, and every way it differs from the set (empty: exact)."""

    tasks: dict[str, int] = field(default_factory=dict)
    mismatches: list[str] = field(default_factory=list)


def _rows(path: Path, keys: tuple[str, ...]) -> list[dict[str, Any]]:
    from sandbox.jsonl import read_jsonl

    rows = read_jsonl(path)  # JsonlError (a ValueError) names the file and line
    for n, row in enumerate(rows, 1):
        lacking = [k for k in keys if not isinstance(row.get(k), str)]
        if lacking:
            raise ValueError(f"{path}: record {n} has no {', '.join(lacking)}")
    return rows


def rebuild(set_dir: Path, out: Path) -> Rebuilt:
    """The task repositories of the set in `set_dir` under `out/repos` (sdists under `out/sdists`).
    Raises ValueError on an unreadable or inconsistent set, `SourceError` when a source cannot be had."""
    try:
        manifest = json.loads((set_dir / "manifest.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ValueError(f"{set_dir}/manifest.json: cannot read it ({exc})") from exc
    instances = {r["instance_id"]: r for r in _rows(set_dir / "instances.jsonl",
                                                    ("instance_id", "repo", "base_commit", "patch"))}
    meta = {m["instance_id"]: m for m in _rows(set_dir / "tasks_meta.jsonl", ("instance_id", "path", "key", "kind"))}
    missing = sorted(set(instances) - set(meta))
    if missing:
        raise ValueError(f"{set_dir}/tasks_meta.jsonl has no row for {len(missing)} instance(s), e.g. {missing[0]}")
    done = Rebuilt()
    for i, row in enumerate(manifest.get("sources", [])):
        if row.get("status") != "ok":
            continue
        source = src_mod.Source.from_dict(row, f"{set_dir}/manifest.json sources[{i}]")
        repo = source.repo_name()
        prepared = src_mod.prepare(source, out, {"base_commit": row.get("base_commit"), "sha256": row.get("sha256")})
        if prepared.base_commit != row.get("base_commit"):
            done.mismatches.append(f"{repo}: base commit {prepared.base_commit[:12]}, the set says "
                                   f"{str(row.get('base_commit'))[:12]}")
            continue
        ids = [iid for iid, r in instances.items() if r["repo"] == repo]
        changes: dict[str, tuple[str, str]] = {}
        for iid in ids:
            m = meta[iid]
            text = prepared.sources.get(m["path"])
            found = [c for c in find_mutations(m["path"], text)
                     if c.key == m["key"]] if text is not None else []
            if not found:
                done.mismatches.append(f"{iid}: no candidate {m['key']} ({m['kind']}) in {m['path']}")
                continue
            changes[iid] = (m["path"], found[0].apply(text))  # type: ignore[arg-type]
        commits = src_mod.write_commits(prepared, changes, src_mod.TASK_REFS)
        reverts = src_mod.diffs(prepared, commits, reverse=True)
        for iid, sha in commits.items():
            if sha != instances[iid]["base_commit"]:
                done.mismatches.append(f"{iid}: commit {sha[:12]}, the set says {instances[iid]['base_commit'][:12]}")
            elif reverts[iid] != instances[iid]["patch"]:
                done.mismatches.append(f"{iid}: the revert differs from the set's patch")
        done.tasks[repo] = len(commits)
    return done
