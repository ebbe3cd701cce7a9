"""The judge's tools over a `SharedWorkspace`: each returns bounded text and never raises.

A tool result is what the model reads next, so errors come back as text ("error: ...") the model can act on,
and every output is capped (characters and lines) with a note saying what was cut and how to see more.
"""

from __future__ import annotations

import difflib
import json
import os
import re
from collections.abc import Callable
from typing import Any

from unidiff import PatchSet
from unidiff.errors import UnidiffParseError

from grader.features import patch_file_path
from grader.workspace import SharedWorkspace

MAX_CHARS = 6000
MAX_LINES = 200
MAX_GREP_HITS = 60
MAX_FILE_BYTES = 1 << 20

TOOL_SPECS: dict[str, dict[str, Any]] = {
    "list_candidates": {"description": "List the candidates with their diffstats (files, lines added/removed).",
                        "arguments": {}},
    "show_diff": {"description": "Show a candidate's patch, optionally for one file; page with `offset` (a line).",
                  "arguments": {"candidate": "letter", "path": "optional file", "offset": "optional int"}},
    "read_file": {"description": "Read a file of a candidate's patched tree (or of `base`), lines start..end.",
                  "arguments": {"candidate": "letter or base", "path": "file", "start": "int", "end": "int"}},
    "grep": {"description": "Search a candidate's tree (or `base`) for a regular expression.",
             "arguments": {"candidate": "letter or base", "pattern": "regex", "path": "optional sub-path"}},
    "list_files": {"description": "List the files under a directory of a candidate's tree (or `base`).",
                   "arguments": {"candidate": "letter or base", "path": "optional directory"}},
    "compare": {"description": "Compare two candidates: files each touches, and how their versions differ.",
                "arguments": {"a": "letter", "b": "letter", "path": "optional file"}},
    "test_output": {"description": "The candidate's test output, when the group provides it.",
                    "arguments": {"candidate": "letter"}},
    "trajectory": {"description": "The agent's trajectory that produced the candidate, when provided.",
                   "arguments": {"candidate": "letter", "offset": "optional int"}},
}


def bound(text: str, *, max_chars: int = MAX_CHARS, max_lines: int = MAX_LINES, hint: str = "") -> str:
    """Cap `text`, appending a note that says how much was cut (and `hint`: how to see the rest)."""
    lines = text.splitlines()
    cut_lines = 0
    if len(lines) > max_lines:
        cut_lines = len(lines) - max_lines
        lines = lines[:max_lines]
    out = "\n".join(lines)
    cut_chars = 0
    if len(out) > max_chars:
        cut_chars = len(out) - max_chars
        out = out[:max_chars]
    if cut_lines or cut_chars:
        what = f"{cut_lines} more lines" if cut_lines else f"{cut_chars} more characters"
        out += f"\n[truncated: {what} not shown{'; ' + hint if hint else ''}]"
    return out


def diffstat(patch: str) -> list[tuple[str, int, int]]:
    """(path, added, removed) per file of a unified diff; tolerant of patches unidiff cannot parse."""
    try:
        return [(patch_file_path(pf), pf.added, pf.removed) for pf in PatchSet(patch)]
    except (UnidiffParseError, ValueError):
        stats: dict[str, list[int]] = {}
        cur = "?"
        for line in patch.splitlines():
            if line.startswith("+++ "):
                cur = line[4:].strip().removeprefix("b/")
                stats.setdefault(cur, [0, 0])
            elif line.startswith("+") and not line.startswith("+++"):
                stats.setdefault(cur, [0, 0])[0] += 1
            elif line.startswith("-") and not line.startswith("---"):
                stats.setdefault(cur, [0, 0])[1] += 1
        return [(k, a, r) for k, (a, r) in stats.items()]


def _label(ws: SharedWorkspace, args: dict[str, Any], key: str = "candidate", allow_base: bool = False) -> str:
    raw = args.get(key)
    if not isinstance(raw, str) or not raw.strip():
        raise ValueError(f"argument `{key}` is required (one of {', '.join(ws.labels)})")
    lab = raw.strip()
    if allow_base and lab.lower() == "base":
        return "base"
    lab = lab.upper()
    if lab not in ws.label_to_rollout:
        raise ValueError(f"unknown candidate {raw!r}; the candidates are {', '.join(ws.labels)}")
    return lab


def _int(args: dict[str, Any], key: str, default: int) -> int:
    v = args.get(key, default)
    if v is None or v == "":
        return default
    try:
        return int(v)
    except (TypeError, ValueError):
        raise ValueError(f"argument `{key}` must be an integer, got {v!r}") from None


def tool_list_candidates(ws: SharedWorkspace, args: dict[str, Any]) -> str:
    out = []
    for lab in ws.labels:
        stats = diffstat(ws.candidate(lab).patch)
        add = sum(a for _, a, _ in stats)
        rem = sum(r for _, _, r in stats)
        files = ", ".join(f"{p} (+{a} -{r})" for p, a, r in stats)
        # Sizes first: a number right after `A: ` is, in the judge's prompt, only ever a count of findings.
        out.append(f"{lab}: +{add} -{rem} in {len(stats)} file(s): {files}")
    if ws.failed:
        out.append(f"({len(ws.failed)} other candidate(s) could not be staged and are not part of this ranking)")
    return bound("\n".join(out))


def tool_show_diff(ws: SharedWorkspace, args: dict[str, Any]) -> str:
    lab = _label(ws, args)
    patch = ws.candidate(lab).patch
    path = args.get("path")
    if path:
        try:
            files = [pf for pf in PatchSet(patch) if patch_file_path(pf) == str(path).strip()]
        except (UnidiffParseError, ValueError):
            files = []
        if not files:
            touched = ", ".join(p for p, _, _ in diffstat(patch))
            return f"error: candidate {lab} does not change {path!r}; it changes: {touched}"
        patch = "".join(str(pf) for pf in files)
    offset = max(0, _int(args, "offset", 0))
    lines = patch.splitlines()[offset:]
    head = f"candidate {lab} diff" + (f" (from line {offset})" if offset else "") + ":\n"
    nxt = offset + MAX_LINES
    return head + bound("\n".join(lines), hint=f"call show_diff with offset={nxt} for more")


def tool_read_file(ws: SharedWorkspace, args: dict[str, Any]) -> str:
    lab = _label(ws, args, allow_base=True)
    path = str(args.get("path") or "")
    target = ws.resolve(lab, path)
    if not target.is_file():
        return f"error: {path!r} is not a file in {lab}"
    if target.stat().st_size > MAX_FILE_BYTES:
        return f"error: {path!r} is larger than {MAX_FILE_BYTES} bytes"
    text = target.read_text(encoding="utf-8", errors="replace")
    lines = text.splitlines()
    start = max(1, _int(args, "start", 1))
    end = _int(args, "end", start + MAX_LINES - 1)
    end = min(len(lines), max(start, end), start + MAX_LINES - 1)
    body = "\n".join(f"{n:>5}  {lines[n - 1]}" for n in range(start, end + 1)) if lines else "(empty file)"
    more = f"\n[lines {end + 1}..{len(lines)} not shown; call read_file with start={end + 1}]" if end < len(lines) else ""
    return f"{lab}:{path} lines {start}-{end} of {len(lines)}:\n" + bound(body) + more


def _walk(root: str, sub: str) -> Any:
    """Regular files under root/sub, never following symlinks (a patch may add links that point out)."""
    start = os.path.join(root, sub) if sub else root
    if os.path.isfile(start) and not os.path.islink(start):
        yield start
        return
    for dirpath, dirnames, filenames in os.walk(start, followlinks=False):
        dirnames[:] = sorted(d for d in dirnames if d != ".git" and not os.path.islink(os.path.join(dirpath, d)))
        for name in sorted(filenames):
            full = os.path.join(dirpath, name)
            if not os.path.islink(full):
                yield full


def _nested_quantifier(pattern: str) -> bool:
    """True when a repeated group holds a repetition or an alternation — `(a+)+`, `(x|xy)*`: the shapes that
    make a backtracking regex take exponential time on a line a candidate patch can plant."""
    stack: list[bool] = []
    i, n = 0, len(pattern)
    while i < n:
        ch = pattern[i]
        if ch == "\\":
            i += 2
            continue
        if ch == "[":  # skip a character class
            j = i + 1 + (pattern[i + 1 : i + 2] == "^")
            j += pattern[j : j + 1] == "]"
            while j < n and pattern[j] != "]":
                j += 2 if pattern[j] == "\\" else 1
            i = j + 1
            continue
        if ch == "(":
            stack.append(False)
        elif ch == ")" and stack:
            risky = stack.pop()
            if risky and i + 1 < n and pattern[i + 1] in "*+{":
                return True
            if stack:
                stack[-1] = stack[-1] or risky
        elif ch in "*+{|" and stack:
            stack[-1] = True
        i += 1
    return False


def tool_grep(ws: SharedWorkspace, args: dict[str, Any]) -> str:
    lab = _label(ws, args, allow_base=True)
    pattern = args.get("pattern")
    if not isinstance(pattern, str) or not pattern:
        return "error: argument `pattern` (a regular expression) is required"
    try:
        rx = re.compile(re.escape(pattern) if _nested_quantifier(pattern) else pattern)
    except re.error:
        rx = re.compile(re.escape(pattern))
    root = str(ws.worktree(lab).resolve())
    sub = ""
    if args.get("path"):
        sub = str(ws.resolve(lab, str(args["path"])).relative_to(root))
    hits: list[str] = []
    total = 0
    for full in _walk(root, sub):
        try:
            if os.path.getsize(full) > MAX_FILE_BYTES:
                continue
            with open(full, "rb") as f:
                data = f.read()
        except OSError:
            continue
        if b"\0" in data[:8192]:
            continue
        rel = os.path.relpath(full, root)
        for n, line in enumerate(data.decode("utf-8", "replace").splitlines(), 1):
            if rx.search(line[:2000]):
                total += 1
                if len(hits) < MAX_GREP_HITS:
                    hits.append(f"{rel}:{n}: {line.strip()[:200]}")
    if not hits:
        return f"no match for {pattern!r} in {lab}"
    more = f"\n[{total - len(hits)} more matches not shown; narrow the pattern or path]" if total > len(hits) else ""
    return bound("\n".join(hits)) + more


def tool_list_files(ws: SharedWorkspace, args: dict[str, Any]) -> str:
    lab = _label(ws, args, allow_base=True)
    root = str(ws.worktree(lab).resolve())
    sub = str(ws.resolve(lab, str(args["path"])).relative_to(root)) if args.get("path") else ""
    files = [os.path.relpath(f, root) for f in _walk(root, sub)]
    return bound("\n".join(files) or "(no files)", hint="pass a sub-directory as `path`")


def tool_compare(ws: SharedWorkspace, args: dict[str, Any]) -> str:
    a, b = _label(ws, args, "a"), _label(ws, args, "b")
    fa = {p for p, _, _ in diffstat(ws.candidate(a).patch)}
    fb = {p for p, _, _ in diffstat(ws.candidate(b).patch)}
    out = [
        f"files changed by both: {', '.join(sorted(fa & fb)) or '-'}",
        f"only {a}: {', '.join(sorted(fa - fb)) or '-'}",
        f"only {b}: {', '.join(sorted(fb - fa)) or '-'}",
    ]
    # Files only one side changes are already in its show_diff; the versions of shared files are the news.
    paths = [str(args["path"])] if args.get("path") else sorted(fa & fb)
    for p in paths:
        va, vb = _version(ws, a, p), _version(ws, b, p)
        if va == vb:
            out.append(f"== {p}: identical in {a} and {b}")
            continue
        diff = difflib.unified_diff(va, vb, f"{a}/{p}", f"{b}/{p}", lineterm="", n=2)
        out.extend(diff)
    return bound("\n".join(out), hint="pass `path` to compare one file")


def _version(ws: SharedWorkspace, lab: str, rel: str) -> list[str]:
    try:
        target = ws.resolve(lab, rel)
    except ValueError:
        return []
    if not target.is_file() or target.stat().st_size > MAX_FILE_BYTES:
        return []
    return target.read_text(encoding="utf-8", errors="replace").splitlines()


def tool_test_output(ws: SharedWorkspace, args: dict[str, Any]) -> str:
    lab = _label(ws, args)
    out = ws.candidate(lab).test_output
    if not out:
        return f"no test output was provided for {lab}"
    lines = out.splitlines()
    # The end of a test log carries the summary; keep the tail when it must be cut.
    tail = "\n".join(lines[-MAX_LINES:])
    note = f"[first {len(lines) - MAX_LINES} lines not shown]\n" if len(lines) > MAX_LINES else ""
    return note + bound(tail)


def tool_trajectory(ws: SharedWorkspace, args: dict[str, Any]) -> str:
    lab = _label(ws, args)
    traj = ws.candidate(lab).trajectory
    if not traj:
        return f"no trajectory was provided for {lab}"
    text = traj if isinstance(traj, str) else json.dumps(traj, indent=1, ensure_ascii=False, default=str)
    offset = max(0, _int(args, "offset", 0))
    nxt = offset + MAX_LINES
    return bound("\n".join(text.splitlines()[offset:]), hint=f"call trajectory with offset={nxt} for more")


TOOLS: dict[str, Callable[[SharedWorkspace, dict[str, Any]], str]] = {
    "list_candidates": tool_list_candidates,
    "show_diff": tool_show_diff,
    "read_file": tool_read_file,
    "grep": tool_grep,
    "list_files": tool_list_files,
    "compare": tool_compare,
    "test_output": tool_test_output,
    "trajectory": tool_trajectory,
}


def run_tool(workspace: SharedWorkspace, name: str, args: dict[str, Any] | None) -> str:
    """Run one tool by name; bad names or arguments come back as an `error:` line for the model."""
    fn = TOOLS.get(str(name))
    if fn is None:
        return f"error: unknown tool {name!r}; the tools are {', '.join(TOOLS)}"
    if args is None:
        args = {}
    if not isinstance(args, dict):
        return "error: `arguments` must be a JSON object"
    try:
        return fn(workspace, args)
    except (ValueError, KeyError) as exc:
        msg = exc.args[0] if exc.args else str(exc)
        return f"error: {msg}"
    except OSError as exc:
        return f"error: {exc.strerror or exc}"
