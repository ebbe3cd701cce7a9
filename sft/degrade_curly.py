"""Go and Java degradations (brace languages): same defects as `degrade_py`, same contract.

There is no parser for these languages in the dependency set, so the edits are placed conservatively: a
character mask keeps strings and comments out of every search, functions are found by their header and
matching braces, and a defect goes only before a line that starts a statement. `--verify` in the sandbox is
the final check that a variant still compiles and passes.
"""

from __future__ import annotations

import re

from sft.degrade_common import (
    Edit,
    FileCtx,
    code_mask,
    indent_of,
    pick_new_name,
    rename_options,
    split_top_level,
)

_JAVA_MODIFIERS = {
    "public",
    "protected",
    "private",
    "static",
    "final",
    "synchronized",
    "abstract",
    "native",
    "default",
    "return",
    "new",
    "else",
    "throw",
    "case",
}
_GO_HEADER = re.compile(r"^func\s+(?:\([^)]*\)\s*)?(\w+)\s*\(")
_JAVA_HEADER = re.compile(
    r"^\s*(?:@\w+\s+)*(?:(?:public|protected|private|static|final|synchronized|abstract|native|default)\s+)*"
    r"(?:<[^>]+>\s*)?([\w.$]+(?:<[^(]*>)?(?:\[\])*)\s+(\w+)\s*\("
)
_CONTROL = ("if", "for", "while", "switch", "catch", "try", "else", "do", "synchronized", "return", "new")


class _Src:
    """A file's text with its code mask and line offsets, and the functions found in it."""

    def __init__(self, lines: list[str], language: str) -> None:
        self.lines, self.language = lines, language
        self.text = "".join(lines)
        self.mask = code_mask(self.text, language)
        self.offsets, pos = [], 0
        for ln in lines:
            self.offsets.append(pos)
            pos += len(ln)
        self.functions = self._functions()

    def line_of(self, offset: int) -> int:
        lo, hi = 0, len(self.offsets) - 1
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self.offsets[mid] <= offset:
                lo = mid
            else:
                hi = mid - 1
        return lo

    def header(self, i: int) -> tuple[str, str | None] | None:
        """(name, java return type or None) when line i starts a function or method declaration."""
        line = self.lines[i]
        if not line.strip() or not self.mask[self.offsets[i] + len(indent_of(line))]:
            return None
        if self.language == "go":
            m = _GO_HEADER.match(line)
            return (m.group(1), None) if m else None
        m = _JAVA_HEADER.match(line)
        if not m or m.group(1) in _JAVA_MODIFIERS or m.group(2) in _CONTROL or m.group(1) in _CONTROL:
            return None
        return m.group(2), m.group(1)

    def _functions(self) -> list[tuple[int, int, int, str]]:
        """(header line, line of the body's `{`, line of the closing `}`, name) for every function."""
        out = []
        for i in range(len(self.lines)):
            h = self.header(i)
            if not h:
                continue
            pos, depth, open_line = self.offsets[i], 0, None
            while pos < len(self.text):
                ch = self.text[pos]
                if self.mask[pos]:
                    if ch == ";" and open_line is None:
                        break  # abstract or interface method: no body
                    if ch == "{":
                        if open_line is None:
                            open_line = self.line_of(pos)
                        depth += 1
                    elif ch == "}" and open_line is not None:
                        depth -= 1
                        if depth == 0:
                            out.append((i, open_line, self.line_of(pos), h[0]))
                            break
                pos += 1
        return out

    def enclosing(self, line: int) -> tuple[int, int, int, str] | None:
        inside = [f for f in self.functions if f[1] < line < f[2]]
        return max(inside, key=lambda f: f[0]) if inside else None

    def code_line(self, i: int) -> str:
        """Line i with strings and comments blanked out."""
        start = self.offsets[i]
        return "".join(ch if self.mask[start + k] else " " for k, ch in enumerate(self.lines[i])).rstrip()


def _stmt_start(src: _Src, i: int) -> bool:
    """True when a new statement may be inserted before line i (inside a function body)."""
    if src.enclosing(i) is None:
        return False
    cur = src.code_line(i).strip()
    if not cur or cur.startswith(
        (
            "}",
            ")",
            ".",
            "case",
            "default",
            "else",
            "&&",
            "||",
            "+",
            "-",
            "?",
            ":",
            "super(",
            "this(",
            "catch",
            "finally",
        )
    ):
        return False
    j = i - 1
    while j >= 0 and not src.code_line(j).strip():
        j -= 1
    if j < 0:
        return False
    prev = src.code_line(j).strip()
    if prev.endswith(("{", "}", ";")):
        return True
    # Go has no semicolons: a line ending in an operand (not an operator or comma) ends its statement.
    return (
        src.language == "go" and bool(re.search(r"[\w)\]\"'`]$|\+\+$|--$", prev)) and not prev.endswith(",")
    )


def _anchor(src: _Src, ctx: FileCtx) -> int | None:
    ok = [a for a in ctx.anchors if _stmt_start(src, a)]
    return ok[0] if ok else None


def _insert(lines: list[str], at: int, new: list[str]) -> list[str]:
    return lines[:at] + new + lines[at:]


def _debug_stmt(language: str, where: str) -> str:
    if language == "go":
        return f'println("DEBUG {where}: reached")'  # builtin: needs no import, so the file still compiles
    return f'System.out.println("DEBUG {where}: reached");'


def debug_output(ctx: FileCtx, language: str) -> Edit | None:
    src = _Src(ctx.lines, language)
    at = _anchor(src, ctx)
    if at is None:
        return None
    fn = src.enclosing(at)
    text = indent_of(ctx.lines[at]) + _debug_stmt(language, fn[3]) + "\n"
    return Edit(_insert(ctx.lines, at, [text]), text, "adds a debug print left in the code")


def dead_helper(ctx: FileCtx, language: str) -> Edit | None:
    src = _Src(ctx.lines, language)
    name = pick_new_name(src.text, ["unusedHelper", "normalizeValue", "legacyImpl"])
    out = list(ctx.lines)
    if out and not out[-1].endswith("\n"):
        out[-1] += "\n"
    if language == "go":
        sig = f"func {name}(value interface{{}}) interface{{}} {{\n"
        return Edit(
            out + ["\n", sig, "\treturn value\n", "}\n"], sig, f"adds a function `{name}` nothing calls"
        )
    closes = [k for k, ch in enumerate(src.text) if ch == "}" and src.mask[k]]
    if not closes:
        return None
    last = src.line_of(closes[-1])
    sig = f"    private static Object {name}(Object value) {{\n"
    body = ["\n", sig, "        return value;\n", "    }\n"]
    return Edit(_insert(out, last, body), sig, f"adds a method `{name}` nothing calls (dead code)")


def commented_out_code(ctx: FileCtx, language: str) -> Edit | None:
    src = _Src(ctx.lines, language)
    at = _anchor(src, ctx)
    if at is None:
        return None
    old = [r.strip() for r in ctx.removed if r.strip() and not r.strip().startswith("//")]
    text = indent_of(ctx.lines[at]) + "// " + (old[0] if old else ctx.lines[at].strip()) + "\n"
    return Edit(_insert(ctx.lines, at, [text]), text, "leaves commented-out code")


def unrelated_edit(ctx: FileCtx, language: str) -> Edit | None:
    src = _Src(ctx.lines, language)
    note = ctx.rng.choice(
        [
            "// NOTE: this could be simplified later.",
            "// TODO: revisit this implementation.",
            "// Cleanup: keep this in sync with the callers.",
        ]
    )
    at = src.functions[0][0] if src.functions else 0
    while at > 0 and ctx.lines[at - 1].strip().startswith("@"):
        at -= 1  # keep Java annotations attached to their method
    text = (indent_of(ctx.lines[at]) if at < len(ctx.lines) else "") + note + "\n"
    return Edit(_insert(ctx.lines, at, [text]), text, "edits a file the fix does not need")


def reformat(ctx: FileCtx, language: str) -> Edit | None:
    src = _Src(ctx.lines, language)
    funcs = [f for f in src.functions if f[0] in ctx.untouched and f[0] == f[1]]
    ctx.rng.shuffle(funcs)
    for head, _, _, name in funcs:
        line = ctx.lines[head]
        m = re.match(r"^(\s*)(.*?\b" + re.escape(name) + r")\s*\(([^()]*)\)(.*\{\s*)$", line.rstrip("\n"))
        if not m or any(c in m.group(3) for c in "\"'`/"):
            continue
        params = split_top_level(m.group(3))
        if len(params) < 2:
            continue
        ind = m.group(1)
        if language == "go":
            new = [f"{ind}{m.group(2)}(\n"] + [f"{ind}\t{p},\n" for p in params] + [f"{ind}){m.group(4)}\n"]
        else:
            new = [f"{ind}{m.group(2)}(\n"] + [f"{ind}        {p},\n" for p in params[:-1]]
            new += [f"{ind}        {params[-1]}){m.group(4)}\n"]
        return Edit(
            ctx.lines[:head] + new + ctx.lines[head + 1 :],
            new[1],
            f"reformats the untouched signature of `{name}`",
        )
    return None


def duplicated_logic(ctx: FileCtx, language: str) -> Edit | None:
    src = _Src(ctx.lines, language)
    fns = [src.enclosing(a) for a in ctx.anchors]
    fn = next((f for f in fns if f), None)
    if fn is None:
        return None
    head, _, end, name = fn
    new_name = pick_new_name(src.text, [f"{name}Copy", f"{name}Impl", f"{name}V2"])
    body = ctx.lines[head : end + 1]
    first = re.sub(rf"\b{re.escape(name)}(\s*\()", rf"{new_name}\1", body[0], count=1)
    copy = ["\n", first] + body[1:]
    out = ctx.lines[: end + 1] + copy + ctx.lines[end + 1 :]
    return Edit(out, first, f"duplicates the logic of `{name}` in a second function `{new_name}`")


_JAVA_SIMPLE = re.compile(r"^(return\b.*;|throw\b.*;|[\w.\[\]]+\s*(?:[-+*/]?=|\+\+|--).*;|[\w.]+\(.*\)\s*;)$")


def broad_except(ctx: FileCtx, language: str) -> Edit | None:
    src = _Src(ctx.lines, language)
    if language == "go":
        fns = [src.enclosing(a) for a in ctx.anchors]
        fn = next((f for f in fns if f), None)
        if fn is None:
            return None
        ind = indent_of(ctx.lines[fn[1]]) + "\t"
        # Go has no try/except; the equivalent catch-all is a deferred recover. Re-panicking keeps behaviour.
        new = [
            f"{ind}defer func() {{\n",
            f"{ind}\tif r := recover(); r != nil {{\n",
            f"{ind}\t\tpanic(r)\n",
            f"{ind}\t}}\n",
            f"{ind}}}()\n",
        ]
        return Edit(
            _insert(ctx.lines, fn[1] + 1, new), new[1], "adds a catch-all recover() that adds nothing"
        )
    for a in ctx.anchors:
        stmt = src.code_line(a).strip()
        if not _stmt_start(src, a) or not _JAVA_SIMPLE.match(stmt) or "->" in stmt:
            continue
        ind = indent_of(ctx.lines[a])
        new = [
            f"{ind}try {{\n",
            "    " + ctx.lines[a],
            f"{ind}}} catch (RuntimeException e) {{\n",
            f"{ind}    throw e;\n",
            f"{ind}}}\n",
        ]
        return Edit(
            ctx.lines[:a] + new + ctx.lines[a + 1 :], new[2], "wraps code in a broad catch that adds nothing"
        )
    return None


_GO_DECL = re.compile(r"^\s*(\w+)(?:\s*,\s*\w+)*\s*:=")
_JAVA_DECL = re.compile(r"^\s*(?:final\s+)?([\w.]+(?:<[^;=()]*>)?(?:\[\])*)\s+(\w+)\s*(?:=|;)")


def rename_outside_fix(ctx: FileCtx, language: str) -> Edit | None:
    src = _Src(ctx.lines, language)
    funcs = [f for f in src.functions if all(i in ctx.untouched for i in range(f[0], f[2] + 1))]
    ctx.rng.shuffle(funcs)
    for head, _, end, fname in funcs:
        names = []
        for i in range(head + 1, end):
            code = src.code_line(i)
            m = _GO_DECL.match(code) if language == "go" else _JAVA_DECL.match(code)
            if m:
                var = m.group(1) if language == "go" else m.group(2)
                if language == "java" and m.group(1) in _JAVA_MODIFIERS | {"return", "throw", "yield"}:
                    continue
                names.append(var)
        for var in names:
            if (
                var in {"_", "err", "ok", "e"}
                or len(var) < 2
                or re.search(rf"\b{var}\b", src.code_line(head))
            ):
                continue
            new = pick_new_name(src.text, rename_options(var, camel=True))
            lo, hi = src.offsets[head + 1], src.offsets[end]
            rx = re.compile(rf"(?<![\w.]){re.escape(var)}\b(?!\s*\()(?!\s*:(?!=))")
            hits = [m.start() for m in rx.finditer(src.text, lo, hi) if src.mask[m.start()]]
            total = len(re.findall(rf"\b{re.escape(var)}\b", src.text[lo:hi]))
            if len(hits) < 2 or len(hits) != total:
                continue  # some use is one we cannot rename safely (a field, a key, a string): skip the name
            text = src.text
            for pos in reversed(hits):
                text = text[:pos] + new + text[pos + len(var) :]
            out = text.splitlines(keepends=True)
            first = next(i for i in range(head, len(out)) if re.search(rf"\b{new}\b", out[i]))
            return Edit(out, out[first], f"renames `{var}` to `{new}` in `{fname}`, outside the fix")
    return None
