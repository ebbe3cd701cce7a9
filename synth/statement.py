"""Problem statements: written from what the failing tests say — their names and assertion messages — and never
from the diff. An exception message can still quote code (a `SyntaxError`, a message built from source text), so
every message line that contains a line the gold patch changes is left out (`leaks` finds them; a test holds the
whole task set to it).
"""

from __future__ import annotations

import re

MAX_TESTS = 5
MAX_MESSAGE_LINES = 3
MAX_LINE = 240
MIN_LEAK = 6  # shorter changed lines (`pass`, `else:`, `)`) are everywhere in prose and carry no bug
# `<object at 0x7f…>` differs per run, and pytest's shortened reprs cut the `0` off (`<mod....x7fec0afefe90>`).
_ADDRESS = re.compile(r"(?<![0-9A-Za-z_])0?x[0-9a-fA-F]{6,}\b")
# unittest's shortened reprs (`[59 chars]d00>`) and pytest's (`...afefe90>`) can cut an address anywhere, leaving
# a few of its hex digits on either side of the cut: `0x7f[59 chars]`, `[59 chars]d00>`.
_CUT_HEAD = re.compile(r"(?<![0-9A-Za-z_])0?x[0-9a-fA-F]{0,16}(?=\[\d+ chars\]|\.\.\.)")
_CUT_TAIL = re.compile(r"(\[\d+ chars\]|\.\.\.)[0-9a-fA-F]{1,16}>")


class Leak(ValueError):
    """The statement would quote the gold patch (only a test name can still do that): the task is dropped."""


def changed_lines(patch: str) -> list[str]:
    """The stripped lines a patch removes or adds (file headers excluded), long enough to mean something."""
    out = []
    for line in patch.splitlines():
        if line[:1] in "+-" and not line.startswith(("+++ ", "--- ")):
            text = line[1:].strip()
            if len(text) >= MIN_LEAK:
                out.append(text)
    return out


def leaks(text: str, patch: str) -> list[str]:
    """The changed lines of `patch` that appear in `text` (whitespace runs compared as one space)."""
    flat = " ".join(text.split())
    return [line for line in changed_lines(patch) if " ".join(line.split()) in flat]


def _clean(message: str) -> list[str]:
    return [_CUT_TAIL.sub(r"\1…>", _CUT_HEAD.sub("0x…", _ADDRESS.sub("0x…", line.strip())))
            for line in message.splitlines()]


def stable_messages(runs: list[dict[str, str]]) -> dict[str, str]:
    """Each test's message reduced to the lines every run printed: what depends on the run (the clock in a
    `where 2026 = datetime.now().year` line, an address pytest's reprs cut short) would make two syntheses of
    the same task word it differently."""
    if not runs:
        return {}
    out = {}
    for test, message in runs[0].items():
        others = [set(_clean(r.get(test, ""))) for r in runs[1:]]
        out[test] = "\n".join(line for line in _clean(message) if all(line in o for o in others))
    return out


def _message_lines(message: str, patch: str) -> list[str]:
    out = []
    for line in _clean(message):
        if not line or line.startswith(("Use -v", "Full diff:")) or leaks(line, patch):
            continue
        out.append(line if len(line) <= MAX_LINE else line[:MAX_LINE - 1] + "…")
        if len(out) == MAX_MESSAGE_LINES:
            break
    return out


def problem_statement(project: str, failing: list[str], messages: dict[str, str], patch: str) -> str:
    """The issue text of a synthesized task: which tests fail and what they report, nothing of the fix."""
    n = len(failing)
    head = f"{n} test{'s' if n != 1 else ''} of {project} fail{'s' if n == 1 else ''}:" if n else \
        f"Tests of {project} fail."
    lines = [head, ""]
    for test in failing[:MAX_TESTS]:
        lines.append(f"- `{test}`")
        lines += [f"  {m}" for m in _message_lines(messages.get(test, ""), patch)]
    if n > MAX_TESTS:
        lines.append(f"- and {n - MAX_TESTS} more")
    lines += ["", "The tests are right and the library code is wrong: make them pass without changing the tests."]
    text = "\n".join(lines) + "\n"
    if leaks(text, patch):
        raise Leak(f"the failing tests' names quote the fix: {leaks(text, patch)[0]!r}")
    return text
