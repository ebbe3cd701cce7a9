"""The tool-call format: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` (Hermes/Qwen style, which
common chat models follow) and diff extraction for the single-turn mode."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

TOOL_CALL_OPEN, TOOL_CALL_CLOSE = "<tool_call>", "</tool_call>"
_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.S)
# A fenced block: the opening fence with its info string (```diff, ```python), its body, and the closing fence
# (or the end of the text: a completion cut by the token limit). Matched pairwise, so the closing fence of one
# block is never read as the opening of the next.
_BLOCK = re.compile(r"^[ \t]*```[ \t]*([\w+.-]*)[^\n]*\n(.*?)(?:^[ \t]*```[ \t]*$|\Z)", re.S | re.M)
_DIFF_START = ("diff --git ", "--- a/", "--- /dev/null")


@dataclass
class ToolCall:
    name: str
    arguments: dict = field(default_factory=dict)


@dataclass
class FormatError:
    message: str


def format_tool_call(name: str, arguments: dict) -> str:
    return f"{TOOL_CALL_OPEN}{json.dumps({'name': name, 'arguments': arguments})}{TOOL_CALL_CLOSE}"


def parse_tool_call(text: str) -> ToolCall | FormatError:
    """The first tool call in an assistant message. A message without one is a format error the agent is told
    about (and may fix next turn), not a crash."""
    m = _CALL.search(text)
    if not m:
        if TOOL_CALL_OPEN in text:
            body = text.split(TOOL_CALL_OPEN, 1)[1]
        else:
            return FormatError(f"no tool call found; reply with {TOOL_CALL_OPEN}{{\"name\": ..., "
                               f"\"arguments\": {{...}}}}{TOOL_CALL_CLOSE}")
    else:
        body = m.group(1)
    try:
        obj = json.loads(body)
    except json.JSONDecodeError as exc:
        return FormatError(f"the tool call is not valid JSON ({exc.msg} at char {exc.pos})")
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return FormatError('the tool call must be a JSON object with a string "name"')
    args = obj.get("arguments", {})
    if isinstance(args, str):  # some models emit arguments as a JSON string (OpenAI style)
        try:
            args = json.loads(args)
        except json.JSONDecodeError:
            return FormatError('"arguments" must be a JSON object')
    if not isinstance(args, dict):
        return FormatError('"arguments" must be a JSON object')
    return ToolCall(obj["name"], args)


def code_blocks(text: str) -> list[tuple[str, str]]:
    """The fenced code blocks of a completion, in order: (info string lower-cased, e.g. `diff`, `python` or '';
    body)."""
    return [(m.group(1).lower(), m.group(2)) for m in _BLOCK.finditer(text)]


def _has_diff_header(body: str) -> bool:
    return any(line.startswith(_DIFF_START) for line in body.splitlines())


def extract_diff(text: str) -> str:
    """The unified diff in a completion: the first fenced ```diff (or ```patch) block, else the first fenced
    block that holds a diff header, else the text itself; from its first diff header on."""
    blocks = code_blocks(text)
    body = next((b for lang, b in blocks if lang in ("diff", "patch")), None)
    if body is None:
        body = next((b for _, b in blocks if _has_diff_header(b)), text)
    lines = body.splitlines(keepends=True)
    for i, line in enumerate(lines):
        if line.startswith(_DIFF_START):
            body = "".join(lines[i:])
            break
    else:
        return ""
    if "```" in body:
        body = body.split("```", 1)[0]
    return recount_hunks(body if body.endswith("\n") else body + "\n")


_HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@(.*)$")
_FILE_HEADER = ("diff --git ", "--- ", "+++ ", "index ", "new file mode", "deleted file mode", "old mode ", "new mode ",
                "similarity index", "rename from", "rename to")


@dataclass
class _Hunk:
    at: int  # the header's index in the output
    old_start: str
    new_start: str
    trailer: str  # what follows the second `@@` (a function name)
    declared: tuple[int, int]  # (old, new) line counts the header claims
    old: int = 0
    new: int = 0

    def header(self) -> str | None:
        """The corrected header, or None when the declared counts were right."""
        if (self.old, self.new) == self.declared:
            return None
        return f"@@ -{self.old_start},{self.old} +{self.new_start},{self.new} @@{self.trailer}"


def recount_hunks(patch: str) -> str:
    """Hunk headers whose line counts match their hunks, as `git apply --recount` makes them: a model writes the
    changed lines right far more often than it counts them, and one wrong count makes a whole patch malformed.
    Every hunk gets the counts of all its lines — each line that starts with ' ', '-', '+' or '\\' up to the
    next header or the first line of prose — whatever its header declared: a hunk is never cut at the declared
    counts, since that would turn the policy's `-old` + `+new` into a patch it did not write (a bare deletion).
    A blank line followed by more hunk lines is a blank context line whose leading space was dropped; prose
    after the diff is dropped. Start lines are kept (`git apply` finds a hunk near them). A patch without hunks
    is returned as it is."""
    lines = patch.splitlines()
    if not any(_HUNK.match(x) for x in lines):
        return patch
    out: list[str] = []
    hunk: _Hunk | None = None

    def close() -> None:
        if hunk is not None and (fixed := hunk.header()) is not None:
            out[hunk.at] = fixed

    for n, line in enumerate(lines):
        m = _HUNK.match(line)
        if m:
            close()
            hunk = _Hunk(len(out), m.group(1), m.group(3), m.group(5), (int(m.group(2) or 1), int(m.group(4) or 1)))
            out.append(line)
            continue
        if line.startswith(_FILE_HEADER) and not (hunk and line[:1] in "-+" and
                                                  not line.startswith(("--- a/", "+++ b/", "--- /dev/null"))):
            close()
            hunk = None
            out.append(line)
            continue
        if hunk and line == "":
            following = lines[n + 1] if n + 1 < len(lines) else ""
            if following[:1] not in (" ", "-", "+"):
                continue
            line = " "
        if hunk and line[:1] in (" ", "-", "+", "\\"):
            out.append(line)
            hunk.old += line[0] in " -"
            hunk.new += line[0] in " +"
        elif hunk:
            break  # prose after the diff
        else:
            out.append(line)
    close()
    return "\n".join(out) + "\n"
