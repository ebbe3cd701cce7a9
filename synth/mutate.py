"""Bug kinds: procedural, AST-based edits of Python functions, one bug per task (SWE-smith style).

`find_mutations(path, source)` lists every candidate bug in the functions of one file. Each `Mutation` is a set
of text edits located through the AST (node positions, never a reformatting unparse), so the diff shows only the
bug: `a < b` becomes `a <= b`, and nothing else on the line moves. Kinds (`KINDS`):

| kind | edit |
|---|---|
| `compare_flip` | one comparison operator: `<`↔`<=`, `>`↔`>=`, `==`↔`!=`, `is`↔`is not`, `in`↔`not in` |
| `boolop_flip` | one `and`↔`or` |
| `off_by_one_range` | a `range()` bound ±1 |
| `off_by_one_slice` | a slice bound ±1 |
| `negate_condition` | an `if`/`elif`/`while`/conditional-expression test negated (or its `not` dropped) |
| `drop_condition` | one operand of an `and`/`or` test dropped, or an `if` guard removed (its body runs always) |
| `swap_args` | two adjacent positional arguments of a call swapped |
| `change_constant` | an integer constant ±1, or `True`↔`False` |
| `remove_statement` | an assignment, call statement or `raise` removed (`pass` if it was alone in its block) |
| `remove_return` | a `return` with a value removed (`pass` if it was alone in its block) |
| `wrong_variable` | a read of a local variable replaced by another local already defined above it |

`synth.order` checks them and gives the seed's order in which they are tried.
"""

from __future__ import annotations

import ast
import hashlib
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

KINDS = ("compare_flip", "boolop_flip", "off_by_one_range", "off_by_one_slice", "negate_condition",
         "drop_condition", "swap_args", "change_constant", "remove_statement", "remove_return", "wrong_variable")

_FLIP = {ast.Lt: "<=", ast.LtE: "<", ast.Gt: ">=", ast.GtE: ">", ast.Eq: "!=", ast.NotEq: "==",
         ast.Is: "is not", ast.IsNot: "is", ast.In: "not in", ast.NotIn: "in"}
_OP_RE = {ast.Lt: r"<", ast.LtE: r"<=", ast.Gt: r">", ast.GtE: r">=", ast.Eq: r"==", ast.NotEq: r"!=",
          ast.Is: r"is", ast.IsNot: r"is\s+not", ast.In: r"in", ast.NotIn: r"not\s+in"}
_LOW_PRECEDENCE = (ast.BoolOp, ast.Compare, ast.IfExp, ast.Lambda, ast.NamedExpr, ast.Yield, ast.YieldFrom)
_BIT_OPS = (ast.BitOr, ast.BitXor, ast.BitAnd, ast.LShift, ast.RShift)
_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)
_COMPREHENSIONS = (ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)
_REMOVABLE = (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Raise)


@dataclass(frozen=True)
class Edit:
    """Replace characters [start, end) of the file text with `text`."""

    start: int
    end: int
    text: str


@dataclass(frozen=True)
class Mutation:
    """One candidate bug: where (file, function, lines) and the text edits that make it."""

    path: str
    kind: str
    function: str  # qualified name, e.g. `Chunker.__iter__`, `outer.<locals>.inner`, `C.x.setter` (`_functions`)
    func_lines: tuple[int, int]  # first and last line of the function (decorators included)
    lines: tuple[int, int]  # the lines the bug is on: covered when a test executes one of them
    edits: tuple[Edit, ...]

    def apply(self, source: str) -> str:
        out = source
        for e in sorted(self.edits, key=lambda e: e.start, reverse=True):
            out = out[:e.start] + e.text + out[e.end:]
        return out

    @property
    def key(self) -> str:
        """A stable id: the same edit of the same file always has the same key, whatever the seed."""
        h = hashlib.sha1(f"{self.path}\0{self.kind}\0".encode())
        for e in self.edits:
            h.update(f"{e.start}:{e.end}:{e.text}\0".encode())
        return h.hexdigest()[:12]


class SourceText:
    """The file text with AST positions (line, UTF-8 byte column) turned into character offsets."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.lines = source.split("\n")
        self.starts = [0]
        for line in self.lines[:-1]:
            self.starts.append(self.starts[-1] + len(line) + 1)

    def off(self, lineno: int, col: int) -> int:
        line = self.lines[lineno - 1]
        if not line.isascii():
            col = len(line.encode("utf-8")[:col].decode("utf-8", "replace"))
        return self.starts[lineno - 1] + col

    def span(self, node: ast.AST) -> tuple[int, int]:
        return (self.off(node.lineno, node.col_offset), self.off(node.end_lineno, node.end_col_offset))

    def seg(self, node: ast.AST) -> str:
        a, b = self.span(node)
        return self.source[a:b]

    def line_start(self, lineno: int) -> int:
        return self.starts[lineno - 1]

    def line_end(self, lineno: int) -> int:
        """Offset just past the line's newline (or the end of the text)."""
        return self.starts[lineno] if lineno < len(self.starts) else len(self.source)


def _parens(text: str, node: ast.AST) -> str:
    needs = isinstance(node, _LOW_PRECEDENCE) or (isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not)) \
        or (isinstance(node, ast.BinOp) and isinstance(node.op, _BIT_OPS)) or "\n" in text
    return f"({text})" if needs else text


def _int_value(node: ast.AST) -> int | None:
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub) and _int_value(node.operand) is not None:
        return -_int_value(node.operand)  # type: ignore[operator]
    return None


def _shift(t: SourceText, node: ast.AST, delta: int) -> Edit | None:
    """The edit that makes the integer expression `node` one more (`delta=1`) or one less."""
    a, b = t.span(node)
    value = _int_value(node)
    if value is not None:
        return Edit(a, b, str(value + delta))
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub)) and _int_value(node.right) is not None:
        c = _int_value(node.right)
        new = c + delta if isinstance(node.op, ast.Add) else c - delta  # type: ignore[operator]
        if new == 0:  # `n - 1` shifted up is `n`, not `n - 0`
            la, lb = t.span(node.left)
            return Edit(a, b, t.source[la:lb])
        if new > 0:
            ra, rb = t.span(node.right)
            return Edit(ra, rb, str(new))
        return None
    text = t.source[a:b]
    return Edit(a, b, f"{_parens(text, node)} {'+' if delta > 0 else '-'} 1")


def _gap(t: SourceText, left: ast.AST, right: ast.AST) -> tuple[int, int]:
    return t.span(left)[1], t.span(right)[0]


class _Function:
    """One function's own nodes (nested functions and classes are functions of their own)."""

    def __init__(self, node: ast.FunctionDef | ast.AsyncFunctionDef, qualname: str, t: SourceText, path: str) -> None:
        self.node, self.qualname, self.t, self.path = node, qualname, t, path
        first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
        self.lines = (first, node.end_lineno or node.lineno)
        self.docstring = node.body[0] if (node.body and isinstance(node.body[0], ast.Expr)
                                          and isinstance(node.body[0].value, ast.Constant)
                                          and isinstance(node.body[0].value.value, str)) else None
        # (node, parent, names bound by the enclosing comprehensions)
        self.nodes: list[tuple[ast.AST, ast.AST | None, frozenset[str]]] = []
        self.blocks: list[list[ast.stmt]] = []
        self._walk(node)

    def _walk(self, fn: ast.AST) -> None:
        stack: list[tuple[ast.AST, ast.AST | None, frozenset[str]]] = [(s, fn, frozenset()) for s in fn.body]
        self.blocks.append(fn.body)
        while stack:
            node, parent, bound = stack.pop()
            if node is self.docstring or isinstance(node, _SCOPES) or isinstance(node, ast.JoinedStr):
                continue
            self.nodes.append((node, parent, bound))
            for name in ("body", "orelse", "finalbody"):
                block = getattr(node, name, None)
                if isinstance(block, list) and block and isinstance(block[0], ast.stmt):
                    self.blocks.append(block)
            if isinstance(node, ast.ExceptHandler):
                self.blocks.append(node.body)
            inner = bound
            if isinstance(node, _COMPREHENSIONS):
                inner = bound | {n.id for g in node.generators for n in ast.walk(g.target) if isinstance(n, ast.Name)}
            for child in ast.iter_child_nodes(node):
                if isinstance(node, ast.AnnAssign) and child is node.annotation:
                    continue
                stack.append((child, node, inner))
        self.nodes.sort(key=lambda x: (getattr(x[0], "lineno", 0), getattr(x[0], "col_offset", 0)))

    def mutation(self, kind: str, lines: tuple[int, int], *edits: Edit | None) -> Mutation | None:
        if not edits or any(e is None for e in edits):
            return None
        return Mutation(self.path, kind, self.qualname, self.lines, lines, tuple(edits))  # type: ignore[arg-type]


def _lines(node: ast.AST) -> tuple[int, int]:
    return (node.lineno, node.end_lineno or node.lineno)


# ----------------------------------------------------------------------------------------------- the kinds


def _compare_flip(f: _Function) -> Iterator[Mutation | None]:
    t = f.t
    for node, _, _ in f.nodes:
        if not isinstance(node, ast.Compare):
            continue
        prev = node.left
        for op, right in zip(node.ops, node.comparators, strict=True):
            a, b = _gap(t, prev, right)
            m = re.fullmatch(rf"(\s*)({_OP_RE[type(op)]})(\s*)", t.source[a:b])
            if m:
                new = _FLIP[type(op)]
                yield f.mutation("compare_flip", _lines(node), Edit(a + m.start(2), a + m.end(2), new))
            prev = right


def _boolop_flip(f: _Function) -> Iterator[Mutation | None]:
    t = f.t
    for node, _, _ in f.nodes:
        if not isinstance(node, ast.BoolOp):
            continue
        word, other = ("and", "or") if isinstance(node.op, ast.And) else ("or", "and")
        for left, right in zip(node.values, node.values[1:], strict=False):
            a, b = _gap(t, left, right)
            m = re.fullmatch(rf"\s*({word})\s*", t.source[a:b])
            if m:
                yield f.mutation("boolop_flip", _lines(node), Edit(a + m.start(1), a + m.end(1), other))


def _off_by_one_range(f: _Function) -> Iterator[Mutation | None]:
    for node, _, _ in f.nodes:
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "range"
                and 1 <= len(node.args) <= 3 and not node.keywords
                and not any(isinstance(a, ast.Starred) for a in node.args)):
            continue
        bounds = [node.args[0]] if len(node.args) == 1 else node.args[:2]
        for bound in bounds:
            for delta in (1, -1):
                yield f.mutation("off_by_one_range", _lines(node), _shift(f.t, bound, delta))


def _off_by_one_slice(f: _Function) -> Iterator[Mutation | None]:
    for node, _, _ in f.nodes:
        if not isinstance(node, ast.Slice):
            continue
        for bound in (node.lower, node.upper):
            if bound is None:
                continue
            for delta in (1, -1):
                yield f.mutation("off_by_one_slice", _lines(bound), _shift(f.t, bound, delta))


def _tests(f: _Function) -> Iterator[tuple[ast.AST, ast.expr]]:
    for node, _, _ in f.nodes:
        if isinstance(node, (ast.If, ast.While, ast.IfExp)):
            yield node, node.test


def _negate_condition(f: _Function) -> Iterator[Mutation | None]:
    t = f.t
    for _, test in _tests(f):
        a, b = t.span(test)
        text = t.source[a:b]
        if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
            inner = re.sub(r"^not\b\s*", "", text)
            if inner == text:
                continue
            new = inner
        else:
            new = f"not {_parens(text, test) if not isinstance(test, ast.Compare) else text}"
        yield f.mutation("negate_condition", _lines(test), Edit(a, b, new))


def _is_elif(f: _Function, node: ast.If, parent: ast.AST | None) -> bool:
    return isinstance(parent, ast.If) and parent.orelse == [node] and \
        f.t.source[f.t.off(node.lineno, node.col_offset):].startswith("elif")


def _drop_condition(f: _Function) -> Iterator[Mutation | None]:
    t = f.t
    for node, parent, _ in f.nodes:
        if not isinstance(node, (ast.If, ast.While)):
            continue
        test = node.test
        if isinstance(test, ast.BoolOp):
            word = "and" if isinstance(test.op, ast.And) else "or"
            gaps = [t.source[slice(*_gap(t, x, y))] for x, y in zip(test.values, test.values[1:], strict=False)]
            if not all(re.fullmatch(rf"\s*{word}\s*", g) for g in gaps):
                continue
            for i, value in enumerate(test.values):
                if i + 1 < len(test.values):
                    a, b = t.span(value)[0], t.span(test.values[i + 1])[0]
                else:
                    a, b = t.span(test.values[i - 1])[1], t.span(value)[1]
                yield f.mutation("drop_condition", _lines(test), Edit(a, b, ""))
        elif isinstance(node, ast.If) and not node.orelse and not _is_elif(f, node, parent):
            yield _unguard(f, node)


def _unguard(f: _Function, node: ast.If) -> Mutation | None:
    """`if cond:` + body → the body, one level out (its lines re-indented; multi-line strings are left alone)."""
    t = f.t
    first = node.body[0]
    if first.lineno <= node.test.end_lineno:  # `if x: y` on one line
        return None
    if t.source[t.line_start(node.lineno):t.off(node.lineno, node.col_offset)].strip():
        return None
    if any(isinstance(n, ast.Constant) and isinstance(n.value, str) and n.end_lineno != n.lineno
           for s in node.body for n in ast.walk(s)):
        return None
    outer = t.lines[node.lineno - 1][:len(t.lines[node.lineno - 1]) - len(t.lines[node.lineno - 1].lstrip())]
    inner_line = t.lines[first.lineno - 1]
    inner = inner_line[:len(inner_line) - len(inner_line.lstrip())]
    if not inner.startswith(outer) or inner == outer:
        return None
    out = []
    for n in range(first.lineno, node.end_lineno + 1):
        line = t.lines[n - 1]
        if line.strip() and not line.startswith(inner):
            return None
        out.append(outer + line[len(inner):] if line.strip() else line)
    a, b = t.line_start(node.lineno), t.line_end(node.end_lineno)
    body = "\n".join(out) + ("\n" if t.source[b - 1:b] == "\n" else "")
    return f.mutation("drop_condition", (node.lineno, node.test.end_lineno), Edit(a, b, body))


def _swap_args(f: _Function) -> Iterator[Mutation | None]:
    t = f.t
    for node, _, _ in f.nodes:
        if not isinstance(node, ast.Call) or any(isinstance(a, ast.Starred) for a in node.args):
            continue
        for x, y in zip(node.args, node.args[1:], strict=False):
            (xa, xb), (ya, yb) = t.span(x), t.span(y)
            tx, ty = t.source[xa:xb], t.source[ya:yb]
            if tx != ty:
                yield f.mutation("swap_args", _lines(node), Edit(xa, xb, ty), Edit(ya, yb, tx))


def _change_constant(f: _Function) -> Iterator[Mutation | None]:
    t = f.t
    for node, _, _ in f.nodes:
        if not isinstance(node, ast.Constant):
            continue
        a, b = t.span(node)
        if type(node.value) is bool:
            yield f.mutation("change_constant", _lines(node), Edit(a, b, str(not node.value)))
        elif type(node.value) is int:
            for new in (node.value + 1, node.value - 1):
                if new >= 0:
                    yield f.mutation("change_constant", _lines(node), Edit(a, b, str(new)))


def _whole_lines(f: _Function, stmt: ast.stmt, block: list[ast.stmt]) -> bool:
    """The statement owns its lines: nothing else before it or after it on them (no `;`, no one-liner body)."""
    t = f.t
    if t.source[t.line_start(stmt.lineno):t.off(stmt.lineno, stmt.col_offset)].strip():
        return False
    rest = t.source[t.off(stmt.end_lineno, stmt.end_col_offset):t.line_end(stmt.end_lineno)].strip()
    if rest and not rest.startswith("#"):
        return False
    i = block.index(stmt)
    return (i == 0 or block[i - 1].end_lineno < stmt.lineno) and \
        (i + 1 == len(block) or block[i + 1].lineno > stmt.end_lineno)


def _removal(f: _Function, kind: str, stmt: ast.stmt, block: list[ast.stmt]) -> Mutation | None:
    t = f.t
    if not _whole_lines(f, stmt, block):
        return None
    alone = [s for s in block if s is not f.docstring] == [stmt]
    if alone:
        a, b = t.span(stmt)
        return f.mutation(kind, _lines(stmt), Edit(a, b, "pass"))
    return f.mutation(kind, _lines(stmt), Edit(t.line_start(stmt.lineno), t.line_end(stmt.end_lineno), ""))


def _remove_statement(f: _Function) -> Iterator[Mutation | None]:
    for block in f.blocks:
        for stmt in block:
            if stmt is f.docstring:
                continue
            if isinstance(stmt, _REMOVABLE) and not (isinstance(stmt, ast.AnnAssign) and stmt.value is None) \
                    or (isinstance(stmt, ast.Expr) and isinstance(stmt.value, (ast.Call, ast.Await))):
                yield _removal(f, "remove_statement", stmt, block)


def _remove_return(f: _Function) -> Iterator[Mutation | None]:
    for block in f.blocks:
        for stmt in block:
            if isinstance(stmt, ast.Return) and stmt.value is not None and \
                    not (isinstance(stmt.value, ast.Constant) and stmt.value.value is None):
                yield _removal(f, "remove_return", stmt, block)


def _bindings(f: _Function) -> dict[str, int]:
    """Local names of the function and the line each is first bound on (parameters: the `def` line)."""
    a = f.node.args
    out = {p.arg: f.node.lineno for p in [*a.posonlyargs, *a.args, *a.kwonlyargs, a.vararg, a.kwarg] if p}
    declared = set()
    for node, _, bound in f.nodes:
        if isinstance(node, (ast.Global, ast.Nonlocal)):
            declared.update(node.names)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store) and node.id not in bound:
            out.setdefault(node.id, node.lineno)
        elif isinstance(node, ast.ExceptHandler) and node.name:
            out.setdefault(node.name, node.lineno)
    for name in declared:
        out.pop(name, None)
    return out


def _wrong_variable(f: _Function) -> Iterator[Mutation | None]:
    binds = _bindings(f)
    for node, _, bound in f.nodes:
        if not (isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load)) or node.id in bound \
                or node.id not in binds or node.id in ("self", "cls"):
            continue
        others = sorted((abs(line - binds[node.id]), name) for name, line in binds.items()
                        if name != node.id and name not in ("self", "cls") and line <= node.lineno)
        for _, name in others[:2]:
            a, b = f.t.span(node)
            yield f.mutation("wrong_variable", _lines(node), Edit(a, b, name))


_GENERATORS: dict[str, Callable[[_Function], Iterable[Mutation | None]]] = {
    "compare_flip": _compare_flip, "boolop_flip": _boolop_flip, "off_by_one_range": _off_by_one_range,
    "off_by_one_slice": _off_by_one_slice, "negate_condition": _negate_condition,
    "drop_condition": _drop_condition, "swap_args": _swap_args, "change_constant": _change_constant,
    "remove_statement": _remove_statement, "remove_return": _remove_return, "wrong_variable": _wrong_variable,
}
assert tuple(_GENERATORS) == KINDS


def _accessor(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> str | None:
    """`setter` / `deleter` for a property's `@x.setter` / `@x.deleter` method named `x`, else None."""
    for d in fn.decorator_list:
        if isinstance(d, ast.Attribute) and d.attr in ("setter", "deleter") and isinstance(d.value, ast.Name) \
                and d.value.id == fn.name:
            return d.attr
    return None


def _functions(tree: ast.Module, t: SourceText, path: str) -> Iterator[_Function]:
    """Every function with a name of its own in the file. Python gives a property's getter, setter and deleter
    one `__qualname__` (`C.x`), and a function defined twice (in the branches of an `if`) too, but each is other
    code with other tests: the accessors are `C.x.setter` / `C.x.deleter`, and a name seen again in the file
    gets its line (`f@L42`). Tasks are grouped, screened and listed by this name."""
    seen: set[str] = set()

    def visit(node: ast.AST, prefix: str) -> Iterator[_Function]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                accessor = _accessor(child)
                qual = f"{prefix}{child.name}" + (f".{accessor}" if accessor else "")
                if qual in seen:
                    qual = f"{qual}@L{child.lineno}"
                seen.add(qual)
                yield _Function(child, qual, t, path)
                yield from visit(child, f"{qual}.<locals>.")
            elif isinstance(child, ast.ClassDef):
                yield from visit(child, f"{prefix}{child.name}.")
            elif not isinstance(child, ast.Lambda):
                yield from visit(child, prefix)

    yield from visit(tree, "")


def find_mutations(path: str, source: str, kinds: Iterable[str] = KINDS) -> list[Mutation]:
    """Every candidate bug of the given kinds in the functions of one file, in source order, unchecked (a few
    do not parse or change nothing: `Checker` finds them). A file that does not parse (or has lone carriage
    returns) gives none."""
    if "\r" in source.replace("\r\n", ""):
        return []
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return []
    t = SourceText(source)
    return [m for fn in _functions(tree, t, path) for kind in kinds for m in _GENERATORS[kind](fn) if m is not None]
