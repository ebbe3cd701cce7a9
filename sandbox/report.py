"""Run files: `results.jsonl` (one line per current prediction, appended atomically), `report.json` (the summary).

A result line is written with one `write` of a complete line, then flushed and fsynced, so a crash leaves
at most a truncated last line; reading tolerates (and the writer trims) such a line. Each line carries the
`verdict_key` of what it judged (the patch and the instance fields that decide the verdict); a re-run skips a
finished (instance_id, rollout_id) only when that key still matches, and redoes it otherwise.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import sys
import tempfile
import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sandbox.jsonl import atomic_write_text, iter_jsonl
from sandbox.records import STATUSES, EvalResult, Instance, Prediction
from sandbox.workspace import remove_tree

ERROR_STATUSES = ("patch_failed", "rejected", "timeout", "infra_error")
REPORT_MAX_FILES, REPORT_MAX_DEPTH = 1000, 8
REPORT_FILE_CAP = 8 << 20  # bytes of structured reports copied into the logs per prediction


def file_sha256(path: str | Path) -> str:
    """The sha256 of a file's bytes (hex), read in blocks: the one file-digest helper of the project."""
    with open(path, "rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()


@contextlib.contextmanager
def staged_dir(final: str | Path):
    """Build a directory in a temp dir beside `final` (yielded); on success it takes `final`'s place whole by
    rename, on error it is removed. A reader sees the old directory or the new one, never a half-written one.

    The one atomic-directory helper (models, warm starts); the counterpart of `atomic_write_text`.
    """
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", suffix=".tmp", dir=final.parent))
    try:
        yield tmp
        old = None
        if final.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{final.name}.", suffix=".old", dir=final.parent))
            os.replace(final, old / final.name)
        os.replace(tmp, final)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def read_results(path: Path, *, warn: bool = True) -> dict[tuple[str, str], EvalResult]:
    """The last result per key; a line that does not parse (a crash mid-write) is ignored with a note."""
    out: dict[tuple[str, str], EvalResult] = {}
    if not path.exists():
        return out
    notes: list[str] = []
    for n, row in iter_jsonl(path, skip_bad=True, notes=notes):
        try:
            r = EvalResult.from_dict(row)
        except (ValueError, TypeError) as exc:
            notes.append(f"{path} line {n}: unreadable result ({exc})")
            continue
        out[r.key] = r
    if warn:
        for note in notes:
            print(f"gagar eval: {note}; it will be redone", file=sys.stderr)
    return out


# What decides a verdict besides the patch: the repo state, the tests and how they run, the environment.
VERDICT_FIELDS = ("repo", "base_commit", "test_patch", "FAIL_TO_PASS", "PASS_TO_PASS", "test_cmd", "test_framework",
                  "image", "language", "version", "environment_setup_commit", "env")


def verdict_key(instance: Instance, patch: str, image: str | None = None) -> str:
    """sha256 of a prediction's patch, the instance fields that decide its verdict and the `--image` override.
    Run limits (timeout, memory) are not in it: after changing them, `--redo` re-evaluates."""
    blob = {"patch": patch or "", "image": image or None,
            "instance": {k: getattr(instance, k) for k in VERDICT_FIELDS}}
    # ASCII JSON: a patch read from non-UTF-8 bytes holds lone surrogates (surrogateescape), which UTF-8 cannot
    # encode; escaped, they hash like any other character.
    return hashlib.sha256(json.dumps(blob, sort_keys=True).encode("ascii")).hexdigest()


@dataclass
class Resume:
    """What a (re-)run found in results.jsonl: the lines it may reuse and the ones it redoes, and why."""

    done: dict[tuple[str, str], EvalResult] = field(default_factory=dict)
    skipped: int = 0  # finished, same patch and instance: reused
    changed: list[tuple[str, str]] = field(default_factory=list)  # finished, but the patch or instance changed
    unkeyed: list[tuple[str, str]] = field(default_factory=list)  # finished, by a gagar that wrote no key
    retried: int = 0  # infra_error: retried
    gone: list[tuple[str, str]] = field(default_factory=list)  # lines of predictions no longer in the input

    def messages(self) -> list[str]:
        def some(keys: list[tuple[str, str]]) -> str:
            return ", ".join(f"{i}::{r}" for i, r in keys[:5]) + (" …" if len(keys) > 5 else "")

        out = []
        if self.skipped:
            out.append(f"{self.skipped} prediction(s) already evaluated with the same patch and instance: their "
                       "results are kept (--redo re-evaluates them)")
        if self.changed:
            out.append(f"{len(self.changed)} prediction(s) re-evaluated: their patch or instance changed since "
                       f"results.jsonl was written ({some(self.changed)}); the old lines are replaced")
        if self.unkeyed:
            out.append(f"{len(self.unkeyed)} prediction(s) re-evaluated: their lines carry no verdict_key (written "
                       f"by an older gagar), so they cannot be matched to the patch ({some(self.unkeyed)})")
        if self.retried:
            out.append(f"{self.retried} prediction(s) that ended in infra_error are retried")
        if self.gone:
            out.append(f"{len(self.gone)} result line(s) of predictions no longer in the input were removed from "
                       f"results.jsonl ({some(self.gone)}): it holds the current predictions only")
        return out


def resume_done(writer: ResultWriter, keys: dict[tuple[str, str], str], *, redo: bool, prune: bool = True) -> Resume:
    """What a (re-)run may skip: the finished results in `writer`'s file whose verdict key is still the one in
    `keys` ((instance_id, rollout_id) → verdict_key). `redo` drops every one of `keys` first. A line whose key
    differs (the same ids, another patch or instance) is dropped and redone, never reported: its verdict is
    about something else. An infra_error says nothing about the patch (the engine died, a worker was lost, an
    image was missing): it is dropped too, so the re-run retries it and replaces its line. Lines of predictions
    that are not in `keys` (removed from the input since) are dropped as well: the file is rewritten, atomically,
    to hold one line per current prediction, so results.jsonl and report.json always describe the same run
    (`prune=False`: a caller that evaluates a growing set into one file keeps the other lines for later)."""
    if redo:
        writer.drop(set(keys))
    found = read_results(writer.path)
    out = Resume(gone=sorted(k for k in found if k not in keys) if prune else [])
    drop = set(out.gone)
    for k, want in keys.items():
        r = found.get(k)
        if r is None:
            continue
        if r.status == "infra_error":
            out.retried += 1
        elif r.verdict_key is None:
            out.unkeyed.append(k)
        elif r.verdict_key != want:
            out.changed.append(k)
        else:
            out.skipped += 1
            continue
        drop.add(k)
    out.done = {k: r for k, r in found.items() if k not in drop}
    if prune:
        writer.retain(set(out.done))
    elif drop:
        writer.drop(drop)
    return out


@dataclass
class RunStart:
    """Where a run stands before it evaluates anything (`start_run`)."""

    known: list[Prediction]  # the predictions whose instance is known, in input order
    unknown: list[str]  # instance ids predicted for that the instances do not have
    keys: list[tuple[str, str]]
    verdict_keys: dict[tuple[str, str], str]
    writer: ResultWriter | None
    done: dict[tuple[str, str], EvalResult]  # results a re-run keeps


def start_run(instances: Any, predictions: list[Prediction], *, image: str | None, run_dir: Path | None,
              redo: bool, say: Any = print, fail_to_pass: bool = True, prune: bool = True) -> RunStart:
    """The common start of every executor's run: refuse instances that cannot give an honest verdict, key each
    prediction by what decides its verdict, and take over the finished results a re-run may keep (saying how
    many it keeps and redoes)."""
    from sandbox.inputs import require_runnable

    known = [p for p in predictions if p.instance_id in instances]
    unknown = sorted({p.instance_id for p in predictions if p.instance_id not in instances})
    # A missing test_cmd stays a per-prediction infra_error here: the run's env specs may still supply one.
    require_runnable({p.instance_id: instances[p.instance_id] for p in known}, test_cmd=False,
                     fail_to_pass=fail_to_pass)
    vkeys = {(p.instance_id, p.rollout_id): verdict_key(instances[p.instance_id], p.model_patch, image) for p in known}
    writer = ResultWriter(run_dir / "results.jsonl") if run_dir is not None else None
    done: dict[tuple[str, str], EvalResult] = {}
    if writer is not None:
        resume = resume_done(writer, vkeys, redo=redo, prune=prune)
        done = resume.done
        for msg in resume.messages():
            say(f"gagar eval: {msg}")
    return RunStart(known, unknown, [(p.instance_id, p.rollout_id) for p in known], vkeys, writer, done)


class ResultWriter:
    """Appends result lines to `results.jsonl`; thread-safe."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        path.parent.mkdir(parents=True, exist_ok=True)
        self._trim_partial_line()

    def _trim_partial_line(self) -> None:
        """Drop a truncated last line, so the next append does not glue onto it."""
        if not self.path.exists() or self.path.stat().st_size == 0:
            return
        with open(self.path, "rb+") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(size - 1)
            if f.read(1) == b"\n":
                return
            data = f.seek(0) or f.read()
            cut = data.rfind(b"\n") + 1
            f.truncate(cut)
            f.flush()
            os.fsync(f.fileno())

    def _rewrite(self, choose: Callable[[list[tuple[tuple[str, str] | None, str]]], list[str]]) -> None:
        """Rewrite the file atomically with the lines `choose` picks from its (key or None, line) entries; an
        unchanged file is left alone."""
        if not self.path.exists():
            return
        with self._lock:
            lines = self.path.read_text(encoding="utf-8", errors="replace").splitlines(keepends=True)
            entries = []
            for line in lines:
                try:
                    d = json.loads(line)
                    entries.append(((str(d.get("instance_id")), str(d.get("rollout_id"))), line))
                except (ValueError, AttributeError):
                    entries.append((None, line))
            kept = [ln if ln.endswith("\n") else ln + "\n" for ln in choose(entries)]
            if kept != lines:
                atomic_write_text(self.path, "".join(kept))

    def drop(self, keys: set[tuple[str, str]]) -> None:
        """Remove the lines of `keys` (for --redo), rewriting the file atomically."""
        self._rewrite(lambda entries: [ln for k, ln in entries if k is not None and k not in keys])

    def retain(self, keys: set[tuple[str, str]]) -> None:
        """Keep only the last line of each of `keys` (the one `read_results` reads); every other line goes."""
        def choose(entries: list[tuple[tuple[str, str] | None, str]]) -> list[str]:
            last = {k: i for i, (k, _) in enumerate(entries) if k is not None}
            return [ln for i, (k, ln) in enumerate(entries) if k in keys and last[k] == i]

        self._rewrite(choose)

    def write(self, result: EvalResult) -> None:
        line = json.dumps(result.to_dict(), ensure_ascii=False) + "\n"
        data = line.encode("utf-8")
        with self._lock:
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                os.write(fd, data)
                os.fsync(fd)
            finally:
                os.close(fd)


def log_dir_for(run_dir: Path | None, pred: Prediction) -> Path | None:
    """A fresh `logs/<instance>/<rollout>/` under `run_dir` (names made file-safe), or None without one."""
    if run_dir is None:
        return None
    safe = lambda s: "".join(ch if ch.isalnum() or ch in "._-" else "_" for ch in s)[:120] or "_"  # noqa: E731
    d = run_dir / "logs" / safe(pred.instance_id) / safe(pred.rollout_id)
    if d.exists():
        remove_tree(d)
    d.mkdir(parents=True)
    return d


def collect_reports(src: Path, dst: Path) -> None:
    """Copy the report dir into the logs. The tests control it: only regular files, at most REPORT_FILE_CAP
    bytes, REPORT_MAX_FILES files and REPORT_MAX_DEPTH levels (walked without recursion: a test can nest
    directories deeper than Python's stack), never following links."""
    budget, files = REPORT_FILE_CAP, 0
    stack = [(src, 0)]
    while stack and files < REPORT_MAX_FILES:
        d, depth = stack.pop()
        try:
            entries = sorted(os.scandir(d), key=lambda e: e.name)
        except OSError:
            continue
        for e in entries:
            if e.is_dir(follow_symlinks=False):
                if depth < REPORT_MAX_DEPTH:
                    stack.append((Path(e.path), depth + 1))
            elif e.is_file(follow_symlinks=False) and files < REPORT_MAX_FILES:
                size = e.stat(follow_symlinks=False).st_size
                if size <= budget:
                    target = dst / "report" / Path(e.path).relative_to(src)
                    target.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copyfile(e.path, target, follow_symlinks=False)
                    budget -= size
                    files += 1


def result_key_str(instance_id: str, rollout_id: str, per_instance: bool) -> str:
    return instance_id if per_instance else f"{instance_id}::{rollout_id}"


def build_report(
    *,
    run_id: str,
    total_instances: int,
    submitted: list[tuple[str, str]],
    results: dict[tuple[str, str], EvalResult],
    unknown_instance_ids: list[str],
    skipped_lines: list[str],
    duration_s: float | None = None,
    config: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """SWE-bench's run-report fields, counted over predictions. When every instance has one prediction the
    `*_ids` lists hold plain instance ids (as SWE-bench's do); with rollouts they hold `instance_id::rollout_id`."""
    per_instance = len({iid for iid, _ in submitted}) == len(submitted)
    done = [results[k] for k in submitted if k in results]

    def ids(pred) -> list[str]:
        return sorted(result_key_str(r.instance_id, r.rollout_id, per_instance) for r in done if pred(r))

    counts = Counter(r.status for r in done)
    incomplete = sorted(result_key_str(i, r, per_instance) for i, r in submitted if (i, r) not in results)
    by_instance: dict[str, dict[str, int]] = {}
    for r in done:
        d = by_instance.setdefault(r.instance_id, {"rollouts": 0, "resolved": 0})
        d["rollouts"] += 1
        d["resolved"] += int(r.resolved)
    report: dict[str, Any] = {
        "run_id": run_id,
        "id_format": "instance_id" if per_instance else "instance_id::rollout_id",
        "total_instances": total_instances,
        "submitted_instances": len(submitted),
        "completed_instances": counts["resolved"] + counts["unresolved"],
        "resolved_instances": counts["resolved"],
        "unresolved_instances": counts["unresolved"],
        "empty_patch_instances": counts["empty_patch"],
        "error_instances": sum(counts[s] for s in ERROR_STATUSES),
        "submitted_ids": sorted(result_key_str(i, r, per_instance) for i, r in submitted),
        "completed_ids": ids(lambda r: r.status in ("resolved", "unresolved")),
        "incomplete_ids": incomplete,
        "resolved_ids": ids(lambda r: r.status == "resolved"),
        "unresolved_ids": ids(lambda r: r.status == "unresolved"),
        "empty_patch_ids": ids(lambda r: r.status == "empty_patch"),
        "error_ids": ids(lambda r: r.status in ERROR_STATUSES),
        "status_counts": {s: counts[s] for s in STATUSES},
        "tampered_tests_ids": ids(lambda r: r.tampered_tests),
        "suspicious_report_ids": ids(lambda r: r.suspicious_report),
        "per_instance": dict(sorted(by_instance.items())),
        "unknown_instance_ids": sorted(set(unknown_instance_ids)),
        "skipped_input_lines": skipped_lines,
        "schema_version": 2,
    }
    for s in STATUSES:
        report[f"{s}_count"] = counts[s]
    if duration_s is not None:
        report["duration_s"] = round(duration_s, 3)
    if config is not None:
        report["config"] = config
    return report
