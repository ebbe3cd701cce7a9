"""What the policy is told: the agent's system prompt and tool list, and the single-turn prompt of each edit
format (`trainer.agent.edits`): a unified diff of the files shown, or the code around the fix to rewrite
(`function`) or edit with SEARCH/REPLACE blocks (`search_replace`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from sandbox.integrity.gitsafe import GitError, source_git
from sandbox.records import Instance
from trainer.agent.edits import Region, changed_line, find_region, shown
from trainer.agent.format import format_tool_call

TOOLS_DOC = [
    ("view", {"path": "src/app.py", "start": 1, "end": 40}, "show a file's lines (numbered), or list a directory"),
    ("search", {"pattern": "def parse", "path": "."}, "grep the repository (regular expression, line numbers)"),
    ("edit", {"path": "src/app.py", "old": "return a - b", "new": "return a + b"},
     "replace one exact occurrence of `old` with `new` (empty `old` creates a new file)"),
    ("run", {"command": "python -m pytest -q"}, "run a shell command in the repository (time and output bounded); "
     "without `command`, runs the project's tests"),
    ("submit", {}, "finish: your changes to the repository are the answer"),
]

AGENT_SYSTEM = (
    "You are a software engineer fixing an issue in the repository at /testbed. Work with tools; call exactly one "
    "tool per message, written as\n" + format_tool_call("NAME", {"ARG": "VALUE"}) + "\nTools:\n"
    + "\n".join(f"- {name}: {doc}. Example: {format_tool_call(name, args)}" for name, args, doc in TOOLS_DOC)
    + "\nMake the smallest change that fixes the issue, follow the code's conventions, do not edit the tests, "
    "then call submit."
)

SINGLE_TURN_SYSTEM = (
    "You fix issues in code repositories. Answer with a unified diff (git format, paths a/... and b/...) that "
    "fixes the issue with the smallest change; do not edit the tests."
)
REGION_SYSTEM = {
    "function": "You fix bugs in code. Answer with the code you are shown, fixed, in one ```python block: change "
                "only what the fix needs and keep every other line as it is.",
    "search_replace": "You fix bugs in code. Answer with SEARCH/REPLACE blocks: the file's path on a line, then\n"
                      "<<<<<<< SEARCH\n(lines copied exactly from the file)\n=======\n(the lines that replace "
                      "them)\n>>>>>>> REPLACE\nChange only what the fix needs.",
}
REGION_ASK = {
    "function": "Answer with this code, fixed, whole, in one ```python block.",
    "search_replace": "Answer with the SEARCH/REPLACE blocks that fix it.",
}


def agent_messages(instance: Instance) -> list[dict]:
    user = f"Repository: {instance.repo}\nIssue:\n{instance.problem_statement.strip()}\n"
    return [{"role": "system", "content": AGENT_SYSTEM}, {"role": "user", "content": user}]


def _is_test_path(path: str) -> bool:
    parts = path.lower().split("/")
    return any(p in {"test", "tests", "testing"} for p in parts[:-1]) or parts[-1].startswith("test_") or \
        parts[-1].endswith(("_test.py", "_test.go", "test.java", "tests.java"))


def _patch_files(patch: str) -> list[str]:
    return [ln[len("+++ b/"):].strip() for ln in patch.splitlines() if ln.startswith("+++ b/")]


def _first_hunk_line(patch: str, path: str) -> int | None:
    """The first source line the reference patch changes in `path` (1-based), or None."""
    from unidiff import PatchSet
    from unidiff.errors import UnidiffParseError

    try:
        files = PatchSet(patch)
    except UnidiffParseError:
        return None
    for f in files:
        if f.path == path and len(f):
            return f[0].source_start
    return None


def _window(text: str, centre: int, max_chars: int) -> tuple[str, int, int]:
    """Whole lines around line `centre` (1-based) within `max_chars`: (text, first line, last line)."""
    lines = text.splitlines(keepends=True)
    lo = hi = min(max(centre - 1, 0), max(len(lines) - 1, 0))
    used = len(lines[lo]) if lines else 0
    grew = True
    while grew:  # grow both ways in turn, so the changed line stays near the middle
        grew = False
        for side in (-1, 1):
            k = lo - 1 if side < 0 else hi + 1
            if 0 <= k < len(lines) and used + len(lines[k]) <= max_chars:
                used += len(lines[k])
                lo, hi = (k, hi) if side < 0 else (lo, k)
                grew = True
    return "".join(lines[lo : hi + 1])[:max_chars], lo + 1, hi + 1


def context_files(instance: Instance, repo: Path, max_chars: int) -> list[tuple[str, str]]:
    """Source shown in the single-turn prompt: the files the reference patch touches first (SWE-bench's "oracle"
    retrieval setting), then other non-test source files, within `max_chars` in all."""
    # The user's clone, read by commit (never a work tree a policy wrote): only base_commit's own files.
    tracked = [p for p in source_git(repo, "ls-tree", "-r", "--name-only", instance.base_commit).splitlines() if p]
    oracle = [p for p in _patch_files(instance.patch) if p in tracked]
    rest = sorted(p for p in tracked if p not in oracle and not _is_test_path(p)
                  and p.endswith((".py", ".go", ".java", ".js", ".ts", ".rs", ".c", ".h")))
    out, used = [], 0
    for path in oracle + rest:
        text = read_blob(repo, instance.base_commit, path)
        if text is None:
            continue
        if used + len(text) > max_chars:
            if path in oracle and not out:
                # At least one oracle file: a real module is larger than any prompt budget, and its head is not
                # where the bug is. Show the lines around the reference patch's first hunk, numbered in the
                # header, so a diff's context lines and hunk header can be copied from what is shown.
                start = _first_hunk_line(instance.patch, path)
                if start is None:
                    out.append((path, text[:max_chars]))
                else:
                    shown, lo, hi = _window(text, start, max_chars)
                    out.append((f"{path} (lines {lo}-{hi} of {text.count(chr(10)) + 1})", shown))
            break
        out.append((path, text))
        used += len(text)
    return out


def single_turn_messages(instance: Instance, repos_dir: Path, max_chars: int) -> list[dict]:
    repo = Path(repos_dir) / instance.repo_dirname
    files = context_files(instance, repo, max_chars)
    shown = "".join(f"--- {path}\n{text}{'' if text.endswith(chr(10)) else chr(10)}" for path, text in files)
    user = (f"Repository: {instance.repo}\nIssue:\n{instance.problem_statement.strip()}\n\n"
            f"Source files:\n{shown}\nAnswer with the unified diff only.")
    return [{"role": "system", "content": SINGLE_TURN_SYSTEM}, {"role": "user", "content": user}]


@dataclass
class SingleTurnPrompt:
    """The messages of a single-turn prompt and, for the `function` and `search_replace` formats, the region
    of code they show (what the answer is turned into a patch against)."""

    messages: list[dict]
    region: Region | None = None


def region_messages(edit_format: str, repo: str, statement: str, region: Region) -> list[dict]:
    """The `function` / `search_replace` prompt: the issue and the code around the fix. The same text for
    the policy's tasks and the warm start's mutation pairs (`trainer.mutation_data`)."""
    lang = "python" if region.path.endswith(".py") else ""
    what = f" (the function `{region.function}`)" if region.function else ""
    user = (f"Repository: {repo}\nIssue:\n{statement.strip()}\n\n"
            f"The code to fix, {region.path} lines {region.start}-{region.end}{what}:\n```{lang}\n{shown(region)}```\n"
            f"{REGION_ASK[edit_format]}")
    return [{"role": "system", "content": REGION_SYSTEM[edit_format]}, {"role": "user", "content": user}]


def instance_region(instance: Instance, repo: Path, *, max_lines: int, max_chars: int) -> Region:
    """The code a region prompt shows for a task: around the first line its reference patch changes, in the
    first file it touches (SWE-bench's oracle file), read from the task's own clone at `base_commit`."""
    files = _patch_files(instance.patch)
    if not files:
        raise ValueError(f"{instance.instance_id}: its reference patch names no file, so no code can be shown")
    path = files[0]
    text = read_blob(repo, instance.base_commit, path)
    if text is None:
        raise ValueError(f"{instance.instance_id}: cannot read {path} at its base commit")
    line = changed_line(instance.patch, path) or 1
    return find_region(path, text, line, max_lines=max_lines, max_chars=max_chars)


def read_blob(repo: Path, commit: str, path: str) -> str | None:
    """A file of the task's own clone at `commit` (None if there is none): what SEARCH blocks are matched on."""
    try:
        return source_git(repo, "cat-file", "blob", f"{commit}:{path}", binary=True).decode()
    except (GitError, UnicodeDecodeError):
        return None


def single_turn_prompt(instance: Instance, repos_dir: Path, max_chars: int, edit_format: str = "diff",
                       max_region_lines: int = 30) -> SingleTurnPrompt:
    """The single-turn prompt of `edit_format` for a task (`rollout.edit_format`)."""
    if edit_format == "diff":
        return SingleTurnPrompt(single_turn_messages(instance, repos_dir, max_chars))
    repo = Path(repos_dir) / instance.repo_dirname
    region = instance_region(instance, repo, max_lines=max_region_lines, max_chars=max_chars)
    return SingleTurnPrompt(region_messages(edit_format, instance.repo, instance.problem_statement, region), region)
