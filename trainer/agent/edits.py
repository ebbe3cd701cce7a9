"""Edit formats of the single-turn policy: what the answer looks like, and how it becomes the unified diff that
the sandbox applies, the grader judges and the reward is computed on (`rollout.edit_format`).

- `diff`: a unified diff (fenced or bare); hunk counts recounted by `git apply --recount`'s rule.
- `function`: the code the prompt shows — the function around the line the fix changes, or a window of it when
  the function is longer than the prompt allows (a `Region`) — rewritten whole in one ```python block; the
  region is replaced by it and the file diffed.
- `search_replace`: Aider/Agentless SEARCH/REPLACE blocks, each SEARCH text found exactly once in its file.

Whatever the format, the patch is made by `difflib` and checked by `unidiff`; an answer that does not parse into a
patch (no block, a SEARCH text that is not in the file, code that is not Python, a diff unidiff refuses) is a
`FormatError` — the rollout's patch is empty (reward 0) and the reason is kept — never a different patch.
"""

from __future__ import annotations

import ast
import difflib
import re
import textwrap
from collections.abc import Callable
from dataclasses import dataclass

from trainer.agent.format import FormatError, code_blocks, extract_diff

EDIT_FORMATS = ("diff", "function", "search_replace")
_SR = re.compile(r"^[ \t]*<{5,9} SEARCH[ \t]*\n(.*?)^[ \t]*={5,9}[ \t]*\n(.*?)^[ \t]*>{5,9} REPLACE[ \t]*$", re.S | re.M)
_PATHLIKE = re.compile(r"^[\w./-]+\.\w+$")


def split_lines(text: str) -> list[str]:
    """Lines as git and `ast` count them: split at "\\n" only (`str.splitlines` also splits at form feeds and
    other separators that source files hold), each with its newline."""
    parts = text.split("\n")
    return [x + "\n" for x in parts[:-1]] + ([parts[-1]] if parts[-1] else [])


@dataclass(frozen=True)
class Region:
    """Lines `start`..`end` (1-based, inclusive) of the file `path` (`text`: the whole file at the base commit):
    what the prompt shows and the `function` format rewrites. `function` is the function's name when the region
    is the whole function (its `def` and decorators included), None for a window of lines."""

    path: str
    text: str
    start: int
    end: int
    function: str | None = None

    @property
    def body(self) -> str:
        return "".join(split_lines(self.text)[self.start - 1 : self.end])

    def replaced(self, new_body: str) -> str:
        """The file with the region's lines replaced by `new_body` (the file's own last-line newline kept)."""
        lines = split_lines(self.text)
        if new_body and not new_body.endswith("\n") and self.end < len(lines):
            new_body += "\n"
        elif self.end >= len(lines) and not self.text.endswith("\n"):
            new_body = new_body.removesuffix("\n")
        return "".join(lines[: self.start - 1]) + new_body + "".join(lines[self.end :])


def changed_line(patch: str, path: str) -> int | None:
    """The first line of `path` that `patch` changes, in the file before it (1-based): the first removed line,
    or for a pure insertion the line it follows. None when the patch does not touch `path`."""
    from unidiff import PatchSet
    from unidiff.errors import UnidiffParseError

    try:
        files = PatchSet(patch)
    except UnidiffParseError:
        return None
    for f in files:
        if f.path != path:
            continue
        for hunk in f:
            prev = hunk.source_start - 1
            for line in hunk:
                if line.is_removed:
                    return line.source_line_no
                if line.is_added:
                    return max(prev, 1)
                prev = line.source_line_no or prev
    return None


def _function_at(text: str, line: int) -> tuple[int, int, str] | None:
    """(first line with decorators, last line, name) of the innermost function holding `line`."""
    from sft.degrade_py import enclosing_function

    try:
        fn = enclosing_function(ast.parse(text), line)
    except (SyntaxError, ValueError):
        return None
    if fn is None:
        return None
    return min([fn.lineno, *(d.lineno for d in fn.decorator_list)]), fn.end_lineno or fn.lineno, fn.name


def find_region(path: str, text: str, line: int, *, max_lines: int, max_chars: int) -> Region:
    """The innermost function around `line` when it fits `max_lines` and `max_chars`; else whole lines around
    `line` within it (within the file when no function holds the line), at most `max_lines` and `max_chars`."""
    lines = split_lines(text)
    n = max(len(lines), 1)
    line = min(max(line, 1), n)
    lo, hi, name = _function_at(text, line) or (1, n, None)
    if hi - lo + 1 <= max_lines and sum(len(x) for x in lines[lo - 1 : hi]) <= max_chars:
        return Region(path, text, lo, hi, name)
    a = b = line
    used = len(lines[line - 1]) if lines else 0
    grew = True
    while grew:  # grow both ways in turn, so the changed line stays near the middle
        grew = False
        for k in (a - 1, b + 1):
            if lo <= k <= hi and b - a + 1 < max_lines and used + len(lines[k - 1]) <= max_chars:
                used += len(lines[k - 1])
                a, b = min(a, k), max(b, k)
                grew = True
    while a < line and not lines[a - 1].strip():  # a window starts and ends on code, not on blank lines
        a += 1
    while b > line and not lines[b - 1].strip():
        b -= 1
    return Region(path, text, a, b, None)


def make_diff(path: str, old: str, new: str) -> str:
    """The unified diff (git's a/ b/ form, 3 context lines) that turns `old` into `new`; '' when they are
    equal. A last line without its newline gets git's marker."""
    if old == new:
        return ""
    out = [f"diff --git a/{path} b/{path}\n"]
    for line in difflib.unified_diff(split_lines(old), split_lines(new),
                                     f"a/{path}", f"b/{path}", n=3):
        if line.startswith(("--- ", "+++ ")):
            line = line.rstrip() + "\n"  # difflib appends a tab and no date
        out.append(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n")
    return "".join(out)


def check_diff(patch: str) -> FormatError | None:
    """A FormatError unless `unidiff` reads `patch` as at least one file's hunks."""
    from unidiff import PatchSet
    from unidiff.errors import UnidiffParseError

    try:
        files = PatchSet(patch)
    except UnidiffParseError as exc:
        return FormatError(f"the diff does not parse: {exc}")
    if not any(len(f) for f in files):
        return FormatError("the diff has no hunks")
    return None


def _python_block(text: str) -> str | None:
    blocks = code_blocks(text)
    return next((b for lang, b in blocks if lang in ("python", "py", "python3")), blocks[0][1] if blocks else None)


def shown(region: Region) -> str:
    """The region as the prompt shows it: dedented (a method reads as a plain function)."""
    return textwrap.dedent(region.body)


def _indent(text: str) -> str:
    """The common indentation `textwrap.dedent` takes off `text`."""
    for old, new in zip(text.splitlines(), textwrap.dedent(text).splitlines(), strict=True):
        if old.strip():
            return old[: len(old) - len(new)]
    return ""


def _from_function(answer: str, region: Region) -> str | FormatError:
    code = _python_block(answer)
    if code is None:
        return FormatError("no ```python block in the answer")
    code = textwrap.dedent(code).strip("\n")
    if not code.strip():
        return FormatError("the ```python block is empty")
    try:
        tree = ast.parse(code)
    except SyntaxError as exc:
        if region.function is not None:
            return FormatError(f"the code does not parse ({exc.msg}, line {exc.lineno})")
        tree = None  # a window of a function need not parse on its own; the whole file is checked below
    if region.function is not None and tree is not None:
        defs = [s for s in tree.body if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef))]
        if len(tree.body) != 1 or not defs or defs[0].name != region.function:
            return FormatError(f"the answer must be the whole function `{region.function}`, and only it")
    lines = split_lines(region.body)
    blank = [not x.strip() for x in lines]
    lead = blank.index(False) if False in blank else len(lines)
    trail = blank[::-1].index(False) if False in blank else 0
    # the region's own blank lines before and after its code stay: an answer is compared by its code
    body = "".join(lines[:lead]) + textwrap.indent(code, _indent(region.body), lambda x: bool(x.strip())) + "\n" \
        + "".join(lines[len(lines) - trail:])
    new = region.replaced(body)
    if region.path.endswith(".py"):
        try:
            ast.parse(new)
        except SyntaxError as exc:
            return FormatError(f"the file does not parse with the new code ({exc.msg}, line {exc.lineno})")
    return make_diff(region.path, region.text, new)


def occurrences(text: str, part: str) -> int:
    """How many places `part` is found at in `text`, overlapping ones too (`str.count` skips those, and a SEARCH
    text found twice that way is as ambiguous as any)."""
    count, at = 0, text.find(part)
    while at >= 0 and part:
        count, at = count + 1, text.find(part, at + 1)
    return count


def _from_search_replace(answer: str, region: Region, read: Callable[[str], str | None]) -> str | FormatError:
    matches = list(_SR.finditer(answer))
    if not matches:
        return FormatError("no <<<<<<< SEARCH / ======= / >>>>>>> REPLACE block in the answer")
    files: dict[str, tuple[str, str]] = {}  # path -> (original, edited)
    for k, m in enumerate(matches, 1):
        # the file a block edits: the path on a line of its own before it (after the previous block), if any
        gap = answer[matches[k - 2].end() if k > 1 else 0 : m.start()]
        named = [x.strip().strip("`*") for x in gap.splitlines() if x.strip() and not x.strip().startswith("```")]
        path = named[-1] if named and _PATHLIKE.match(named[-1]) else region.path
        if path not in files:
            text = region.text if path == region.path else read(path)
            if text is None:
                return FormatError(f"block {k}: no file {path} in the repository")
            files[path] = (text, text)
        search, replace = m.group(1), m.group(2)
        if not search.strip():
            return FormatError(f"block {k}: the SEARCH part is empty")
        text = files[path][1]
        count = occurrences(text, search)
        if not count and not text.endswith("\n") and text.endswith(search[:-1]) and occurrences(text, search[:-1]) == 1:
            # a block always ends its lines; the file's last line has no newline to match
            search, replace, count = search[:-1], replace.removesuffix("\n"), 1
        if count != 1:
            return FormatError(f"block {k}: the SEARCH text is {'not in' if not count else 'not unique in'} {path}"
                               f"{'' if not count else f' ({count} places)'}")
        files[path] = (files[path][0], text.replace(search, replace, 1))
    patch = "".join(make_diff(p, old, new) for p, (old, new) in files.items())
    return patch


def to_patch(edit_format: str, answer: str, region: Region | None,
             read: Callable[[str], str | None] = lambda _p: None) -> str | FormatError:
    """The unified diff an answer in `edit_format` stands for (`region`: what the prompt showed; `read(path)`: a
    file at the base commit, for SEARCH/REPLACE blocks on other files), or a FormatError. An answer that parses
    and changes nothing gives '' (the sandbox's `empty_patch`)."""
    if edit_format == "diff":
        patch = extract_diff(answer)
        if not patch:
            return FormatError("no unified diff in the answer")
    elif region is None:
        raise ValueError(f"edit format {edit_format!r} needs the region the prompt showed")
    elif edit_format == "function":
        patch = _from_function(answer, region)
    elif edit_format == "search_replace":
        patch = _from_search_replace(answer, region, read)
    else:
        raise ValueError(f"unknown edit format {edit_format!r}; known: {', '.join(EDIT_FORMATS)}")
    if isinstance(patch, FormatError) or not patch:
        return patch
    return check_diff(patch) or patch


def _search_blocks(region: Region, new_text: str, context: int = 1) -> list[tuple[str, str]]:
    """(SEARCH, REPLACE) pairs turning the region's file into `new_text`: each change with `context` lines around
    it, widened until its SEARCH text is unique in the file."""
    old_lines, new_lines = split_lines(region.text), split_lines(new_text)
    out = []
    for group in difflib.SequenceMatcher(None, old_lines, new_lines, autojunk=False).get_grouped_opcodes(context):
        i1, i2, j1, j2 = group[0][1], group[-1][2], group[0][3], group[-1][4]
        while True:
            search = "".join(old_lines[i1:i2])
            if occurrences(region.text, search) == 1 and search.strip() or (i1 == 0 and i2 == len(old_lines)):
                break
            i1, j1 = max(i1 - 1, 0), max(j1 - 1, 0)
            i2, j2 = min(i2 + 1, len(old_lines)), min(j2 + 1, len(new_lines))
        out.append((search, "".join(new_lines[j1:j2])))
    return out


def _eol(text: str) -> str:
    return text if not text or text.endswith("\n") else text + "\n"


def ideal_answer(edit_format: str, region: Region, new_text: str) -> str:
    """The answer a policy should write in `edit_format` when the right file is `new_text` (the SFT target)."""
    if edit_format == "diff":
        return f"```diff\n{make_diff(region.path, region.text, new_text)}```"
    if edit_format == "function":
        old = split_lines(region.text)
        new = split_lines(new_text)
        # the region's lines in the new file: the same lines before it and after it
        body = "".join(new[region.start - 1 : len(new) - (len(old) - region.end)])
        return f"```python\n{textwrap.dedent(body).strip(chr(10)).rstrip()}\n```"
    if edit_format == "search_replace":
        blocks = [f"{region.path}\n<<<<<<< SEARCH\n{_eol(s)}=======\n{_eol(r)}>>>>>>> REPLACE"
                  for s, r in _search_blocks(region, new_text)]
        return "\n\n".join(blocks)
    raise ValueError(f"unknown edit format {edit_format!r}; known: {', '.join(EDIT_FORMATS)}")


def patched(text: str, patch: str, path: str) -> str | None:
    """`text` (the file `path` before `patch`) with the patch's hunks for it applied exactly — no fuzz, no
    offsets: the reference fix of a task, turned into the file an answer should produce. None when a hunk's
    lines are not where it says."""
    from unidiff import PatchSet
    from unidiff.errors import UnidiffParseError

    try:
        files = [f for f in PatchSet(patch) if f.path == path]
    except UnidiffParseError:
        return None
    lines, out, pos = split_lines(text), [], 0
    for hunk in (h for f in files for h in f):
        source, target = _sides(hunk)
        start = hunk.source_start - (1 if hunk.source_length else 0)
        if start < pos or lines[start : start + len(source)] != source:
            return None
        out += lines[pos:start] + target
        pos = start + len(source)
    return "".join(out + lines[pos:])


def _sides(hunk: object) -> tuple[list[str], list[str]]:
    """A hunk's lines before and after, each with its newline unless a `\\ No newline` marker follows it."""
    source: list[str] = []
    target: list[str] = []
    last: list[list[str]] = []
    for x in hunk:  # type: ignore[attr-defined]
        if x.line_type == "\\":
            for side in last:
                side[-1] = side[-1].removesuffix("\n")
            continue
        value = x.value if x.value.endswith("\n") else x.value + "\n"
        last = ([] if x.is_added else [source]) + ([] if x.is_removed else [target])
        for side in last:
            side.append(value)
    return source, target


def as_answer(edit_format: str, region: Region, patch: str) -> str | None:
    """`patch` written as the ideal answer in `edit_format` to a prompt showing `region`, or None when it cannot
    be: it changes another file, or lines the region does not hold (the answer must turn back into exactly the
    file the patch makes)."""
    from unidiff import PatchSet
    from unidiff.errors import UnidiffParseError

    try:
        if [f.path for f in PatchSet(patch)] != [region.path]:
            return None
    except UnidiffParseError:
        return None
    new = patched(region.text, patch, region.path)
    if new is None or new == region.text:
        return None
    answer = ideal_answer(edit_format, region, new)
    back = to_patch(edit_format, answer, region)
    return answer if back == make_diff(region.path, region.text, new) else None
