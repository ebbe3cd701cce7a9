"""The literals of a test function, for the behavioural probe: which side of an assertion is written out, and
how an input or expected literal may change (integers +1, doubled, as a float of the same value, −1; strings
lengthened, their digits moved on or a boolean word flipped; a delimited string — `a.b.c` — given one more
element at its end and at its start; containers extended by one and by two, reversed, or one element's content
changed; a number a call passes twice changed everywhere in that call at once; the cases of
`@pytest.mark.parametrize` perturbed like the body's literals). `grader.probe.transform` builds the variants.
"""

from __future__ import annotations

import ast
import copy
import re

MAX_INPUT_VARIANTS = 48
# A change that keeps the value and changes only its type (1024 → 1024.0): an honest fix may reject the new
# type, so it is evidence only where a candidate then answers like the unfixed code (collapse), never where it
# raises (breaks off the inputs, silences). Its description starts with this.
RETYPED = "same value, "
MAX_EXPECTED_VARIANTS = 3
MAX_CHANGES = 7  # changes tried per literal (breadth first, up to MAX_INPUT_VARIANTS in all)
RAISES = {"raises", "assertRaises", "assertRaisesRegex", "assertRaisesRegexp"}
EQ_CHECKS = {"assertEqual", "assertEquals", "assertListEqual", "assertTupleEqual", "assertDictEqual",
              "assertSetEqual", "assertSequenceEqual", "assertMultiLineEqual", "assertCountEqual",
              "assertAlmostEqual", "assertIs"}
_SEPARATORS = (".", "/", ",", ":", ";", "-", "|")
_NAMES_CODE = re.compile(r"(?i)patch|mock|import|attr|fixture|mark|lookup|resolve|load|entry|module")
_FLIPS = {"True": "False", "False": "True", "true": "false", "false": "true", "TRUE": "FALSE", "FALSE": "TRUE"}
_NEXT_DIGIT = str.maketrans("0123456789", "1234567890")
_DOTTED = re.compile(r"^[A-Za-z_][\w]*(\.[A-Za-z_]\w*)+$")


def is_literal(node: ast.AST) -> bool:
    """A literal the test writes out: the expected side of an assertion."""
    if isinstance(node, ast.Constant):
        return True
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        return is_literal(node.operand)
    if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
        return all(is_literal(e) for e in node.elts)
    if isinstance(node, ast.Dict):
        return all(k is not None and is_literal(k) for k in node.keys) and all(is_literal(v) for v in node.values)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and not node.keywords:
        return node.func.id in ("list", "tuple", "set", "frozenset", "dict", "Decimal", "Fraction") and all(
            is_literal(a) for a in node.args)
    return False


def self_assert(node: ast.AST) -> str:
    """`assertEqual` for `self.assertEqual(...)`, '' otherwise."""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and isinstance(node.func.value, ast.Name):
        if node.func.value.id in ("self", "cls") and node.func.attr.startswith(("assert", "fail")):
            return node.func.attr
    return ""


def raises_call(node: ast.AST) -> bool:
    if not isinstance(node, ast.Call):
        return False
    f = node.func
    name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""
    return name in RAISES


def eq_operands(stmt: ast.AST) -> tuple[ast.AST, ast.AST] | None:
    """(actual, expected) of an equality assertion whose one side is a written-out literal."""
    pair = None
    if isinstance(stmt, ast.Assert) and isinstance(stmt.test, ast.Compare) and len(stmt.test.ops) == 1 \
            and isinstance(stmt.test.ops[0], ast.Eq):
        pair = (stmt.test.left, stmt.test.comparators[0])
    elif isinstance(stmt, ast.Expr) and self_assert(stmt.value) in EQ_CHECKS and len(stmt.value.args) >= 2:
        pair = (stmt.value.args[0], stmt.value.args[1])
    if pair is None:
        return None
    a, b = pair
    if is_literal(b) and not is_literal(a):
        return a, b
    if is_literal(a) and not is_literal(b):
        return b, a
    return None




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
        out = [(v + 1, f"{v} → {v + 1}"), (alt, f"{v} → {alt}")]
        # The same number as a float: code that checks `type(n) is int` (a fix for ints only) shows itself.
        if abs(v) < 2 ** 53:
            out.append((float(v), f"{RETYPED}{v} → {float(v)!r}"))
        return [*out, (v - 1, f"{v} → {v - 1}")]
    if isinstance(v, float):
        return [(v + 1.0, f"{v!r} → {v + 1.0!r}"), (v * 2 or 0.5, f"{v!r} → {v * 2 or 0.5!r}")]
    if isinstance(v, (str, bytes)) and v:
        longer = _bump(v)
        other = v + ("x" if isinstance(v, str) else b"x") if longer == v * 2 or len(v) > 3 else v * 2
        out = [(longer, f"{v!r} → {longer!r}"), (other, f"{v!r} → {other!r}")]
        return (_segment_changes(v) or out) + _content_changes(v)
    return []


def _digit_change(v: str | bytes) -> list[tuple[object, str]]:
    """The string with every digit moved on by one (`'.03'` → `'.14'`, `'x2'` → `'x3'`): the same shape with a
    different content, where lengthening at the end leaves a guard on the digits the test wrote untouched."""
    if not isinstance(v, str) or len(v) > 200 or not any(c in "0123456789" for c in v):
        return []
    new = v.translate(_NEXT_DIGIT)
    return [(new, f"{v!r} → {new!r}")]


def _content_changes(v: object) -> list[tuple[object, str]]:
    """Changes of a string's content that keep its shape: its digits moved on, or a boolean word flipped
    (`'True'` → `'False'`): the words a special case tests for (`cell in ('True', None)`)."""
    if not isinstance(v, str):
        return []
    flip = _FLIPS.get(v.strip())
    if flip is not None:
        new = v.replace(v.strip(), flip)
        return [(new, f"{v!r} → {new!r}")]
    return _digit_change(v)


def _segment_changes(v: str | bytes) -> list[tuple[object, str]]:
    """A delimited string (`a.b.c`, `x/y`, `1,2`) with one more element, at the end and at the start — the
    container extension of a string that is a list in disguise — after the plain lengthening."""
    if not isinstance(v, str) or len(v) > 80 or "\n" in v:
        return []
    sep = next((c for c in _SEPARATORS if c in v.strip(c)), None)
    if sep is None:
        return []
    parts = v.split(sep)
    if not parts[0] or not parts[-1] or not all(p.strip() for p in parts):
        return []
    longer = _bump(v)
    after, before = v + sep + parts[-1], parts[0] + sep + v
    return [(longer, f"{v!r} → {longer!r}"), (after, f"{v!r} → {after!r}"), (before, f"{v!r} → {before!r}")]


def _container_changes(node: ast.List | ast.Tuple | ast.Set) -> list[tuple[ast.AST, str]]:
    vals = [ast.literal_eval(e) if is_literal(e) else None for e in node.elts]
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
    # Two more elements: a guard on the test's lengths (`len(row) <= 2`) survives one more, not a length the
    # test never reaches.
    ext2 = copy.deepcopy(ext)
    more = ast.Constant(_bump(extra.value)) if isinstance(extra, ast.Constant) else copy.deepcopy(extra)
    ext2.elts.append(more)
    out.append((ext2, f"{src[:40]} extended by two"))
    # One element's content changed in place (a flipped boolean word, moved digits): a table of the test's
    # values keyed on the element, not on the container's length.
    for i, v in enumerate(vals[:4]):
        for new_v, what in _content_changes(v):
            swap = copy.deepcopy(node)
            swap.elts[i] = ast.Constant(new_v)
            out.append((swap, f"{src[:40]} with {what}"))
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
    inside_cases, case_lists = _parametrize_cases(fn)
    for n in nodes:
        ops = eq_operands(n)
        if ops:
            skip |= {id(x) for x in ast.walk(ops[1])}
        if raises_call(n):
            skip |= {id(x) for a in n.args[:1] for x in ast.walk(a)}  # type: ignore[attr-defined]
            skip |= {id(x) for k in n.keywords for x in ast.walk(k)}  # type: ignore[attr-defined]
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and n.body and \
                isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant):
            skip.add(id(n.body[0].value))
        if isinstance(n, ast.JoinedStr):
            skip |= {id(x) for x in ast.walk(n)}
        if isinstance(n, (ast.List, ast.Tuple, ast.Set)) and n.elts and all(
                isinstance(e, ast.Constant) for e in n.elts) and id(n) not in case_lists:
            skip |= {id(e) for e in n.elts}  # perturbed as a whole
    for d in getattr(fn, "decorator_list", []):
        skip |= {id(x) for x in ast.walk(d)} - inside_cases
    # A dotted string handed to mock.patch, importlib, getattr & co names code, not data: left alone. Elsewhere
    # (`parse("db.schema.tbl")`) it is an input like any other.
    targets = {id(a) for n in nodes if isinstance(n, ast.Call) and _NAMES_CODE.search(
        n.func.attr if isinstance(n.func, ast.Attribute) else getattr(n.func, "id", "")) for a in
        [*n.args, *(k.value for k in n.keywords)]}
    out: list[tuple[int, int, int]] = []
    seen: set[tuple[int, str]] = set()
    for i, n in enumerate(nodes):
        if id(n) in skip:
            continue
        if isinstance(n, ast.Constant) and _scalar_changes(n.value):
            if isinstance(n.value, str) and ((_DOTTED.match(n.value) and id(n) in targets) or len(n.value) > 200):
                continue
            rank = 0 if isinstance(n.value, (int, float)) else 2
        elif isinstance(n, (ast.List, ast.Tuple, ast.Set)) and n.elts and id(n) not in case_lists and all(
                isinstance(e, ast.Constant) for e in n.elts):
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


def _parametrize_cases(fn: ast.AST) -> tuple[set[int], set[int]]:
    """The literals of `@pytest.mark.parametrize(names, cases)`: a parametrized test's inputs live there, not in
    its body. Returns (ids of every node inside the cases, ids of the case list and its case tuples): a case's
    constants are perturbed one by one, never the list or a tuple as a whole (extending or reversing them would
    change the arity or only the order, not an input)."""
    inside: set[int] = set()
    lists: set[int] = set()
    for d in getattr(fn, "decorator_list", []):
        if not (isinstance(d, ast.Call) and isinstance(d.func, ast.Attribute) and d.func.attr == "parametrize"
                and len(d.args) >= 2 and isinstance(d.args[1], (ast.List, ast.Tuple))):
            continue
        inside |= {id(x) for x in ast.walk(d.args[1])}
        lists.add(id(d.args[1]))
        lists |= {id(c) for c in d.args[1].elts if isinstance(c, (ast.List, ast.Tuple))}
    return inside, lists


def _joint_perturbations(fn: ast.AST, focus: frozenset[int]) -> list[tuple[ast.AST, str]]:
    """Copies of `fn` where a number a call on a test-patch line (any line without `focus`) passes more than once (`backoff(5, 5)`) changes
    everywhere in that call at once (+1, then doubled): one literal at a time breaks the relation the inputs
    hold (start == stop), so only a joint change asks the same question on a new value."""
    out: list[tuple[ast.AST, str]] = []
    nodes = list(ast.walk(fn))
    for ci, call in enumerate(nodes):
        if not isinstance(call, ast.Call) or (focus and getattr(call, "lineno", 0) not in focus):
            continue
        args = [*call.args, *(k.value for k in call.keywords)]
        nums = [a.value for a in args if isinstance(a, ast.Constant) and type(a.value) in (int, float)]
        for v in sorted({x for x in nums if nums.count(x) >= 2 and x not in (0, 1)}, key=repr):
            for new_v in (v + 1, v * 2):
                new = copy.deepcopy(fn)
                target = list(ast.walk(new))[ci]
                for a in [*target.args, *(k.value for k in target.keywords)]:  # type: ignore[attr-defined]
                    if isinstance(a, ast.Constant) and type(a.value) is type(v) and a.value == v:
                        a.value = new_v
                out.append((new, f"line {call.lineno}: every {v!r} of the call → {new_v!r}"))
    return out[:4]


def perturbations(fn: ast.AST, focus: frozenset[int] = frozenset()) -> list[tuple[ast.AST, str]]:
    """Copies of `fn` with one input literal changed each (at most MAX_INPUT_VARIANTS), with a description:
    the joint changes of a repeated number first, then the literals on the test patch's own lines, then the
    others, each group breadth first (every literal's first change, then every literal's second, ...)."""
    out: list[tuple[ast.AST, str]] = _joint_perturbations(fn, focus)
    slots = _input_slots(fn, focus)
    nodes = list(ast.walk(fn))
    first = [i for i in slots if getattr(nodes[i], "lineno", 0) in focus]
    rest = [i for i in slots if i not in first]
    # Breadth first: every literal's first change before any literal's second, so a test with many inputs has
    # each of them moved once (a table of the test's values is found wherever it sits) within the cap.
    order = [(slot, k) for k in range(MAX_CHANGES) for slot in first] + [
        (slot, k) for k in range(MAX_CHANGES) for slot in rest]
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
            replace_node(new, target, repl)
        out.append((new, f"line {line}: {what}"))
        if len(out) >= MAX_INPUT_VARIANTS:
            break
    return out


def replace_node(root: ast.AST, old: ast.AST, new: ast.AST) -> None:
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


def expected_variants(fn: ast.AST) -> list[tuple[ast.AST, int, str]]:
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
        replace_node(st, exp, ch[0])
        out.append((new, i, ch[1]))
    return out
