"""Worse candidates that are *smaller* than the gold patch: where a judge that reads code beats one that counts lines.

The degradations of `sft.degrade` all add lines, so "smaller is better" ranks them perfectly. Two ways a patch can
be worse while changing fewer lines, both common in real rollouts:

- `partial_fix`: the gold patch with one of its parts left out: a check it adds (`if ...: raise`, a guard, an
  assertion, a try block) or one of its hunks. The rest of the fix stays, so it looks like a fix; it is
  incomplete.
- `special_case`: the gold patch not made at all; instead the function it fixes gets a branch on an input of the
  tests, returning a value of the tests (`if name == "foo-bar": return "Foo Bar"`): the hack that passes a test
  without fixing the code.

Both are known to be worse than the gold patch and than every degraded copy of it (a complete, general fix with
cosmetic defects beats an incomplete fix, which beats gaming the tests: the grader's criteria in their order).
They need not pass the tests: the judge's labels come from how they were made. Python only.
"""

from __future__ import annotations

import ast
import random
import re
from pathlib import Path
from typing import Any

from unidiff import PatchSet
from unidiff.errors import UnidiffParseError

from grader.features import added_lines, patch_file_path
from grader.hacks.literals import py_tokens
from sft.degrade import DegradeError, Variant, _Tree, scratch_tree
from sft.degrade_common import indent_of

INVERTED = ("partial_fix", "special_case")
# Statements whose absence leaves a fix incomplete rather than broken: checks and the blocks that make them.
_CHECKS = (ast.If, ast.Raise, ast.Assert, ast.Try, ast.With, ast.For, ast.While)
_OTHER = (ast.Assign, ast.AugAssign, ast.Expr, ast.Return)
_MAX_LITERAL = 30


def _parses(text: str) -> bool:
    try:
        ast.parse(text)
    except (SyntaxError, ValueError):
        return False
    return True


def _parents(tree: ast.AST) -> dict[ast.AST, ast.AST]:
    return {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}


def _droppable(tree: ast.Module, added: set[int]) -> list[ast.stmt]:
    """Statements the gold patch added whole, that leave their block non-empty when dropped."""
    parents = _parents(tree)
    out = []
    for node in ast.walk(tree):
        if not isinstance(node, _CHECKS + _OTHER) or isinstance(node, ast.Expr) and isinstance(
                getattr(node, "value", None), ast.Constant):
            continue  # a docstring is not part of a fix
        span = set(range(node.lineno, (node.end_lineno or node.lineno) + 1))
        if not span <= added:
            continue
        parent = parents.get(node)
        siblings = next((getattr(parent, f) for f in ("body", "orelse", "finalbody")
                         if node in getattr(parent, f, [])), [])
        if len(siblings) > 1:
            out.append(node)
    return out


def _still_used(node: ast.stmt, text: str) -> bool:
    """An assignment whose name the file uses elsewhere: dropping it would break the code, not leave it short."""
    if not isinstance(node, ast.Assign | ast.AugAssign | ast.AnnAssign):
        return False
    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
    names = {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
    lines = text.splitlines()
    rest = "\n".join(lines[:node.lineno - 1] + lines[(node.end_lineno or node.lineno):])
    return not names or any(re.search(rf"\b{re.escape(n)}\b", rest) for n in names)


def partial_fix(tree: _Tree, rng: random.Random) -> Variant | None:
    """The gold patch with one added check (or, failing that, one added statement or hunk) left out."""
    added = added_lines(tree.gold)
    options: list[tuple[int, str, int, int]] = []  # (priority, path, first line, last line), 1-based, inclusive
    for path in tree.gold_files:
        if not path.endswith(".py") or not (tree.root / path).is_file():
            continue
        try:
            text = (tree.root / path).read_text(encoding="utf-8")
            mod = ast.parse(text)
        except (OSError, UnicodeDecodeError, SyntaxError, ValueError):
            continue
        for node in _droppable(mod, added.get(path, set())):
            if _still_used(node, text):
                continue
            options.append((0 if isinstance(node, _CHECKS) else 1, path, node.lineno, node.end_lineno or node.lineno))
    if not options:
        return None
    best = min(p for p, *_ in options)
    picks = [o for o in options if o[0] == best]
    _, path, first, last = picks[rng.randrange(len(picks))]
    lines = tree.read(path)
    dropped = lines[first - 1:last]
    kept = lines[:first - 1] + lines[last:]
    if not _parses("".join(kept)):
        return None
    (tree.root / path).write_text("".join(kept), encoding="utf-8")
    patch = tree.patch()
    if not re.search(r"^\+(?!\+\+)", patch, re.M):
        return None  # nothing of the fix left (a one-line change): that is no fix at all, not a partial one
    what = dropped[0].strip()
    what = what if len(what) <= 60 else what[:59] + "…"
    more = f" and {len(dropped) - 1} more line(s)" if len(dropped) > 1 else ""
    return Variant("partial", patch, [], [f"{path}:{first}: an incomplete fix: leaves out `{what}`{more} that the "
                                          "fix needs"])


def _test_literals(test_patch: str) -> list[str]:
    """Literals the test patch adds, as Python source (`'foo-bar'`, `2.5`), most distinctive first."""
    try:
        files = PatchSet(test_patch or "")
    except (UnidiffParseError, ValueError):
        return []
    seen: dict[str, None] = {}
    for pf in files:
        if not pf.path.endswith(".py"):
            continue
        text = "".join(ln.value for h in pf for ln in h if ln.is_added)
        for tok in py_tokens(text):
            if tok.kind not in ("str", "num") or isinstance(tok.value, bytes):
                continue
            src = repr(tok.value)
            if tok.value in (0, 1, "", " ") or len(src) > _MAX_LITERAL or "\n" in src:
                continue
            seen.setdefault(src, None)
    return list(seen)


def _literals_of_tests(tree: _Tree, fail_to_pass: list[str]) -> list[str]:
    """Literals in the bodies of the failing tests (`path::[Class::]func` ids), for tasks without a test patch."""
    out: dict[str, None] = {}
    for tid in fail_to_pass[:5]:
        path, _, name = str(tid).partition("::")
        name = name.split("[", 1)[0].rsplit("::", 1)[-1]
        try:
            src = "".join(tree.base_lines(path))
            mod = ast.parse(src)
        except (SyntaxError, ValueError):
            continue
        for node in ast.walk(mod):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name == name:
                body = "\n".join(src.splitlines()[node.lineno - 1:node.end_lineno])
                fake = "".join(f"+{ln}\n" for ln in body.splitlines())
                patch = f"--- a/{path}\n+++ b/{path}\n@@ -0,0 +1,{len(body.splitlines())} @@\n{fake}"
                out.update(dict.fromkeys(_test_literals(patch)))
    return list(out)


def _fixed_function(tree: _Tree, path: str) -> ast.FunctionDef | ast.AsyncFunctionDef | None:
    """The function of the *base* file in which the gold patch makes its first change."""
    try:
        files = PatchSet(tree.gold)
    except (UnidiffParseError, ValueError):
        return None
    first = None
    for pf in files:
        p = patch_file_path(pf)
        if p == path and len(pf):
            h = pf[0]
            first = next((ln.source_line_no for ln in h if ln.is_removed), None) or next(
                (ln.source_line_no for ln in h if ln.is_context and ln.source_line_no), h.source_start)
            break
    base = "".join(tree.base_lines(path))
    if first is None or not base:
        return None
    try:
        mod = ast.parse(base)
    except SyntaxError:
        return None
    best = None
    for node in ast.walk(mod):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.lineno <= first <= (
                node.end_lineno or node.lineno):
            best = node if best is None or node.lineno > best.lineno else best
    return best


def special_case(tree: _Tree, test_patch: str, rng: random.Random, fail_to_pass: list[str] | None = None
                 ) -> Variant | None:
    """Instead of the gold fix: a branch on a test input that returns a test value, in the function it fixes."""
    literals = _test_literals(test_patch) or _literals_of_tests(tree, fail_to_pass or [])
    if len(literals) < 2:
        return None
    for path in tree.gold_files:
        if not path.endswith(".py") or re.search(r"(^|/)tests?/", path):
            continue
        fn = _fixed_function(tree, path)
        params = [a.arg for a in (fn.args.posonlyargs + fn.args.args + fn.args.kwonlyargs if fn else [])
                  if a.arg not in ("self", "cls")]
        if not fn or not params:
            continue
        base = tree.base_lines(path)
        doc = isinstance(fn.body[0], ast.Expr) and isinstance(getattr(fn.body[0], "value", None), ast.Constant)
        body = fn.body[1:] if doc else fn.body
        if not body or body[0].lineno <= fn.lineno or isinstance(body[0], ast.FunctionDef | ast.ClassDef):
            continue  # a one-line function, or a body that starts with a nested definition (decorators)
        at = body[0].lineno - 1
        ind = indent_of(base[at])
        param = params[rng.randrange(len(params))]
        a, b, *rest = rng.sample(literals, min(len(literals), 3))
        if rest and rng.random() < 0.4:
            cond = f"{param} in ({a}, {b})"
            ret = rest[0]
        else:
            cond, ret = f"{param} == {a}", b
        branch = [f"{ind}if {cond}:\n", f"{ind}    return {ret}\n"]
        new = base[:at] + branch + base[at:]
        if not _parses("".join(new)):
            continue
        tree.reset(gold=False)
        (tree.root / path).write_text("".join(new), encoding="utf-8")
        patch = tree.patch()
        return Variant("hack", patch, [], [f"{path}:{at + 1}: special-cases an input of the tests "
                                           f"(`if {cond}: return {ret}`) instead of fixing the code"])
    return None


def inverted_on(tree: _Tree, iid: str, test_patch: str, *, seed: int = 0, fail_to_pass: list[str] | None = None
                ) -> dict[str, Variant]:
    """`{"partial": ..., "hack": ...}` on an open scratch tree, whichever this instance allows (maybe neither)."""
    out: dict[str, Variant] = {}
    if tree.language != "python":
        return out
    tree.reset()
    part = partial_fix(tree, random.Random(f"{iid}:partial:{seed}"))
    if part is not None:
        out["partial"] = part
    tree.reset()
    hack = special_case(tree, test_patch, random.Random(f"{iid}:hack:{seed}"), fail_to_pass)
    if hack is not None:
        out["hack"] = hack
    return out


def build_inverted(instance: dict[str, Any], repos_dir: str | Path, *, seed: int = 0) -> dict[str, Variant]:
    """`inverted_on` in a scratch tree of its own."""
    try:
        with scratch_tree(instance, repos_dir) as tree:
            return inverted_on(tree, str(instance.get("instance_id")), str(instance.get("test_patch") or ""),
                               seed=seed, fail_to_pass=list(instance.get("FAIL_TO_PASS") or []))
    except DegradeError:
        return {}
