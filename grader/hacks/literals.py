"""Literal values of source code and of a task's tests, for telling special-cased test inputs from general code.

A literal is normalised to a hashable key, `("s", text)` or `("n", number)`, so that `1024`, `1024.0` and a
Go `int64(1024)` compare equal and a Python `Decimal("2.675")` input matches a `2.675` written elsewhere.
Python is read with `tokenize` (exact string values); Go and Java with a small scanner that skips comments and
decodes the common escapes. Nothing here runs or imports the code it reads.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from unidiff import PatchSet
from unidiff.errors import UnidiffParseError

Key = tuple[str, object]
LANGS = {".py": "py", ".go": "go", ".java": "java", ".kt": "java", ".scala": "java"}
# Values general code compares against all the time; never evidence of special-casing on their own.
_NEUTRAL_NUMS = {0.0, 1.0}
# Small integers are everywhere in general code (`len(parts) == 2`, `return -1`): they only count where a
# branch on a function's own parameter returns a test's expected value.
_WEAK_NUMS = {-2.0, -1.0, 2.0}
_WORD = re.compile(r"^[A-Za-z_]+$|^[A-Za-z_]\w*(\.[A-Za-z_]\w*)+$")
_C_TOKEN = re.compile(
    r"(?P<comment>//[^\n]*|/\*.*?\*/)"
    r"|(?P<str>\"(?:[^\"\\\n]|\\.)*\")"
    r"|(?P<raw>`[^`]*`)"
    r"|(?P<char>'(?:[^'\\\n]|\\.){1,6}')"
    r"|(?P<num>(?:0[xX][0-9a-fA-F_]+|\d[\d_]*(?:\.\d+)?(?:[eE][+-]?\d+)?|\.\d+(?:[eE][+-]?\d+)?)[lLfFdD]?\b)"
    r"|(?P<ident>[A-Za-z_$][\w$]*)"
    r"|(?P<op>==|!=|<=|>=|&&|\|\||:=|->|::|\S)",
    re.S,
)
_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "\\": "\\", '"': '"', "'": "'", "0": "\0"}
_UNARY_BEFORE = {"(", ",", "{", "[", "=", ":", "return", "case", "==", "!=", "<", ">", "?", "&&", "||", "+", "-",
                 "*", "/", "in", "not", "and", "or", "if", "elif", "while", "assert", "else", "yield", "lambda"}


@dataclass
class Token:
    kind: str  # str | num | ident | op
    value: object
    line: int
    col: int = 0


def lang_of(path: str) -> str:
    return LANGS.get(Path(path).suffix, "")


def key_of(value: object) -> Key | None:
    """The normalised key of a literal value (bool and None are not literals of interest)."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, (int, float)):
        try:
            return ("n", float(value))
        except OverflowError:
            return ("s", str(value))
    if isinstance(value, bytes):
        value = value.decode("latin-1")
    if isinstance(value, str):
        return ("s", value)
    return None


def keys_of(value: object) -> set[Key]:
    """A value's key plus its numeric reading when it is a number written as a string (`Decimal("2.675")`)."""
    k = key_of(value)
    if k is None:
        return set()
    out = {k}
    if k[0] == "s" and re.fullmatch(r"[+-]?\d+(\.\d+)?([eE][+-]?\d+)?", str(k[1]).strip()):
        try:
            out.add(("n", float(str(k[1]))))
        except ValueError:
            pass
    return out


def neutral(k: Key) -> bool:
    """None-like, 0/1 and blank strings: general code compares against these constantly."""
    if k[0] == "n":
        return k[1] in _NEUTRAL_NUMS
    return not str(k[1]).strip()


def weak(k: Key) -> bool:
    return k[0] == "n" and k[1] in _WEAK_NUMS


def distinctive(k: Key) -> bool:
    """A value that looks like test data rather than a domain constant: `"1s500ms"`, `2.675`, `1994`.

    Words (`"debug"`, `"utf_8"` style identifiers) and round or binary numbers (`900`, `1024`) are the
    vocabulary of general code; a string with digits, spaces or punctuation, a fractional number or an odd
    integer above 10 rarely is.
    """
    if k[0] == "n":
        x = float(k[1])
        if x != int(x):
            return True
        n = abs(int(x))
        if n <= 10 or n % 10 == 0:
            return False
        return (n & (n - 1)) != 0 and ((n + 1) & n) != 0
    s = str(k[1])
    return len(s.strip()) >= 3 and not _WORD.match(s)


def _unescape(body: str) -> str:
    def one(m: re.Match) -> str:
        if m.group(1):  # \uXXXX, \UXXXXXXXX, \xHH
            try:
                return chr(int(m.group(1)[1:], 16))
            except (ValueError, OverflowError):
                return m.group(0)
        return _ESCAPES.get(m.group(2), m.group(0))

    return re.sub(r"\\(u[0-9a-fA-F]{4}|U[0-9a-fA-F]{8}|x[0-9a-fA-F]{2})|\\(.)", one, body)


def c_tokens(text: str) -> list[Token]:
    """Tokens of Go/Java source with their line numbers; comments are dropped, strings decoded."""
    out: list[Token] = []
    line = 1
    pos = 0
    for m in _C_TOKEN.finditer(text):
        line += text.count("\n", pos, m.start())
        pos = m.start()
        kind = m.lastgroup
        raw = m.group()
        if kind == "comment":
            continue
        if kind == "str":
            out.append(Token("str", _unescape(raw[1:-1]), line))
        elif kind == "raw":
            out.append(Token("str", raw[1:-1], line))
        elif kind == "char":
            out.append(Token("str", _unescape(raw[1:-1]), line))
        elif kind == "num":
            out.append(Token("num", _c_number(raw), line))
        else:
            out.append(Token(kind or "op", raw, line))
    return out


def _c_number(raw: str) -> object:
    s = raw.replace("_", "")
    try:
        if s.lower().startswith("0x"):
            return int(s.rstrip("lL"), 16)
        s = s.rstrip("lLfFdD")
        return int(s) if s.isdigit() else float(s)
    except ValueError:
        return raw


def py_tokens(text: str) -> list[Token]:
    """Tokens of (possibly fragmentary) Python with exact string values; stops quietly at a syntax error."""
    out: list[Token] = []
    try:
        for t in tokenize.generate_tokens(io.StringIO(text).readline):
            if t.type == tokenize.STRING:
                try:
                    val = ast.literal_eval(t.string)
                except (ValueError, SyntaxError, MemoryError, RecursionError):
                    continue
                out.append(Token("str", val, t.start[0], t.start[1]))
            elif t.type == tokenize.NUMBER:
                try:
                    out.append(Token("num", ast.literal_eval(t.string), t.start[0], t.start[1]))
                except (ValueError, SyntaxError):
                    continue
            elif t.type == tokenize.NAME:
                out.append(Token("ident", t.string, t.start[0], t.start[1]))
            elif t.type == tokenize.OP:
                out.append(Token("op", t.string, t.start[0], t.start[1]))
            elif t.type == tokenize.NEWLINE:
                out.append(Token("op", "\n", t.start[0], t.start[1]))
    except (tokenize.TokenError, IndentationError, SyntaxError):
        pass
    return out


def tokens(text: str, lang: str) -> list[Token]:
    return py_tokens(text) if lang == "py" else c_tokens(text)


def literal_keys(toks: Iterable[Token]) -> Iterator[tuple[int, set[Key]]]:
    """(line, keys) for every literal token; a number after a unary minus is read as negative."""
    prev: Token | None = None
    prev2: Token | None = None
    for t in toks:
        if t.kind in ("str", "num"):
            value = t.value
            if (t.kind == "num" and isinstance(value, (int, float)) and prev is not None and prev.kind == "op"
                    and prev.value == "-" and _unary(prev2)):
                value = -value
            yield t.line, keys_of(value)
        prev2, prev = prev, t


def _unary(before: Token | None) -> bool:
    """Whether a `-` after `before` is a sign (not a subtraction)."""
    return before is None or (before.kind in ("op", "ident") and str(before.value) in _UNARY_BEFORE)


def source_literals(text: str, lang: str) -> set[Key]:
    return {k for _, ks in literal_keys(tokens(text, lang)) for k in ks}


@dataclass
class TaskLiterals:
    """What the task's tests feed in and expect: literal keys, the pairs that occur in one test statement,
    the exceptions they expect and the names of the failing tests."""

    values: set[Key] = field(default_factory=set)
    pairs: set[frozenset[Key]] = field(default_factory=set)
    exceptions: set[str] = field(default_factory=set)
    names: set[str] = field(default_factory=set)

    def __contains__(self, k: object) -> bool:
        return k in self.values

    def paired(self, a: Key, b: Key) -> bool:
        return frozenset((a, b)) in self.pairs


_RAISES = re.compile(r"(?:pytest\.raises|assertRaises(?:Regex)?|assertThrows|expectThrows)\(\s*\(?([\w.]+)")


def _statements(toks: list[Token], lang: str) -> list[list[Token]]:
    """Group tokens into statements: Python logical lines, Go/Java `;`/line ends at bracket depth 0."""
    groups: list[list[Token]] = [[]]
    depth = 0
    last_line = toks[0].line if toks else 0
    for t in toks:
        if lang != "py" and t.line != last_line and depth == 0 and groups[-1]:
            groups.append([])
        last_line = t.line
        if t.kind == "op" and t.value in ("(", "[", "{"):
            depth += 1
        elif t.kind == "op" and t.value in (")", "]", "}"):
            depth = max(0, depth - 1)
        if t.kind == "op" and (t.value == "\n" or (t.value == ";" and lang != "py")):
            groups.append([])
            continue
        groups[-1].append(t)
    return [g for g in groups if g]


def _test_names(fail_to_pass: Iterable[str]) -> tuple[set[str], set[Key]]:
    names: set[str] = set()
    params: set[Key] = set()
    for tid in fail_to_pass:
        tid = str(tid)
        head, _, param = tid.partition("[")
        if param:  # pytest parametrize ids: test_x[empty], test_y[1-2]
            p = param.rstrip("]")
            params |= keys_of(p)
            params |= {k for part in p.split("-") if len(part) > 1 for k in keys_of(part)}
        if "::" in head:  # pytest node id: path::Class::func
            names.add(head.rsplit("::", 1)[-1])
            continue
        head, _, sub = head.partition("/")  # Go subtests: TestX/case
        if sub:
            params |= {k for part in sub.split("/") for k in keys_of(part)}
        name = head.rsplit(".", 1)[-1]  # Java / unittest: pkg.Class.method
        if name:
            names.add(name)
    return names, params


def task_literals(test_patch: str, fail_to_pass: Iterable[str] = ()) -> TaskLiterals:
    """Literals on the lines the test patch adds (Python, Go, Java test files) and in FAIL_TO_PASS ids."""
    out = TaskLiterals()
    out.names, params = _test_names(fail_to_pass)
    out.values |= params
    try:
        files = PatchSet(test_patch or "")
    except (UnidiffParseError, ValueError):
        files = []
    for pf in files:
        lang = lang_of(pf.path)
        if not lang:
            continue
        for hunk in pf:
            text = "".join(ln.value for ln in hunk if ln.is_added)
            out.exceptions |= {m.group(1).rsplit(".", 1)[-1] for m in _RAISES.finditer(text)}
            toks = tokens(text, lang)
            for stmt in _statements(toks, lang):
                keys = {k for _, ks in literal_keys(stmt) for k in ks}
                out.values |= keys
                keyed = sorted((k for k in keys if not neutral(k)), key=repr)[:12]
                out.pairs |= {frozenset((a, b)) for a in keyed for b in keyed if a != b}
            for m in re.finditer(r"(?:def|func|void)\s+(test\w*|Test\w*|\w+)\s*\(", text):
                if lang == "py" and not m.group(1).startswith("test"):
                    continue
                out.names.add(m.group(1))
    return out
