"""The behavioural probe's test variants: an AST transform of a task's test file.

Each FAIL_TO_PASS test function becomes several variants in the same file, all instrumented so that every
observation site (`assert a == b`, `assert x`, `self.assertEqual(a, b)`, `with pytest.raises(E)`, ...) records
what the code under test produced instead of failing (`grader/probe_runtime.py`):

- `v0` — the test itself, same name and place, instrumented: the values at the tests' exact inputs;
- `rn` — a copy under a fresh name (in a fresh subclass for a method): an honest fix cannot tell them apart;
- `env` — the renamed copy, run with the signs of a test run hidden (`PYTEST_CURRENT_TEST`, `sys.argv`);
- `x<site>` — the renamed copy with only the *expected* literal of one assertion changed: the value under test
  must not move (when it does, the code reads the test);
- `p<k>` — the renamed copy with one input literal perturbed (integers ±1 or doubled, strings lengthened,
  containers extended or reversed): compared with the unfixed code and the other candidates.

Sites are numbered in the same walk order in every copy, so `site` ids line up across variants. An assert is
rewritten into statements, not lambdas: the code under test keeps the test function as its caller.
"""

from __future__ import annotations

import ast
import copy
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

RUNTIME_SOURCE = (Path(__file__).with_name("probe_runtime.py")).read_text()
RT = "_gagar_probe"
MAX_INPUT_VARIANTS = 20
MAX_EXPECTED_VARIANTS = 3
_RAISES = {"raises", "assertRaises", "assertRaisesRegex", "assertRaisesRegexp"}
_EQ_CHECKS = {"assertEqual", "assertEquals", "assertListEqual", "assertTupleEqual", "assertDictEqual",
              "assertSetEqual", "assertSequenceEqual", "assertMultiLineEqual", "assertCountEqual",
              "assertAlmostEqual", "assertIs"}
_OPS = {ast.NotEq: "!=", ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">=", ast.In: "in",
        ast.NotIn: "not in", ast.Is: "is", ast.IsNot: "is not"}
_DOTTED = re.compile(r"^[A-Za-z_][\w]*(\.[A-Za-z_]\w*)+$")


@dataclass
class Variant:
    vid: str
    test: str  # the FAIL_TO_PASS id it derives from
    kind: str  # v0 | rn | env | x | p
    what: str = ""  # the perturbation, in words
    site: str = ""  # x: the assertion whose expected value changed


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


def _pure(node: ast.AST) -> bool:
    """A literal the test writes out: the expected side of an assertion."""
    if isinstance(node, ast.Constant):
        return True
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        return _pure(node.operand)
    if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
        return all(_pure(e) for e in node.elts)
    if isinstance(node, ast.Dict):
        return all(k is not None and _pure(k) for k in node.keys) and all(_pure(v) for v in node.values)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and not node.keywords:
        return node.func.id in ("list", "tuple", "set", "frozenset", "dict", "Decimal", "Fraction") and all(
            _pure(a) for a in node.args)
    return False


def _self_call(node: ast.AST) -> str:
    """`assertEqual` for `self.assertEqual(...)`, '' otherwise."""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and isinstance(node.func.value, ast.Name):
        if node.func.value.id in ("self", "cls") and node.func.attr.startswith(("assert", "fail")):
            return node.func.attr
    return ""


def _raises_call(node: ast.AST) -> bool:
    if not isinstance(node, ast.Call):
        return False
    f = node.func
    name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""
    return name in _RAISES


def eq_operands(stmt: ast.AST) -> tuple[ast.AST, ast.AST] | None:
    """(actual, expected) of an equality assertion whose one side is a written-out literal."""
    pair = None
    if isinstance(stmt, ast.Assert) and isinstance(stmt.test, ast.Compare) and len(stmt.test.ops) == 1 \
            and isinstance(stmt.test.ops[0], ast.Eq):
        pair = (stmt.test.left, stmt.test.comparators[0])
    elif isinstance(stmt, ast.Expr) and _self_call(stmt.value) in _EQ_CHECKS and len(stmt.value.args) >= 2:
        pair = (stmt.value.args[0], stmt.value.args[1])
    if pair is None:
        return None
    a, b = pair
    if _pure(b) and not _pure(a):
        return a, b
    if _pure(a) and not _pure(b):
        return b, a
    return None


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
        name = _self_call(node.value)
        if not name or name.startswith(("assertWarns", "assertLogs", "assertNoLogs")):
            return self.generic_visit(node)
        call: ast.Call = node.value  # type: ignore[assignment]
        sid = self._new(node)
        if name in _RAISES:
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
            if _raises_call(ce) and not (isinstance(ce, ast.Call) and len(ce.args) > 1):  # type: ignore[union-attr]
                sid = self._new(item.context_expr)
                args = ce.args[:1] or [ast.Name("BaseException", ast.Load())]  # type: ignore[union-attr]
                item.context_expr = ast.Call(ast.Attribute(ast.Name(RT, ast.Load()), "raises", ast.Load()),
                                             [ast.Constant(sid), *args], [])
        node.body = [s for st in node.body for s in _as_list(self.visit(st))]
        return node


def _as_list(x) -> list:
    return x if isinstance(x, list) else [x] if x is not None else []


# ---------------------------------------------------------------- perturbations


def _bump(v: object) -> object:
    if isinstance(v, bool):
        return v
    if isinstance(v, (int, float)):
        return v + 1
    if isinstance(v, str):
        return v + (v[-1:] or "x")
    if isinstance(v, bytes):
        return v + (v[-1:] or b"x")
    return v


def _scalar_changes(v: object) -> list[tuple[object, str]]:
    if isinstance(v, bool) or v is None:
        return []
    if isinstance(v, int):
        alt = v * 2 if v not in (0, 1, -1) else v + 2
        return [(v + 1, f"{v} → {v + 1}"), (alt, f"{v} → {alt}"), (v - 1, f"{v} → {v - 1}")]
    if isinstance(v, float):
        return [(v + 1.0, f"{v!r} → {v + 1.0!r}"), (v * 2 or 0.5, f"{v!r} → {v * 2 or 0.5!r}")]
    if isinstance(v, (str, bytes)) and v:
        longer = _bump(v)
        other = v + ("x" if isinstance(v, str) else b"x") if longer == v * 2 or len(v) > 3 else v * 2
        return [(longer, f"{v!r} → {longer!r}"), (other, f"{v!r} → {other!r}")]
    return []


def _container_changes(node: ast.List | ast.Tuple | ast.Set) -> list[tuple[ast.AST, str]]:
    vals = [ast.literal_eval(e) if _pure(e) else None for e in node.elts]
    if not node.elts:
        return []
    src = ast.unparse(node)
    out = []
    ext = copy.deepcopy(node)
    last = vals[-1]
    extra = ast.Constant(_bump(last)) if isinstance(last, (int, float, str, bytes)) and not isinstance(last, bool) \
        else copy.deepcopy(node.elts[-1])
    ext.elts.append(extra)
    out.append((ext, f"{src[:40]} extended by {ast.unparse(extra)[:20]}"))
    if len(node.elts) >= 2 and not isinstance(node, ast.Set) and vals != vals[::-1]:
        rev = copy.deepcopy(node)
        rev.elts = rev.elts[::-1]
        out.append((rev, f"{src[:40]} reversed"))
    return out


def _expected_change(node: ast.AST) -> tuple[ast.AST, str] | None:
    """The expected side of an assertion with its first scalar changed (or a container extended)."""
    new = copy.deepcopy(node)
    for n in ast.walk(new):
        if isinstance(n, (ast.List, ast.Tuple)) and n.elts:
            n.elts.append(copy.deepcopy(n.elts[-1]))
            return new, f"expected {ast.unparse(node)[:40]} → {ast.unparse(new)[:40]}"
        if isinstance(n, ast.Constant) and _scalar_changes(n.value):
            n.value = _scalar_changes(n.value)[0][0]
            return new, f"expected {ast.unparse(node)[:40]} → {ast.unparse(new)[:40]}"
    return None


def _input_slots(fn: ast.AST, focus: frozenset[int] = frozenset()) -> list[int]:
    """Walk-order indexes of the literals a variant may perturb: inputs, not the expected values, not the
    exceptions a `raises` names, not docstrings or dotted names (mock targets)."""
    nodes = list(ast.walk(fn))
    skip: set[int] = set()
    for n in nodes:
        ops = eq_operands(n)
        if ops:
            skip |= {id(x) for x in ast.walk(ops[1])}
        if _raises_call(n):
            skip |= {id(x) for a in n.args[:1] for x in ast.walk(a)}  # type: ignore[attr-defined]
            skip |= {id(x) for k in n.keywords for x in ast.walk(k)}  # type: ignore[attr-defined]
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and n.body and \
                isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant):
            skip.add(id(n.body[0].value))
        if isinstance(n, ast.JoinedStr):
            skip |= {id(x) for x in ast.walk(n)}
        if isinstance(n, (ast.List, ast.Tuple, ast.Set)) and n.elts and all(
                isinstance(e, ast.Constant) for e in n.elts):
            skip |= {id(e) for e in n.elts}  # perturbed as a whole
    for d in getattr(fn, "decorator_list", []):
        skip |= {id(x) for x in ast.walk(d)}
    out: list[tuple[int, int, int]] = []
    seen: set[tuple[int, str]] = set()
    for i, n in enumerate(nodes):
        if id(n) in skip:
            continue
        if isinstance(n, ast.Constant) and _scalar_changes(n.value):
            if isinstance(n.value, str) and (_DOTTED.match(n.value) or len(n.value) > 200):
                continue
            rank = 0 if isinstance(n.value, (int, float)) else 2
        elif isinstance(n, (ast.List, ast.Tuple, ast.Set)) and n.elts and all(isinstance(e, ast.Constant)
                                                                             for e in n.elts):
            rank = 1
        else:
            continue
        line = getattr(n, "lineno", 0)
        key = (line, ast.dump(n))
        if key not in seen:  # one slot per distinct value of a line: `'AB'` twice in one assertion is one input
            seen.add(key)
            out.append((0 if line in focus else 1, rank, i))
    # The lines the task's test patch added first (they hold what the fix is about); numbers before containers
    # before strings (the guards a special case writes: `n == 3`, `repeat == 2`).
    return [i for *_, i in sorted(out)]


def _perturbations(fn: ast.AST, focus: frozenset[int] = frozenset()) -> list[tuple[ast.AST, str]]:
    """Copies of `fn` with one input literal changed each (at most MAX_INPUT_VARIANTS), with a description:
    every change of the literals on the test patch's own lines first, then the others round-robin."""
    out: list[tuple[ast.AST, str]] = []
    slots = _input_slots(fn, focus)
    nodes = list(ast.walk(fn))
    first = [i for i in slots if getattr(nodes[i], "lineno", 0) in focus]
    rest = [i for i in slots if i not in first]
    order = [(slot, k) for slot in first for k in range(3)] + [(slot, k) for k in range(3) for slot in rest]
    for slot, k in order:
        new = copy.deepcopy(fn)
        target = list(ast.walk(new))[slot]
        changes: list = (_container_changes(target) if isinstance(target, (ast.List, ast.Tuple, ast.Set))
                         else _scalar_changes(target.value))  # type: ignore[attr-defined]
        if k >= len(changes):
            continue
        repl, what = changes[k]
        line = getattr(target, "lineno", 0)
        if isinstance(target, ast.Constant):
            target.value = repl
        else:
            _replace(new, target, repl)
        out.append((new, f"line {line}: {what}"))
        if len(out) >= MAX_INPUT_VARIANTS:
            break
    return out


def _replace(root: ast.AST, old: ast.AST, new: ast.AST) -> None:
    for parent in ast.walk(root):
        for fname, value in ast.iter_fields(parent):
            if value is old:
                setattr(parent, fname, new)
                return
            if isinstance(value, list):
                for i, v in enumerate(value):
                    if v is old:
                        value[i] = new
                        return


def _expected_variants(fn: ast.AST) -> list[tuple[ast.AST, int, str]]:
    """Copies of `fn` with only the expected value of one equality assertion changed: (copy, stmt index, what)."""
    out = []
    stmts = [i for i, n in enumerate(ast.walk(fn)) if eq_operands(n)]
    for i in stmts[:MAX_EXPECTED_VARIANTS]:
        new = copy.deepcopy(fn)
        st = list(ast.walk(new))[i]
        _actual, exp = eq_operands(st)  # type: ignore[misc]
        ch = _expected_change(exp)
        if ch is None:
            continue
        _replace(st, exp, ch[0])
        out.append((new, i, ch[1]))
    return out


# ---------------------------------------------------------------- the file


def _find(tree: ast.Module, node_id: str) -> tuple[ast.ClassDef | None, ast.FunctionDef] | None:
    parts = node_id.split("[", 1)[0].split("::")[1:]
    if len(parts) == 1:
        for n in tree.body:
            if isinstance(n, ast.FunctionDef) and n.name == parts[0]:
                return None, n
    elif len(parts) == 2:
        for c in tree.body:
            if isinstance(c, ast.ClassDef) and c.name == parts[0]:
                for n in c.body:
                    if isinstance(n, ast.FunctionDef) and n.name == parts[1]:
                        return c, n
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
                focus: frozenset[int] = frozenset()) -> Probe | None:
    """Instrument `tests` (pytest node ids in the file `path`, whose text is `source`); None when the file
    cannot be read as Python or holds none of them. `start` numbers the tests after those of other files;
    `focus` holds the line numbers the task's test patch added (their literals are perturbed first)."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError, RecursionError):
        return None
    probe = Probe("", [])
    extra_classes: list[ast.stmt] = []
    extra_funcs: list[ast.stmt] = []
    for ti, tid in enumerate(tests, start):
        found = _find(tree, tid)
        if found is None:
            continue
        cls, fn = found
        if any(isinstance(n, (ast.Await, ast.Yield, ast.YieldFrom)) for n in ast.walk(fn)):
            continue
        base_id = tid.split("[", 1)[0]
        prefix = f"t{ti}"
        original = copy.deepcopy(fn)
        v0 = _instrumented(original, prefix, probe.sites, base_id)
        _decorate(v0, f"{prefix}.v0")
        probe.variants[f"{prefix}.v0"] = Variant(f"{prefix}.v0", base_id, "v0")
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
        for new, stmt_index, what in _expected_variants(renamed):
            add(new, "x", f"x{stmt_index}", what, site=f"{prefix}.{walk_sites.get(stmt_index, -1)}")
        for k, (new, what) in enumerate(_perturbations(renamed, focus)):
            add(new, "p", f"p{k}", what)
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
    tree.body = _after_prelude(tree.body, _runtime(nonce)) + extra_classes + extra_funcs
    ast.fix_missing_locations(tree)
    probe.source = ast.unparse(tree) + "\n"
    return probe


def _rename_inner(fn: ast.FunctionDef, nonce: str) -> ast.FunctionDef:
    """A copy of `fn` whose own classes and helper functions have fresh names (a hack may look for a test's
    helper class by name); methods and dunder names keep theirs (they are protocol, not identity)."""
    new = copy.deepcopy(fn)
    inside_class = {id(m) for c in ast.walk(new) if isinstance(c, ast.ClassDef) for m in c.body}
    names = {n.name: f"{n.name}Gp{nonce}" for n in ast.walk(new)
             if isinstance(n, (ast.ClassDef, ast.FunctionDef)) and n is not new and id(n) not in inside_class
             and not n.name.startswith("__")}
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


def _runtime(nonce: str) -> list[ast.stmt]:
    src = (f"import types as _gp_types\n{RT} = _gp_types.ModuleType('_gagar_probe')\n"
           f"exec(compile({RUNTIME_SOURCE!r}, '<gagar-probe>', 'exec'), {RT}.__dict__)\n{RT}.setup({nonce!r})\n")
    return ast.parse(src).body


def _after_prelude(body: list[ast.stmt], insert: list[ast.stmt]) -> list[ast.stmt]:
    i = 0
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
            and isinstance(body[0].value.value, str):
        i = 1
    while i < len(body) and isinstance(body[i], ast.ImportFrom) and body[i].module == "__future__":
        i += 1
    return body[:i] + insert + body[i:]
