"""Python degradations: each takes a file's lines (after the gold patch) and returns edited lines, or None.

Every edit keeps the program's behaviour (the variant must still pass the task's tests) while adding one quality
defect a reviewer should flag. The `ast` and `tokenize` modules decide where an edit is safe, so nothing here
guesses at Python syntax with regexes except the one-line signature split, which `ast` then re-checks.
"""

from __future__ import annotations

import ast
import io
import keyword
import re
import tokenize

from sft.degrade_common import Edit, FileCtx, indent_of, pick_new_name, rename_options, split_top_level

_SIMPLE = (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Expr, ast.Return, ast.Raise, ast.Assert, ast.Delete)


def _parse(lines: list[str]) -> ast.Module | None:
    try:
        return ast.parse("".join(lines))
    except SyntaxError:
        return None


def _functions(tree: ast.Module) -> list[ast.FunctionDef | ast.AsyncFunctionDef]:
    return [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)]


def enclosing_function(tree: ast.Module, line: int) -> ast.FunctionDef | ast.AsyncFunctionDef | None:
    best = None
    for fn in _functions(tree):
        if fn.lineno <= line <= (fn.end_lineno or fn.lineno):
            if best is None or fn.lineno > best.lineno:
                best = fn
    return best


def _anchor_stmt(tree: ast.Module, anchors: list[int], lines: list[str]) -> ast.stmt | None:
    """A simple one-line statement added by the gold patch, inside a function (0-based anchor indexes)."""
    wanted = {a + 1 for a in anchors}
    for node in ast.walk(tree):
        if not isinstance(node, _SIMPLE):
            continue
        line = lines[node.lineno - 1]
        # The statement must own its line (not `if x: return y`), so edits around it stay well-formed.
        starts_line = len(line) - len(line.lstrip()) == node.col_offset
        if starts_line and node.lineno in wanted and node.end_lineno == node.lineno:
            if enclosing_function(tree, node.lineno) is not None and '"""' not in lines[node.lineno - 1]:
                return node
    return None


def debug_output(ctx: FileCtx) -> Edit | None:
    lines, anchors = ctx.lines, ctx.anchors
    tree = _parse(lines)
    stmt = tree and _anchor_stmt(tree, anchors, lines)
    if not stmt:
        return None
    fn = enclosing_function(tree, stmt.lineno)
    ind = indent_of(lines[stmt.lineno - 1])
    text = f'{ind}print("DEBUG {fn.name}: reached line {stmt.lineno}")\n'
    # Before a return/raise the print still runs; after any other statement it shows the new state.
    at = stmt.lineno - 1 if isinstance(stmt, ast.Return | ast.Raise) else stmt.lineno
    return Edit(lines[:at] + [text] + lines[at:], text, "adds a debug print() left in the code")


def dead_helper(ctx: FileCtx) -> Edit | None:
    lines = ctx.lines
    tree = _parse(lines)
    if tree is None:
        return None
    name = pick_new_name("".join(lines), ["_normalize_value", "_helper_unused", "_coerce_input", "_old_impl"])
    sig = f"def {name}(value):\n"
    body = [
        "\n",
        "\n",
        sig,
        '    """Return the value unchanged (kept for later use)."""\n',
        "    return value\n",
    ]
    out = list(lines)
    if out and not out[-1].endswith("\n"):
        out[-1] += "\n"
    return Edit(out + body, sig, f"adds a helper `{name}` that nothing calls (dead code)")


def commented_out_code(ctx: FileCtx) -> Edit | None:
    lines, anchors = ctx.lines, ctx.anchors
    tree = _parse(lines)
    stmt = tree and _anchor_stmt(tree, anchors, lines)
    if not stmt:
        return None
    ind = indent_of(lines[stmt.lineno - 1])
    old = [r.strip() for r in ctx.removed if r.strip() and not r.strip().startswith("#")]
    src = old[0] if old else lines[stmt.lineno - 1].strip()
    text = f"{ind}# {src}\n"
    at = stmt.lineno - 1
    return Edit(lines[:at] + [text] + lines[at:], text, "leaves commented-out code")


def unrelated_edit(ctx: FileCtx) -> Edit | None:
    lines, rng = ctx.lines, ctx.rng
    tree = _parse(lines)
    if tree is None:
        return None
    fns = [f for f in tree.body if isinstance(f, ast.FunctionDef | ast.ClassDef)]
    note = rng.choice(
        [
            "# NOTE: this could be simplified later.",
            "# TODO: revisit this implementation.",
            "# Cleanup: keep this in sync with the callers.",
        ]
    )
    at = (
        (fns[0].decorator_list[0].lineno if fns and fns[0].decorator_list else fns[0].lineno) - 1
        if fns
        else 0
    )
    text = indent_of(lines[at]) + note + "\n" if at < len(lines) else note + "\n"
    return Edit(lines[:at] + [text] + lines[at:], text, "edits a file the fix does not need")


def reformat(ctx: FileCtx) -> Edit | None:
    lines, untouched, rng = ctx.lines, ctx.untouched, ctx.rng
    tree = _parse(lines)
    if tree is None:
        return None
    fns = [f for f in _functions(tree) if f.lineno - 1 in untouched and f.body[0].lineno > f.lineno]
    rng.shuffle(fns)
    sig = re.compile(r"^(\s*)((?:async\s+)?def\s+\w+)\((.+)\)(\s*->\s*[^:]+)?:\s*$")
    for fn in fns:
        line = lines[fn.lineno - 1]
        m = sig.match(line.rstrip("\n"))
        if not m or any(c in m.group(3) for c in "()'\"#"):
            continue
        params = split_top_level(m.group(3))
        if len(params) < 2:
            continue
        ind = m.group(1)
        new = (
            [f"{ind}{m.group(2)}(\n"]
            + [f"{ind}    {p},\n" for p in params]
            + [f"{ind}){m.group(4) or ''}:\n"]
        )
        out = lines[: fn.lineno - 1] + new + lines[fn.lineno :]
        if _parse(out) is None:
            continue
        return Edit(out, new[1], f"reformats the untouched signature of `{fn.name}`")
    return None


def duplicated_logic(ctx: FileCtx) -> Edit | None:
    lines, anchors = ctx.lines, ctx.anchors
    tree = _parse(lines)
    if tree is None or not anchors:
        return None
    fn = enclosing_function(tree, anchors[0] + 1)
    if fn is None:
        return None
    start, end = fn.lineno - 1, fn.end_lineno or fn.lineno
    body = lines[start:end]
    name = pick_new_name("".join(lines), [f"{fn.name}_impl", f"{fn.name}_v2", f"_{fn.name}_copy"])
    first = re.sub(rf"\bdef\s+{re.escape(fn.name)}\b", f"def {name}", body[0], count=1)
    # Methods get one blank line before the copy, module-level functions two (PEP 8), as a human would.
    copy = (["\n"] if indent_of(body[0]) else ["\n", "\n"]) + [first] + body[1:]
    out = lines[:end] + copy + lines[end:]
    if _parse(out) is None:
        return None
    return Edit(out, first, f"duplicates the logic of `{fn.name}` in a second function `{name}`")


def broad_except(ctx: FileCtx) -> Edit | None:
    lines, anchors = ctx.lines, ctx.anchors
    tree = _parse(lines)
    stmt = tree and _anchor_stmt(tree, anchors, lines)
    if not stmt:
        return None
    i = stmt.lineno - 1
    ind = indent_of(lines[i])
    # Re-raising keeps behaviour (tests that expect an exception still see it); the defect is the noise.
    new = [f"{ind}try:\n", "    " + lines[i], f"{ind}except Exception:\n", f"{ind}    raise\n"]
    out = lines[:i] + new + lines[i + 1 :]
    if _parse(out) is None:
        return None
    return Edit(out, new[2], "wraps code in a broad `except Exception` that adds nothing")


def rename_outside_fix(ctx: FileCtx) -> Edit | None:
    lines, untouched, rng = ctx.lines, ctx.untouched, ctx.rng
    src = "".join(lines)
    tree = _parse(lines)
    if tree is None:
        return None
    try:
        toks = list(tokenize.generate_tokens(io.StringIO(src).readline))
    except (tokenize.TokenError, SyntaxError):
        return None
    fns = [f for f in _functions(tree) if all(n in untouched for n in range(f.lineno - 1, f.end_lineno or 0))]
    rng.shuffle(fns)
    for fn in fns:
        params = {a.arg for a in ast.walk(fn.args) if isinstance(a, ast.arg)}
        blocked = {k.arg for k in ast.walk(fn) if isinstance(k, ast.keyword) and k.arg}
        blocked |= {n for g in ast.walk(fn) if isinstance(g, ast.Global | ast.Nonlocal) for n in g.names}
        stores = sorted(
            {n.id for n in ast.walk(fn) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
        )
        lo, hi = fn.lineno, fn.end_lineno or fn.lineno
        for var in [s for s in stores if s not in params and s not in blocked and len(s) > 1 and s != "_"]:
            span = [t for t in toks if lo <= t.start[0] <= hi]
            if any(
                t.type == tokenize.STRING and re.match(r"(?i)[rb]*f", t.string) and var in t.string
                for t in span
            ):
                continue  # an f-string reference would be missed by a token rename
            if "locals()" in "".join(lines[lo - 1 : hi]):
                continue
            new = pick_new_name(src, rename_options(var, camel=False))
            if keyword.iskeyword(new):
                continue
            out = list(lines)
            hits = 0
            prev = None
            # Rename NAME tokens only (never strings, comments or attribute names after a dot).
            for t in reversed(span):
                if t.type == tokenize.NAME and t.string == var:
                    idx = toks.index(t)
                    prev = toks[idx - 1] if idx else None
                    if prev is not None and prev.type == tokenize.OP and prev.string == ".":
                        continue
                    row, col = t.start
                    s = out[row - 1]
                    out[row - 1] = s[:col] + new + s[col + len(var) :]
                    hits += 1
            if hits < 2 or _parse(out) is None:
                continue
            first = next(i for i in range(lo - 1, hi) if re.search(rf"\b{re.escape(new)}\b", out[i]))
            return Edit(out, out[first], f"renames `{var}` to `{new}` in `{fn.name}`, outside the fix")
    return None
