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
    return body if body.endswith("\n") else body + "\n"
