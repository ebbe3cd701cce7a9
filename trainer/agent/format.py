"""The tool-call format: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` (Hermes/Qwen style, which
common chat models follow) and diff extraction for the single-turn mode."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

TOOL_CALL_OPEN, TOOL_CALL_CLOSE = "<tool_call>", "</tool_call>"
_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.S)
_FENCE = re.compile(r"```(?:diff|patch)?[ \t]*\n(.*?)```", re.S)


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


def extract_diff(text: str) -> str:
    """The unified diff in a completion: a fenced ```diff block, else everything from the first diff header."""
    m = _FENCE.search(text)
    body = m.group(1) if m else text
    lines = body.splitlines(keepends=True)
    for i, line in enumerate(lines):
        if line.startswith(("diff --git ", "--- a/", "--- /dev/null")):
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
    A hunk whose lines reach the header's own counts ends there (what follows, up to the next header, is noise
    that `patch` would ignore too); any other hunk gets the counts of its lines. A blank line followed by more
    hunk lines is a blank context line whose leading space was dropped; prose after the diff is dropped. Start
    lines are kept (`git apply` finds a hunk near them). A patch without hunks is returned as it is."""
    lines = patch.splitlines()
    if not any(_HUNK.match(x) for x in lines):
        return patch
    out: list[str] = []
    hunk: _Hunk | None = None
    done = False  # the current hunk reached its declared counts: skip to the next header

    def close() -> None:
        if hunk is not None and (fixed := hunk.header()) is not None:
            out[hunk.at] = fixed

    for n, line in enumerate(lines):
        m = _HUNK.match(line)
        if m:
            close()
            done = False
            hunk = _Hunk(len(out), m.group(1), m.group(3), m.group(5), (int(m.group(2) or 1), int(m.group(4) or 1)))
            out.append(line)
            continue
        if line.startswith(_FILE_HEADER) and not (hunk and not done and line[:1] in "-+" and
                                                  not line.startswith(("--- a/", "+++ b/", "--- /dev/null"))):
            close()
            hunk, done = None, False
            out.append(line)
            continue
        if done:
            if line.startswith("\\"):  # "\ No newline at end of file" belongs to the line before it
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
            done = (hunk.old, hunk.new) == hunk.declared
        elif hunk:
            break  # prose after the diff
        else:
            out.append(line)
    close()
    return "\n".join(out) + "\n"
