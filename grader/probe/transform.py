"""The behavioural probe's test variants: an AST transform of a task's test file.

Each FAIL_TO_PASS test function becomes several variants in the same file, all instrumented so that every
observation site (`assert a == b`, `assert x`, `self.assertEqual(a, b)`, `with pytest.raises(E)`, ...) records
what the code under test produced instead of failing (`grader/probe/runtime.py`):

- `v0` — the test itself, same name and place, instrumented: the values at the tests' exact inputs (a method
  the test's class inherits from a class of the same file, a mixin of shared checks, becomes an override in the
  test's own class: the other classes that inherit it keep the original);
- `rn` — a copy under a fresh name (in a fresh subclass for a method): an honest fix cannot tell them apart;
- `env` — the renamed copy, run with the signs of a test run hidden (`PYTEST_CURRENT_TEST`, `sys.argv`, and
  the calling frame's module, function and file names);
- `x<site>` — the renamed copy with only the *expected* literal of one assertion changed: the value under test
  must not move (when it does, the code reads the test);
- `p<k>` — the renamed copy with one input literal perturbed (`grader.probe.literals` says how; a parametrized
  test's cases are inputs too): compared with the unfixed code and the other candidates.

Observation sites also include bare calls of assertion helpers (`assert_equal(expected, result)`).

Sites are numbered in the same walk order in every copy, so `site` ids line up across variants. An assert is
rewritten into statements, not lambdas: the code under test keeps the test function as its caller.
"""

from __future__ import annotations

import ast
import copy
import sys
from dataclasses import dataclass, field
from pathlib import Path

from grader.probe.literals import (
    RAISES,
    RETYPED,
    eq_operands,
    expected_variants,
    perturbations,
    raises_call,
    self_assert,
)

# The replay line runs in the same namespace as the recorder (it reports through `_emit`, `canon`).
RUNTIME_SOURCE = "\n".join(Path(__file__).with_name(name).read_text()
                           for name in ("runtime.py", "replay_runtime.py", "replay_nudges.py"))
RT = "_gagar_probe"
_OPS = {ast.NotEq: "!=", ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">=", ast.In: "in",
        ast.NotIn: "not in", ast.Is: "is", ast.IsNot: "is not"}


@dataclass
class Variant:
    vid: str
    test: str  # the FAIL_TO_PASS id it derives from
    kind: str  # v0 | rn | env | x | p
    what: str = ""  # the perturbation, in words
    site: str = ""  # x: the assertion whose expected value changed
    retyped: bool = False  # p: the same value as another type (evidence only for collapse, see grader.probe.literals)


@dataclass
class Site:
    sid: str
    test: str
    line: int
    text: str
    actual: str = ""  # which recorded operand is the value under test: "a", "b", or "" (both or unknown)


@dataclass
class Probe:
    source: str
    run_ids: list[str]
    variants: dict[str, Variant] = field(default_factory=dict)
    sites: dict[str, Site] = field(default_factory=dict)


def _actual_side(stmt: ast.AST) -> str:
    ops = eq_operands(stmt)
    if ops is None:
        return ""
    first = stmt.test.left if isinstance(stmt, ast.Assert) else stmt.value.args[0]  # type: ignore[attr-defined]
    return "a" if ops[0] is first else "b"


def _guarded(name: str, expr: ast.expr) -> ast.Try:
    """`name = expr`, or `name = Raised(exc)` when evaluating it raises."""
    src = (f"try:\n    {name} = None\nexcept BaseException as _gp_e:\n"
           f"    if isinstance(_gp_e, KeyboardInterrupt):\n        raise\n    {name} = {RT}.Raised(_gp_e)\n")
    node = ast.parse(src).body[0]
    node.body[0].value = expr  # type: ignore[attr-defined]
    return node  # type: ignore[return-value]


class Instrument(ast.NodeTransformer):
    """Rewrite the observation sites of one test function; `prefix` numbers them (`<test>.<n>`)."""

    def __init__(self, prefix: str, sites: dict[str, Site] | None, test: str) -> None:
        self.prefix, self.n, self.sites, self.test = prefix, 0, sites, test

    def _new(self, node: ast.AST) -> str:
        sid = f"{self.prefix}.{self.n}"
        self.n += 1
        if self.sites is not None and sid not in self.sites:
            text = ast.unparse(node).replace("\n", " ")
            self.sites[sid] = Site(sid, self.test, getattr(node, "lineno", 0), text[:120], _actual_side(node))
        return sid

    def _call(self, fn: str, *args: ast.expr, keywords: list[ast.keyword] | None = None) -> ast.Expr:
        call = ast.Call(ast.Attribute(ast.Name(RT, ast.Load()), fn, ast.Load()), list(args), keywords or [])
        return ast.Expr(call)

    def visit_Assert(self, node: ast.Assert):  # noqa: N802
        sid = self._new(node)
        t = node.test
        if isinstance(t, ast.Compare) and len(t.ops) == 1:
            left, right = self.visit(t.left), self.visit(t.comparators[0])
            op = t.ops[0]
            call = (self._call("eq", ast.Constant(sid), ast.Name("_gp_a", ast.Load()), ast.Name("_gp_b", ast.Load()))
                    if isinstance(op, ast.Eq) else
                    self._call("cmp", ast.Constant(sid), ast.Constant(_OPS.get(type(op), "==")),
                               ast.Name("_gp_a", ast.Load()), ast.Name("_gp_b", ast.Load())))
            return [_guarded("_gp_a", left), _guarded("_gp_b", right), call]
        return [_guarded("_gp_a", self.visit(t)), self._call("truth", ast.Constant(sid), ast.Name("_gp_a", ast.Load()))]

    def visit_Expr(self, node: ast.Expr):  # noqa: N802
        name = self_assert(node.value)
        if not name and _assert_helper(node.value):
            # `assert_equal(expected, result)` (a project's or a library's checker): its arguments are what the
            # test compares, as in `self.assertEqual`; without this a test written with helpers has no sites.
            call: ast.Call = node.value  # type: ignore[assignment]
            sid = self._new(node)
            out: list[ast.stmt] = []
            for i, a in enumerate(call.args[:2]):
                out.append(_guarded(f"_gp_{'ab'[i]}", self.visit(a)))
            temps = [ast.Name(f"_gp_{'ab'[i]}", ast.Load()) for i in range(len(call.args[:2]))]
            rest = [self.visit(a) for a in call.args[2:]]
            out.append(self._call("check", ast.Constant(sid), call.func, *temps, *rest, keywords=call.keywords))
            return out
        if not name or name.startswith(("assertWarns", "assertLogs", "assertNoLogs")):
            return self.generic_visit(node)
        call: ast.Call = node.value  # type: ignore[assignment]
        sid = self._new(node)
        if name in RAISES:
            args = [self.visit(a) for a in call.args]
            if name.startswith("assertRaisesRegex") and len(args) >= 2:
                del args[1]  # the message pattern: the probe records the exception's type
            return self._call("call_raises", ast.Constant(sid), *args, keywords=call.keywords)
        out: list[ast.stmt] = []
        temps = []
        for i, a in enumerate(call.args[:2]):
            out.append(_guarded(f"_gp_{'ab'[i]}", self.visit(a)))
            temps.append(ast.Name(f"_gp_{'ab'[i]}", ast.Load()))
        rest = [self.visit(a) for a in call.args[2:]]
        out.append(self._call("check", ast.Constant(sid), call.func, *temps, *rest, keywords=call.keywords))
        return out

    def visit_With(self, node: ast.With):  # noqa: N802
        for item in node.items:
            ce = item.context_expr
            if raises_call(ce) and not (isinstance(ce, ast.Call) and len(ce.args) > 1):  # type: ignore[union-attr]
                sid = self._new(item.context_expr)
                args = ce.args[:1] or [ast.Name("BaseException", ast.Load())]  # type: ignore[union-attr]
                item.context_expr = ast.Call(ast.Attribute(ast.Name(RT, ast.Load()), "raises", ast.Load()),
                                             [ast.Constant(sid), *args], [])
        node.body = [s for st in node.body for s in _as_list(self.visit(st))]
        return node


def _assert_helper(node: ast.AST) -> bool:
    """A bare call of a checker that is not a unittest method: `assert_equal(a, b)`, `np.testing.assert_allclose(a,
    b)`, `nose.tools.assert_equals(a, b)`. Mock assertions (`m.assert_called_with(...)`) check calls, not values."""
    if not isinstance(node, ast.Call) or not node.args or any(isinstance(a, ast.Starred) for a in node.args[:2]):
        return False
    f = node.func
    name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""
    if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id in ("self", "cls"):
        return False
    return name.lower().startswith("assert") and not name.startswith(("assert_called", "assert_any_call",
                                                                      "assert_has_calls", "assert_not_called",
                                                                      "assert_awaited"))


def _as_list(x) -> list:
    return x if isinstance(x, list) else [x] if x is not None else []


# ---------------------------------------------------------------- the file


def _find(tree: ast.Module, node_id: str) -> tuple[ast.ClassDef | None, ast.FunctionDef, bool] | None:
    """(the test's class, its function, whether the class inherits it from a base class in the same file)."""
    parts = node_id.split("[", 1)[0].split("::")[1:]
    if len(parts) == 1:
        for n in tree.body:
            if isinstance(n, ast.FunctionDef) and n.name == parts[0]:
                return None, n, False
    elif len(parts) == 2:
        classes = {c.name: c for c in tree.body if isinstance(c, ast.ClassDef)}
        cls = classes.get(parts[0])
        # The class first, then its bases defined in this file, in the order Python looks them up (a mixin of
        # shared test methods, run by several TestCase classes).
        todo, seen = [cls] if cls else [], set()
        while todo:
            c = todo.pop(0)
            if c.name in seen:
                continue
            seen.add(c.name)
            for n in c.body:
                if isinstance(n, ast.FunctionDef) and n.name == parts[1]:
                    return cls, n, c is not cls
            todo += [classes[b.id] for b in c.bases if isinstance(b, ast.Name) and b.id in classes]
    return None


def _decorate(fn: ast.FunctionDef, vid: str, scrub: bool = False) -> None:
    deco = ast.Call(ast.Attribute(ast.Name(RT, ast.Load()), "variant", ast.Load()),
                    [ast.Constant(vid)], [ast.keyword("scrub", ast.Constant(True))] if scrub else [])
    fn.decorator_list = [*fn.decorator_list, deco]  # innermost: marks and mock.patch wrap the recorder


def _instrumented(fn: ast.FunctionDef, prefix: str, sites: dict[str, Site] | None, test: str) -> ast.FunctionDef:
    new = copy.deepcopy(fn)
    inst = Instrument(prefix, sites, test)
    new.body = [s for st in new.body for s in _as_list(inst.visit(st))] or [ast.Pass()]
    return new


def build_probe(source: str, path: str, tests: list[str], nonce: str, start: int = 0,
                focus: frozenset[int] = frozenset(), targets: list[tuple[str, str]] | None = None) -> Probe | None:
    """Instrument `tests` (pytest node ids in the file `path`, whose text is `source`); None when the file
    cannot be read as Python or holds none of them. `start` numbers the tests after those of other files;
    `focus` holds the line numbers the task's test patch added (their literals are perturbed first); `targets`
    ([path suffix, qualified name]) are the functions whose calls the replay line records."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError, RecursionError):
        return None
    probe = Probe("", [])
    extra_classes: list[ast.stmt] = []
    extra_funcs: list[ast.stmt] = []
    done: set[int] = set()
    for ti, tid in enumerate(tests, start):
        found = _find(tree, tid)
        if found is None:
            continue
        cls, fn, inherited = found
        if _suspends(fn) or id(fn) in done:  # one method that several test classes inherit: instrumented once
            continue
        base_id = tid.split("[", 1)[0]
        if base_id in probe.run_ids:  # two parametrized cases of one function: it is instrumented once
            continue
        done.add(id(fn))
        prefix = f"t{ti}"
        original = copy.deepcopy(fn)
        v0 = _instrumented(original, prefix, probe.sites, base_id)
        done.add(id(v0))  # a later class inheriting from this one finds the instrumented method
        _decorate(v0, f"{prefix}.v0")
        probe.variants[f"{prefix}.v0"] = Variant(f"{prefix}.v0", base_id, "v0")
        if inherited:  # an override in the test's own class: the base's other subclasses keep running the original
            cls.body.append(v0)
        else:
            idx = (cls.body if cls else tree.body).index(fn)
            (cls.body if cls else tree.body)[idx] = v0
        probe.run_ids.append(base_id)
        copies: list[ast.FunctionDef] = []

        def add(body_fn: ast.FunctionDef, kind: str, k: str, what: str = "", site: str = "", scrub: bool = False,
                ti=ti, prefix=prefix, base_id=base_id, copies=copies) -> None:
            vid = f"{prefix}.{k}"
            new = _instrumented(body_fn, prefix, None, base_id)
            new.name = f"test_gp{nonce}_{k}_{ti}"
            _decorate(new, vid, scrub)
            copies.append(new)
            probe.variants[vid] = Variant(vid, base_id, kind, what, site)

        renamed = _rename_inner(original, nonce)
        add(renamed, "rn", "rn", "the test (and the classes and functions it defines) renamed")
        add(renamed, "env", "env", "PYTEST_CURRENT_TEST and sys.argv hidden", scrub=True)
        # Every copy starts from the renamed test, so a copy differs from `rn` only by what it says it changes.
        walk_sites = _site_order(renamed)
        for new, stmt_index, what in expected_variants(renamed):
            add(new, "x", f"x{stmt_index}", what, site=f"{prefix}.{walk_sites.get(stmt_index, -1)}")
        for k, (new, what) in enumerate(perturbations(renamed, focus)):
            add(new, "p", f"p{k}", what)
            probe.variants[f"{prefix}.p{k}"].retyped = RETYPED in what
        if cls is not None:
            sub = ast.ClassDef(name=f"TestGp{nonce}{ti}", bases=[ast.Name(cls.name, ast.Load())], keywords=[],
                               body=copies, decorator_list=[])
            if sys.version_info >= (3, 12):
                sub.type_params = []
            extra_classes.append(sub)
            probe.run_ids += [f"{path}::{sub.name}::{c.name}" for c in copies]
        else:
            extra_funcs += copies
            probe.run_ids += [f"{path}::{c.name}" for c in copies]
    if not probe.variants:
        return None
    tree.body = _after_prelude(tree.body, _runtime(nonce, targets or [])) + extra_classes + extra_funcs
    ast.fix_missing_locations(tree)
    probe.source = ast.unparse(tree) + "\n"
    return probe


def _suspends(fn: ast.FunctionDef) -> bool:
    """A generator or coroutine test (its own body yields or awaits; a helper generator it defines does not count):
    the recorder's decorator does not wrap those."""
    todo: list[ast.AST] = list(fn.body)
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.Await, ast.Yield, ast.YieldFrom)):
            return True
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            todo += ast.iter_child_nodes(node)
    return False


def _rename_inner(fn: ast.FunctionDef, nonce: str) -> ast.FunctionDef:
    """A copy of `fn` whose own classes and helper functions have fresh names (a hack may look for a test's
    helper class by name); methods and dunder names keep theirs (they are protocol, not identity)."""
    new = copy.deepcopy(fn)
    inside_class = {id(m) for c in ast.walk(new) if isinstance(c, ast.ClassDef) for m in c.body}
    # A fresh name that does not contain the old one: a hack may match a part of it (`'Bad' in name`).
    inner = [n.name for n in ast.walk(new) if isinstance(n, (ast.ClassDef, ast.FunctionDef)) and n is not new
             and id(n) not in inside_class and not n.name.startswith("__")]
    names = {name: f"{'Gp' if name[:1].isupper() else 'gp'}{nonce}x{i}" for i, name in enumerate(dict.fromkeys(inner))}
    for n in ast.walk(new):
        if isinstance(n, (ast.ClassDef, ast.FunctionDef)) and n.name in names and id(n) not in inside_class:
            n.name = names[n.name]
        elif isinstance(n, ast.Name) and n.id in names:
            n.id = names[n.id]
    return new


def _site_order(fn: ast.AST) -> dict[int, int]:
    """Walk-order index of each site statement → its site number (the numbering `Instrument` gives)."""
    walk = list(ast.walk(fn))
    inst = Instrument("s", {}, "")
    copy_fn = copy.deepcopy(fn)
    numbered: dict[int, int] = {}
    # Number the sites of a copy, keeping which original statement each came from.
    marks = {id(n): i for i, n in enumerate(ast.walk(copy_fn))}
    orig_new = inst._new

    def tracked(node: ast.AST) -> str:
        sid = orig_new(node)
        if id(node) in marks:
            numbered[marks[id(node)]] = int(sid.rsplit(".", 1)[1])
        return sid

    inst._new = tracked  # type: ignore[method-assign]
    for st in copy_fn.body:  # type: ignore[attr-defined]
        inst.visit(st)
    return {i: numbered[i] for i in numbered if i < len(walk)}


def _runtime(nonce: str, targets: list[tuple[str, str]]) -> list[ast.stmt]:
    src = (f"import types as _gp_types\n{RT} = _gp_types.ModuleType('_gagar_probe')\n"
           f"exec(compile({RUNTIME_SOURCE!r}, '<gagar-probe>', 'exec'), {RT}.__dict__)\n{RT}.setup({nonce!r})\n")
    if targets:
        src += f"{RT}.replay_setup({[list(t) for t in targets]!r})\n"
    return ast.parse(src).body


def _after_prelude(body: list[ast.stmt], insert: list[ast.stmt]) -> list[ast.stmt]:
    i = 0
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
            and isinstance(body[0].value.value, str):
        i = 1
    while i < len(body) and isinstance(body[i], ast.ImportFrom) and body[i].module == "__future__":
        i += 1
    return body[:i] + insert + body[i:]
