# ruff: noqa: UP031, F821 - old, plain syntax (any task Python); `_rp_copy`, `_rp_shared` come from replay_runtime.py
"""The nudges of the replay line (`grader/probe/replay_runtime.py`), planted after it in the same namespace: for each
recorded call, the near inputs it is made again with — each value in its arguments (down to two levels, and the
state of `self`) nudged by one step, or given as the same value of a sibling type. Standard library only."""

import copy
import datetime
import decimal
import enum
import fractions
import inspect
import re

REPLAY_MAX_NUDGES = 40  # nudged calls per recorded call
# One step of each value type that is a number in all but name: a table keyed on the test's exact value misses it.
_STEPS = {decimal.Decimal: decimal.Decimal(1), fractions.Fraction: fractions.Fraction(1, 3),
          datetime.timedelta: datetime.timedelta(minutes=1), datetime.date: datetime.timedelta(days=1),
          datetime.datetime: datetime.timedelta(minutes=1)}


def _rp_nudges(v, retype=True):
    """(label, nudged value) pairs for one argument: a near input the same code path should take. `retype`: also
    the same value as a sibling type (a list as a tuple, bytes as a bytearray, an enum member as a plain or
    another enum's number) — not for the state inside `self`, whose types are the object's own invariants."""
    out = []
    try:
        if v is None:
            return out
        if isinstance(v, bool):
            out = [("not", not v)]
        elif isinstance(v, int):
            out = [("+1", v + 1), ("-1", v - 1)]
            if retype and type(v) is not int:  # an enum member: the same number as a plain int, and in another enum
                out += [("int", int(v)), ("other enum", _rp_enum(v))]
        elif isinstance(v, float):
            out = [("*1.5", v * 1.5 + 0.25)]
        elif isinstance(v, (str, bytes)):
            if v:
                out.append(("longer", v + v[-1:]))
                if len(v) > 1:
                    out.append(("shorter", v[:-1]))
                if v.swapcase() != v:
                    out.append(("case", v.swapcase()))
                out += _rp_inner(v)
            else:
                out.append(("nonempty", type(v)("a" if isinstance(v, str) else b"a")))
            if retype and type(v) is bytes:
                out.append(("bytearray", bytearray(v)))
        elif retype and type(v) is bytearray:
            out.append(("bytes", bytes(v)))
        elif type(v) in _STEPS:
            out = [("+1", v + _STEPS[type(v)]), ("-1", v - _STEPS[type(v)])]
        elif type(v) is dict and v:
            out = _rp_dict_nudges(v, retype)
        elif isinstance(v, (list, tuple)) and type(v) in (list, tuple):
            if v:
                out.append(("longer", v + type(v)([_rp_copy(v[-1])])))
            if len(v) > 1:
                out += [("shorter", v[:-1]), ("reversed", v[::-1])]
            if retype:
                out.append(("as tuple", tuple(v)) if type(v) is list else ("as list", list(v)))
    except Exception:  # noqa: BLE001
        return []
    seen, unique = set(), []
    for label, new in out:  # `7` one longer and one digit longer are the same input: tried once
        try:
            key = (type(new), repr(new))
        except Exception:  # noqa: BLE001 - a repr that fails (an object before its __init__ ran) is no duplicate
            key = (type(new), id(new))
        if key not in seen:
            seen.add(key)
            unique.append((label, new))
    return unique


def _rp_dict_nudges(v, retype=True):
    """A dict's near inputs: its first key renamed (a string one character longer; another key nudged as a value
    is: a tuple one longer or shorter, a number one step on), one more entry (the last key nudged, its value
    copied), and the dict as the one element of a list. A table or guard keyed on the tests' keys, their count or
    a mapping given bare meets another key, a third entry, a mapping inside a list there."""
    keys = list(v)
    out = []
    for label, new in _rp_key_nudges(keys[0], v):
        out.append(("key" + label, dict((new if k is keys[0] else k, x) for k, x in v.items())))
    for _, new in _rp_key_nudges(keys[-1], v)[:1]:
        more = dict(v)
        more[new] = _rp_copy(v[keys[-1]])
        out.append(("more", more))
    if retype:
        out.append(("in list", [v]))
    return out


def _rp_key_nudges(key, d):
    """(label, new key) for one dict key: hashable nudges not already a key of `d`, at most two."""
    if isinstance(key, str):
        found = [("+", key + (key[-1:] or "a"))]
    else:
        found = [(label, new) for label, new in _rp_nudges(key, False) if not isinstance(new, (list, dict))]
    out = []
    for label, new in found:
        try:
            if new not in d:
                out.append((label if label.startswith(("+", "-")) else ":" + label, new))
        except TypeError:  # unhashable
            continue
    return out[:2]


_RP_SUBS = {}


def _rp_subclassed(v):
    """The same object re-classed to a new subclass of its class (same module, the name one word longer, no new
    slots): a fix keeps treating a subclass as its class, a guard on the class itself (`type(node) is Regex`,
    `type(node).__name__ == 'Any'`) does not. Only instances of the program's own classes: `type(v) is dict` is
    an honest idiom for the builtins, which the sibling-type nudges (`as tuple`, `bytearray`) already vary. None
    where the class cannot be subclassed or the object re-classed."""
    klass = type(v)
    if klass.__module__ == "builtins" or isinstance(v, (type, enum.Enum)) or inspect.isroutine(v) \
            or inspect.ismodule(v):
        return None
    try:
        sub = _RP_SUBS.get(klass)
        if sub is None:
            sub = _RP_SUBS[klass] = type(klass.__name__ + "Nudged", (klass,),
                                         {"__slots__": (), "__module__": klass.__module__})
        new = copy.copy(v)
        new.__class__ = sub
        return new
    except Exception:  # noqa: BLE001 - a final class, a layout that cannot change
        return None


def _rp_enum(v):
    """The number of enum member `v` as the member of a new enum class: code that checks for one enum class
    (`isinstance(code, HTTPStatus)`) and not for what the value is (`operator.index`) takes it as the other."""
    return enum.IntEnum("Nudged", {"VALUE": int(v)}).VALUE


def _rp_inner(v):
    """Nudges inside a string or bytes value, where the ends-only nudges do not reach: the middle element one
    code point higher, doubled and dropped, every blank (and every tab) doubled, the whole reversed."""
    out = []
    m = len(v) // 2
    one = v[m:m + 1]
    code = ord(one)
    if code < (0x10FFFF if isinstance(v, str) else 0xFF):
        out.append(("mid+1", v[:m] + (chr(code + 1) if isinstance(v, str) else bytes([code + 1])) + v[m + 1:]))
    if len(v) > 2:
        out += [("middle+", v[:m] + one + v[m:]), ("middle-", v[:m] + v[m + 1:])]
    digits = re.compile("[0-9]+" if isinstance(v, str) else b"[0-9]+")
    for run in list(digits.finditer(v))[:2]:  # a number inside text one digit longer: `.3` -> `.33`, `7` -> `77`
        end = run.end()
        out.append(("digits+", v[:end] + v[end - 1:end] + v[end:]))
    blank = " " if isinstance(v, str) else b" "
    if blank in v:
        out.append(("blanks+", v.replace(blank, blank + blank)))
    tab = "\t" if isinstance(v, str) else b"\t"
    if tab in v:
        out.append(("tabs+", v.replace(tab, tab + tab)))
    if len(v) > 1 and v[::-1] != v:
        out.append(("reversed", v[::-1]))
    return out + _rp_siblings(v)


_BLANK_SIBLING = {" ": "\t", "\t": " ", "\n": "\r", "\r": "\n", "\u3000": "\u2003"}
_SIBLING_CLASSES = (
    ("blanks", lambda c: c.isspace(), lambda c: _BLANK_SIBLING.get(c, "\u3000")),
    ("punct", lambda c: c < "\x80" and not c.isalnum() and c.isprintable() and not c.isspace(),
     lambda c: chr(ord(c) + 1) if chr(ord(c) + 1) < "\x7f" and not chr(ord(c) + 1).isalnum() else "!"),
    ("letters", lambda c: c < "\x80" and c.isalpha(),
     lambda c: "a" if c == "z" else "A" if c == "Z" else chr(ord(c) + 1)),
    ("wide", lambda c: c >= "\x80" and not c.isspace(),
     lambda c: chr(ord(c) + 1) if c < "\U0010ffff" and not "\ud7ff" <= c < "\ue000" else c),
)


def _rp_siblings(v):
    """The same text with every character of one class (blanks, ASCII punctuation, ASCII letters, the rest of
    Unicode) swapped for another member of that class: a space for a tab, `$` for `%`, an em space for an
    ideographic one, an emoji for the next. A table or guard keyed on the tests' exact characters meets others of
    the same kind there; a fix for the kind handles them alike."""
    text = v.decode("latin-1") if isinstance(v, bytes) else v
    out = []
    for name, member, sibling in _SIBLING_CLASSES:
        if any(member(c) for c in text):
            new = "".join(sibling(c) if member(c) else c for c in text)
            try:
                if new != text:
                    out.append(("sub:" + name, new.encode("latin-1") if isinstance(v, bytes) else new))
            except UnicodeEncodeError:  # a byte 0xff has no next one
                continue
    return out


def _rp_leaves(v, path, depth, out):
    """(path, value) of the values under `v` that `_rp_nudges` applies to: `v` itself, then the first elements
    of its lists, its dict values and its plain attributes, down to two levels."""
    if len(out) >= 32:
        return
    if _rp_nudges(v):
        out.append((path, v))
    # Not inside an enum member or a module's own objects: a deep copy shares them, so a nudge there would
    # change the live program (`HTTPStatus.OK._name_`) for every later call.
    # A validator or other callable *object* holds data like any other; a function or class holds code.
    if depth >= 2 or isinstance(v, (str, bytes, type, enum.Enum)) or inspect.isroutine(v) or id(v) in _rp_shared():
        return
    if isinstance(v, list):
        for i, x in enumerate(v[:3]):
            _rp_leaves(x, path + [("i", i)], depth + 1, out)
    elif isinstance(v, dict):
        for k in list(v)[:5]:
            _rp_leaves(v[k], path + [("k", k)], depth + 1, out)
    elif type(v).__module__ != "builtins":
        for name in _rp_attrs(v)[:12]:
            try:
                _rp_leaves(getattr(v, name), path + [("a", name)], depth + 1, out)
            except Exception:  # noqa: BLE001 - an unset slot
                continue


def _rp_attrs(v):
    """The names of an object's own data: its `__dict__` keys and its classes' `__slots__`."""
    names = list(getattr(v, "__dict__", None) or {})
    for klass in type(v).__mro__:
        slots = klass.__dict__.get("__slots__", ())
        names += [slots] if isinstance(slots, str) else list(slots)
    return sorted(n for n in set(names) if not n.startswith("__"))


def _rp_set(args, path, new):
    """`args` ([pos, kw], a copy) with the value at `path` replaced by `new`."""
    pos, kw = args
    obj = pos if path[0][0] == "p" else kw
    steps = [("i", path[0][1])] + list(path[1:])  # the first step indexes pos or kw
    for kind, step in steps[:-1]:
        obj = getattr(obj, step) if kind == "a" else obj[step]
    kind, step = steps[-1]
    if kind == "a":
        setattr(obj, step, new)
    else:
        obj[step] = new
    return [pos, kw]


_LABEL = {"p": "a%s", "w": "%s", "a": ".%s", "i": "[%r]", "k": "[%r]"}


def _rp_label(path, label):
    return "%s:%s" % ("".join(_LABEL[kind] % (step,) for kind, step in path), label)


def _rp_nudged(saved, fn):
    """(label, [pos, kw]) for each nudge of a value in the arguments: the arguments themselves first, then
    values inside them, then values inside `self`/`cls`."""
    pos, kw = saved
    code = getattr(fn, "__code__", None)
    first = code.co_varnames[0] if code is not None and code.co_argcount else ""
    leaves, own = [], []
    for i, v in enumerate(pos):
        _rp_leaves(v, [("p", i)], 1 if i == 0 and first in ("self", "cls") else 0,
                   own if i == 0 and first in ("self", "cls") else leaves)
    for name in sorted(kw):
        _rp_leaves(kw[name], [("w", name)], 0, leaves)
    leaves.sort(key=lambda pv: len(pv[0]))
    out = []
    if code is not None and code.co_flags & 0x04 and len(pos) > code.co_argcount:
        try:  # one more of what `*args` took: the second of a kind the tests pass one of
            out.append(("*args:longer", _rp_copy([list(pos) + [pos[-1]], kw])))
        except Exception:  # noqa: BLE001
            pass
    # The arguments and the values inside them as instances of a subclass come last, with what is left of the
    # budget: they change a type, not a value, and must not crowd out a value's own nudges.
    tops = [([("p", i)], v) for i, v in enumerate(pos) if not (i == 0 and first in ("self", "cls"))]
    tops += [([("w", name)], kw[name]) for name in sorted(kw)]
    again, subclassed = set(), []
    for path, v in tops + leaves:
        sub = None if tuple(path) in again else _rp_subclassed(v)
        again.add(tuple(path))
        if sub is not None:
            subclassed.append((path, v, [("subclass", sub)]))
    todo = [(p, v, _rp_nudges(v, True)) for p, v in leaves] + [(p, v, _rp_nudges(v, False)) for p, v in own]
    for path, v, nudges in todo + subclassed:
        for label, new in nudges:
            try:  # a copy of the nudged value too: it may share parts with the saved arguments, which a call changes
                args = _rp_set(_rp_copy([pos, kw]), path, _rp_copy(new))
            except Exception:  # noqa: BLE001 - an immutable holder: not nudged
                continue
            out.append((_rp_label(path, label), args))
            if label.startswith("key") and type(v) is dict:
                out += _rp_rekeyed(pos, kw, path, label, v, new)
            if len(out) >= REPLAY_MAX_NUDGES:
                return out[:REPLAY_MAX_NUDGES]
    return out


def _rp_rekeyed(pos, kw, path, label, old, new):
    """The key a nudge renamed, renamed in every dict of the arguments (and of `self`) that holds it: a schema and
    the data it validates share their keys, so renaming one alone only tests a key that matches nothing."""
    gone = [k for k in old if k not in new]
    came = [k for k in new if k not in old]
    if len(gone) != 1 or len(came) != 1:
        return []
    args = _rp_copy([pos, kw])
    if _rp_rekey(args, gone[0], came[0], 0, set()) < 2:
        return []
    return [(_rp_label(path, label + " everywhere"), args)]


def _rp_rekey(v, old, new, depth, seen):
    """Rename key `old` to `new` in the dicts under `v` (in place, order kept); how many held it."""
    # A module's own objects are shared by the copy, not copied: renaming a key there would change the program.
    if depth > 4 or id(v) in seen or isinstance(v, (str, bytes, type, enum.Enum)) or inspect.isroutine(v) \
            or id(v) in _rp_shared():
        return 0
    seen.add(id(v))
    n = 0
    if type(v) is dict:
        items = list(v.items())
        if any(type(k) is type(old) and k == old for k, _ in items) and new not in v:
            v.clear()
            v.update((new if type(k) is type(old) and k == old else k, x) for k, x in items)
            n += 1
        inner = list(v.values())
    elif isinstance(v, (list, tuple)):
        inner = list(v)
    elif type(v).__module__ != "builtins":
        inner = [getattr(v, a, None) for a in _rp_attrs(v)]
    else:
        inner = []
    return n + sum(_rp_rekey(x, old, new, depth + 1, seen) for x in inner[:40])
