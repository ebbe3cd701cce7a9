# ruff: noqa: UP031 - runs under whatever Python the task environment has; kept to old, plain syntax
"""The recorder the behavioural probe plants in a task's test file (its source is embedded there and run with
`exec`, so it needs nothing but the standard library and knows nothing of gagar).

Every observation site of an instrumented test (`assert a == b`, `self.assertEqual(a, b)`, `pytest.raises`, ...)
reports what the code under test produced — a canonical text of the value, or `!ExcType` when it raised — and
whether the test's own check held, as one JSON line in `$GAGAR_REPORT_DIR/gagar-probe-<nonce>.jsonl`. The
variant decorator makes a test never fail (the probe reads values, not verdicts) and records a crash.
Canonical text: builtin values (and subclasses of them) through the builtin's own repr, so a subclass cannot
lie about its value; containers element by element; other objects by repr without memory addresses.
"""

import functools
import json
import os
import re
import sys

MAX_BYTES = 6 << 20
MAX_PER_SITE = 40
MAX_TEXT = 240
_state = {"fd": None, "vid": "", "bytes": 0, "counts": {}, "nonce": ""}
_ADDR = re.compile(r" at 0x[0-9a-fA-F]+")


def setup(nonce):
    _state["nonce"] = nonce
    root = os.environ.get("GAGAR_REPORT_DIR") or "/tmp"
    try:
        _state["fd"] = os.open(os.path.join(root, "gagar-probe-%s.jsonl" % nonce),
                               os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    except OSError:
        _state["fd"] = None


def _emit(rec):
    fd = _state["fd"]
    if fd is None or _state["bytes"] > MAX_BYTES:
        return
    data = (json.dumps(rec, separators=(",", ":"), default=str) + "\n").encode("utf-8", "replace")
    _state["bytes"] += len(data)
    try:
        os.write(fd, data)
    except OSError:
        pass


class Raised:
    """What an observed expression did instead of producing a value."""

    def __init__(self, exc):
        self.exc = exc


# Errors the interpreter raises when code breaks (a bad operand, a missing attribute, key or index): raised by an
# operation, not by a `raise` statement, they say the code failed, not that it rejected the input on purpose.
_CRASH_TYPES = ("TypeError", "AttributeError", "IndexError", "KeyError", "NameError", "UnboundLocalError",
                "ZeroDivisionError", "RecursionError")
CRASH = "crash: "


def crashed(exc):
    """Whether `exc` is a crash (see `_CRASH_TYPES`): its innermost Python frame was not running a `raise`."""
    if type(exc).__name__ not in _CRASH_TYPES:
        return False
    tb, last = getattr(exc, "__traceback__", None), None
    while tb is not None:
        last, tb = tb, tb.tb_next
    if last is None:
        return False
    try:
        import dis

        return dis.opname[last.tb_frame.f_code.co_code[last.tb_lasti]] not in ("RAISE_VARARGS", "RERAISE")
    except Exception:  # noqa: BLE001
        return False


def crash_text(text):
    """Whether a recorded outcome (`!Type: message`) is a crash: the mark `canon` and the replay put there."""
    return isinstance(text, str) and text.startswith("!") and text.split(": ", 1)[-1].startswith(CRASH)


def raised_type(text):
    """The exception type of a recorded outcome (`!Type: message`); "" for a returned value."""
    return text[1:].split(":", 1)[0] if isinstance(text, str) and text.startswith("!") else ""


def canon(v, depth=0):
    try:
        if isinstance(v, Raised):
            return "!%s: %s%s" % (type(v.exc).__name__, CRASH if crashed(v.exc) else "",
                                  _ADDR.sub("", str(v.exc))[:80])
        if v is None or v is True or v is False:
            return repr(v)
        for base in (bool, int, float, complex, str, bytes):
            if isinstance(v, base):
                return base.__repr__(v)[:MAX_TEXT]
        if depth > 3:
            return "..."
        if isinstance(v, (list, tuple)):
            inner = ",".join(canon(x, depth + 1) for x in list(v)[:30])
            return ("[%s]" if isinstance(v, list) else "(%s)") % inner + ("+%d" % (len(v) - 30) if len(v) > 30 else "")
        if isinstance(v, (set, frozenset)):
            return "{%s}" % ",".join(sorted(canon(x, depth + 1) for x in v)[:30])
        if isinstance(v, dict):
            items = sorted((canon(k, depth + 1), canon(x, depth + 1)) for k, x in list(dict.items(v))[:30])
            return "{%s}" % ",".join("%s:%s" % kv for kv in items)
        if hasattr(v, "__next__") and hasattr(v, "__iter__"):
            return "<iterator %s>" % type(v).__name__
        return "%s:%s" % (type(v).__name__, _ADDR.sub("", repr(v))[:MAX_TEXT])
    except Exception as exc:  # noqa: BLE001 - a value whose repr fails is still a value
        return "<%s: repr raised %s>" % (type(v).__name__, type(exc).__name__)


def _origin(v):
    """Where the class of `v` is defined (a file under the repository, or '')."""
    try:
        mod = sys.modules.get(type(v).__module__)
        path = getattr(mod, "__file__", "") or ""
        return os.path.relpath(path) if path and not os.path.relpath(path).startswith("..") else ""
    except Exception:  # noqa: BLE001
        return ""


class _Nothing:
    """A fresh object nothing honest compares equal to."""

    __hash__ = object.__hash__

    def __eq__(self, other):
        return self is other


def _other(b):
    """A value of b's type that is not b (or None)."""
    try:
        if isinstance(b, bool):
            return not b
        if isinstance(b, (int, float)):
            return b + 1
        if isinstance(b, (str, bytes)):
            return b + b[:1] + type(b)("x" if isinstance(b, str) else b"x")
        if isinstance(b, (list, tuple)):
            return b + type(b)([_Nothing()])
    except Exception:  # noqa: BLE001
        return None
    return None


def _overridden_eq(a, b):
    """An equality that held only through a builtin subclass's own `__eq__`: the values' builtin content differs
    (a `str` subclass equal to '1K' whose text is '1024B'). An honest subclass (an enum, a tagged string) keeps the
    builtin's equality; one that widens it passes an assertion its value fails."""
    for base in (str, bytes, int, float, tuple, list, dict):
        if isinstance(a, base) and isinstance(b, base):
            odd = a if type(a) is not base else b if type(b) is not base else None
            if odd is None or base is int and isinstance(odd, bool):
                return None
            try:
                if base.__eq__(a, b) is False:
                    return {"loose": type(odd).__qualname__, "where": _origin(odd), "widened": base.__name__}
            except Exception:  # noqa: BLE001
                return None
            return None
    return None


def _site(site, kind, a, b=None, ok=None, extra=None):
    key = (_state["vid"], site)
    n = _state["counts"].get(key, 0)
    _state["counts"][key] = n + 1
    if n >= MAX_PER_SITE:
        return
    rec = {"v": _state["vid"], "s": site, "n": n, "k": kind, "a": canon(a)}
    if b is not None:
        rec["b"] = canon(b)
    if ok is not None:
        rec["ok"] = bool(ok)
    if extra:
        rec.update(extra)
    _emit(rec)


def eq(site, a, b):
    if isinstance(a, Raised) or isinstance(b, Raised):
        return _site(site, "eq", a, b, False)
    try:
        ok = bool(a == b)
    except Exception as exc:  # noqa: BLE001
        return _site(site, "eq", a, Raised(exc), False)
    extra = None
    if ok:
        # An equality that also holds against a fresh object, or against a different value of the expected
        # type, is not a comparison: the value games every assertion (`__eq__` always true).
        try:
            other = _other(b)
            loose = bool(a == _Nothing()) or (other is not None and bool(a == other) and not bool(b == other))
        except Exception:  # noqa: BLE001
            loose = False
        if loose:
            extra = {"loose": type(a).__qualname__, "where": _origin(a)}
        else:
            extra = _overridden_eq(a, b)
    return _site(site, "eq", a, b, ok, extra)


def cmp(site, op, a, b):
    import operator

    if isinstance(a, Raised) or isinstance(b, Raised):
        return _site(site, op, a, b, False)
    fn = {"!=": operator.ne, "<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge,
          "in": lambda x, y: x in y, "not in": lambda x, y: x not in y, "is": operator.is_,
          "is not": operator.is_not}[op]
    try:
        ok = bool(fn(a, b))
    except Exception as exc:  # noqa: BLE001
        return _site(site, op, a, Raised(exc), False)
    return _site(site, op, a, b, ok)


def truth(site, a):
    if isinstance(a, Raised):
        return _site(site, "truth", a, None, False)
    try:
        ok = bool(a)
    except Exception:  # noqa: BLE001
        ok = False
    return _site(site, "truth", a, None, ok)


def check(site, method, *args, **kwargs):
    """`self.assertX(args)`: record the first two arguments and whether the assertion held."""
    a = args[0] if args else None
    b = args[1] if len(args) > 1 else None
    if any(isinstance(x, Raised) for x in args):
        return _site(site, "check", a, b, False)
    try:
        method(*args, **kwargs)
        ok = True
    except BaseException as exc:  # noqa: BLE001 - AssertionError or anything the assertion raised
        if isinstance(exc, KeyboardInterrupt):
            raise
        ok = False
    return _site(site, "check", a, b, ok)


class raises:  # noqa: N801 - used as `with _gp.raises(site, E):`
    """Stands in for `pytest.raises(E)` / `self.assertRaises(E)`: records what the block raised and swallows it.
    `.value`/`.exception`/`.type`/`.match` keep tests that inspect the exception running."""

    def __init__(self, site, expected=BaseException, *args, **kwargs):
        self.site, self.expected = site, expected
        self.value = self.exception = self.type = None

    def match(self, *args, **kwargs):
        return True

    def __enter__(self):
        return self

    def __exit__(self, et, ev, tb):
        if et is not None and issubclass(et, KeyboardInterrupt):
            return False
        try:
            ok = et is not None and issubclass(et, self.expected)
        except TypeError:
            ok = et is not None
        self.value = self.exception = ev
        self.type = et
        _site(self.site, "raises", Raised(ev) if et is not None else "no exception", None, ok)
        return True


def call_raises(site, expected, fn=None, *args, **kwargs):
    """`self.assertRaises(E, fn, *args)` (or the context-manager form when `fn` is None)."""
    if fn is None:
        return raises(site, expected)
    with raises(site, expected):
        fn(*args, **kwargs)
    return None


def _anonymous(fn):
    """`fn` run from a frame that does not look like a test's: its module `__name__`, function name and file name
    are neutral (a hack may walk the callers looking for `test*` modules, `test_*` functions or a tests/ path).
    `__file__` stays, so a test that reads its data files still finds them."""
    try:
        import types

        glb = dict(fn.__globals__)
        glb["__name__"] = "probe_caller"
        names = {"co_name": "probe_body", "co_filename": "<probe>"}
        if hasattr(fn.__code__, "co_qualname"):
            names["co_qualname"] = "probe_body"
        new = types.FunctionType(fn.__code__.replace(**names), glb, "probe_body", fn.__defaults__, fn.__closure__)
        new.__kwdefaults__ = fn.__kwdefaults__
        return new
    except Exception:  # noqa: BLE001 - an odd function runs as it is
        return fn


def variant(vid, scrub=False):
    """Run the test as variant `vid`: its sites record under that id; it never fails; `scrub` hides the
    signs of a test run (PYTEST_CURRENT_TEST, pytest in argv, the test's module, function and file names) while
    the test body runs."""

    def deco(fn):
        @functools.wraps(fn)
        def run(*args, **kwargs):
            _state["vid"] = vid
            _emit({"v": vid, "e": "start"})
            saved_env, saved_argv = os.environ.get("PYTEST_CURRENT_TEST"), list(sys.argv)
            body = _anonymous(fn) if scrub else fn
            if scrub:
                os.environ.pop("PYTEST_CURRENT_TEST", None)
                sys.argv[:] = ["python"]
            # The replay line (replay_runtime.py) records calls during the test as written only.
            profile = _state.get("profile") if vid.endswith(".v0") else None
            try:
                if profile is not None:
                    sys.setprofile(profile)
                body(*args, **kwargs)
                _emit({"v": vid, "e": "end"})
            except BaseException as exc:  # noqa: BLE001
                if isinstance(exc, KeyboardInterrupt):
                    raise
                _emit({"v": vid, "e": "end", "crash": type(exc).__name__})
            finally:
                if profile is not None:
                    sys.setprofile(None)
                    try:
                        _state["after"]()
                    except Exception:  # noqa: BLE001 - the replay never fails a test
                        pass
                if scrub:
                    if saved_env is not None:
                        os.environ["PYTEST_CURRENT_TEST"] = saved_env
                    sys.argv[:] = saved_argv
                _state["vid"] = ""

        return run

    return deco
