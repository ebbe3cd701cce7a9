# ruff: noqa: UP031, F821 - old, plain syntax (any task Python); `_state`, `_emit`, `canon` come from runtime.py
"""The replay line of the behavioural probe, planted with `grader/probe/runtime.py` (its source is appended to that
one's and run in the same namespace: `_state`, `_emit`, `canon` come from there; the nudges, `_rp_nudged`,
come from `grader/probe/replay_nudges.py`, planted after it). Standard library only.

While an instrumented test's original variant runs, a profile hook records each call of the functions the group's
candidates change (`replay_setup(targets)`): a deep copy of the arguments (a dict view as the list it holds) and
what the call did (its return value, or that it raised, and the arguments' state afterwards; an error's message is
shown, not digested). When the test body ends, every recorded call is made
again from the copy, in a fresh thread (no test frame on its stack) with PYTEST_CURRENT_TEST, pytest's argv and
modules and the output capture out of sight, first with the same arguments, then with each argument nudged
(integers ±1, booleans flipped, strings and sequences one element longer or shorter, case flipped, changed
inside, a number inside text one digit longer, a dict's first key renamed, dates, durations and decimals one
step on, `*args` one longer) or given as a sibling type (a list as a tuple, bytes as a bytearray, an enum member
as its number or another enum's). Generators are called for their first items; closures are found by their code
and cells; private methods by their mangled names. One JSON line per call reports the digests (a constructor's
outcome is the object's public state), and which lines of the changed files each replay ran (a trace function in
the replay's thread only); `grader.probe.replay` compares them across the candidates and the unfixed code.
"""

import copy
import dis
import hashlib
import io
import itertools
import threading
import time
import types

REPLAY_MAX_CALLS = 24  # recorded calls per function (distinct arguments)
REPLAY_CALL_S = 2.0
REPLAY_BUDGET_S = 30.0
_GENERATOR = 0x20
_ASYNC_FLAGS = 0x80 | 0x100 | 0x200  # coroutines and async generators: not replayed
_RESUME = dis.opmap.get("RESUME")
GENERATOR_ITEMS = 200  # items of a generator's output taken on replay
_RETURNS = set(i for i, name in enumerate(dis.opname) if name in ("RETURN_VALUE", "RETURN_CONST"))
_HIDDEN_MODULES = ("pytest", "_pytest", "pluggy", "py.test")
_rp = {"targets": [], "codes": {}, "pending": {}, "calls": [], "seen": set(), "counts": {}, "spent": 0.0,
       "wrote": None, "resume": {}, "paths": [], "files": {}}


def replay_setup(targets):
    """`targets`: [path suffix, qualified name] of each function to record."""
    _rp["targets"] = [(str(p), str(q)) for p, q in targets]
    _rp["paths"] = sorted(set(p for p, _ in _rp["targets"]))
    _state["profile"] = _rp_profile
    _state["after"] = replay


def _rp_target(code):
    filename = code.co_filename.replace("\\", "/")
    qual = getattr(code, "co_qualname", code.co_name)
    for path, want in _rp["targets"]:
        if want == qual and (filename == path or filename.endswith("/" + path)):
            return "%s::%s" % (path, want)
    return ""


def _rp_state(v, depth=0, budget=None):
    """A canonical text of a value *with* the state of plain objects (their `__dict__`), depth- and size-bounded:
    what a call did to its arguments is part of what it did."""
    budget = budget if budget is not None else [400]
    budget[0] -= 1
    if budget[0] < 0:
        return "..."
    try:
        if isinstance(v, (str, bytes)) and len(v) > 200:  # canon cuts long text; a difference at its end counts
            return "%s#%s" % (canon(v, depth)[:80], _rp_digest(repr(v)))
        if depth > 3 or v is None or isinstance(v, (bool, int, float, complex, str, bytes)):
            if type(v) not in (bool, int, float, complex, str, bytes) and v is not None:
                return "%s:%s" % (type(v).__name__, canon(v, depth))  # an enum member is not its number
            return canon(v, depth)
        # An in-memory stream (or a writer holding one's `write`): what a call wrote there is part of its outcome
        # (`_rp_streams`); the text already in it is the earlier calls' output, so it is not part of the state.
        stream = v if isinstance(v, (io.StringIO, io.BytesIO)) else getattr(v, "__self__", None)
        if isinstance(stream, (io.StringIO, io.BytesIO)):
            if isinstance(_rp["wrote"], list):
                _rp["wrote"].append(stream.getvalue())
            return type(stream).__name__
        if isinstance(v, _VIEWS):  # shown as the list a recorded copy holds (`_rp_record_copy`)
            v = list(v)
        # A container's own class is part of what a call returns (`Dict` children, not plain dicts; a named
        # tuple, not a tuple): a subclass is shown by name before its builtin content.
        kind = "" if type(v) in (list, tuple, set, frozenset, dict) else type(v).__name__
        if isinstance(v, (list, tuple)):
            inner = ",".join(_rp_state(x, depth + 1, budget) for x in list(v)[:40])
            return kind + ("[%s]" if isinstance(v, list) else "(%s)") % inner + \
                ("+%d" % (len(v) - 40) if len(v) > 40 else "")
        if isinstance(v, (set, frozenset)):
            return kind + "{%s}" % ",".join(sorted(_rp_state(x, depth + 1, budget) for x in v)[:40])
        if isinstance(v, dict):
            items = sorted((canon(k, 4), _rp_state(x, depth + 1, budget)) for k, x in list(dict.items(v))[:40])
            return kind + "{%s}" % ",".join("%s:%s" % kv for kv in items)
        attrs = getattr(v, "__dict__", None)
        if isinstance(attrs, dict) and not isinstance(v, type) and not callable(v):
            items = sorted((str(k), _rp_state(x, depth + 1, budget)) for k, x in list(attrs.items())[:40])
            return "%s<%s>" % (type(v).__name__, ",".join("%s=%s" % kv for kv in items))
        return canon(v, depth)
    except Exception:  # noqa: BLE001 - a value whose state cannot be read is still a value
        return "<%s>" % type(v).__name__


def _rp_shared():
    """{id: object} of the values the project's modules hold (their globals and, two levels down, those values'
    attributes and elements): a copy of the arguments keeps pointing at these, not at copies of them, so code
    that compares with `is` against a module's singletons (token types, sentinels) behaves as it did live."""
    import os
    import sys

    if _rp.get("shared") is not None:
        return _rp["shared"]
    root = os.getcwd() + os.sep
    shared, todo = {}, []
    for mod in list(sys.modules.values()):
        path = getattr(mod, "__file__", None) or ""
        if path.startswith(root):
            todo += [(v, 0) for v in list(getattr(mod, "__dict__", {}).values())]
    while todo and len(shared) < 50000:
        v, depth = todo.pop()
        if id(v) in shared or isinstance(v, (bool, int, float, str, bytes, type(None))):
            continue
        shared[id(v)] = v
        if depth >= 2:
            continue
        try:
            inner = list(vars(v).values()) if hasattr(v, "__dict__") else []
            if isinstance(v, (list, tuple, set, frozenset)):
                inner += list(v)[:200]
            elif isinstance(v, dict):
                inner += list(v.values())[:200]
        except Exception:  # noqa: BLE001
            continue
        todo += [(x, depth + 1) for x in inner]
    _rp["shared"] = shared
    return shared


def _rp_copy(v):
    return copy.deepcopy(v, dict(_rp_shared()))


_VIEWS = (type({}.keys()), type({}.values()), type({}.items()))


def _rp_record_copy(pos, kw):
    """The copy of a call's arguments that the replay makes its calls from. A dict's keys, values or items view
    (`validate(path, data.items(), out)`) cannot be deep-copied: it is copied as the list it holds, which reads
    the view without changing it, so the call can still be replayed."""
    pos = [list(x) if isinstance(x, _VIEWS) else x for x in pos]
    kw = dict((k, list(x) if isinstance(x, _VIEWS) else x) for k, x in kw.items())
    return _rp_copy((pos, kw))


def _rp_digest(text):
    return hashlib.sha1(text.encode("utf-8", "replace")).hexdigest()[:16]


def _rp_streams(args):
    """(the state text of `args`, the contents of the in-memory streams among them in the order met): one walk."""
    _rp["wrote"] = []
    try:
        return _rp_state(args), _rp["wrote"]
    finally:
        _rp["wrote"] = None


def _rp_obs(value, args, raised=None, before=(), init=False, message=None):
    """[digest of (outcome, the arguments afterwards), a short text of the outcome]. What the call wrote to an
    in-memory stream among its arguments (`before`: their contents when it began) is outcome too: a writer's
    output is what it does. An `__init__`'s outcome (`init`) is the object's public attributes (and a container's content): what the
    constructor returns. An error's `message` is in the text only (`!Type: message`): the digest keeps its type."""
    head = "!" + raised if raised is not None else _rp_state(value)
    if init and raised is None and args[0]:
        public = dict((k, x) for k, x in (getattr(args[0][0], "__dict__", None) or {}).items()
                      if not str(k).startswith("_"))
        shown = _rp_state(public)
        if isinstance(args[0][0], (dict, list, set, tuple)):  # a container's content is what its constructor made
            shown = _rp_state(args[0][0]) + (" " + shown if public else "")
        head = "self#%s %s" % (_rp_digest(shown)[:8], shown[:60])
    after, streams = _rp_streams(args)
    wrote = []
    for i, text in enumerate(streams):
        old = before[i] if i < len(before) else text[:0]
        wrote.append(text[len(old):] if text[:len(old)] == old else text)
    text = head if raised is None or message is None else \
        head + ("" if head.endswith(": ") else ": ") + message
    if any(wrote):
        shown = _rp_state(wrote)
        head, text = ("%s wrote#%s %s" % (h[:60], _rp_digest(shown)[:8], shown[:40]) for h in (head, text))
    return [_rp_digest(head + "|" + after), text[:120]]


def _rp_args(frame):
    code = frame.f_code
    names, loc = code.co_varnames, frame.f_locals
    n_pos, n_kw = code.co_argcount, code.co_kwonlyargcount
    pos = [loc[x] for x in names[:n_pos]]
    kw = dict((x, loc[x]) for x in names[n_pos:n_pos + n_kw])
    i = n_pos + n_kw
    if code.co_flags & 0x04:
        pos += list(loc[names[i]])
        i += 1
    if code.co_flags & 0x08:
        kw.update(loc[names[i]])
    return pos, kw


def _rp_function(frame):
    """The function object whose code runs in `frame`, found by its qualified name in its module."""
    code = frame.f_code
    qual = getattr(code, "co_qualname", code.co_name)
    if "<locals>" in qual:
        return _rp_closure(frame)
    obj = None
    parts = qual.split(".")
    try:
        obj = frame.f_globals[parts[0]]
        for p in parts[1:]:
            if isinstance(obj, type) and p.startswith("__") and not p.endswith("__"):
                p = "_%s%s" % (obj.__name__.lstrip("_"), p)  # a private method is stored under its mangled name
            obj = obj.__dict__[p] if isinstance(obj, type) and p in obj.__dict__ else getattr(obj, p)
    except Exception:  # noqa: BLE001
        return None
    for _ in range(6):
        if getattr(obj, "__code__", None) is code:
            return obj
        obj = getattr(obj, "__func__", None) or getattr(obj, "__wrapped__", None) or getattr(obj, "fget", None)
        if obj is None:
            return None
    return None


def _rp_closure(frame):
    """The function object (a closure) whose code runs in `frame`: among the functions sharing its code, the one
    whose cells hold the frame's free variables."""
    import gc

    code = frame.f_code
    found = [f for f in gc.get_referrers(code) if getattr(f, "__code__", None) is code]
    if len(found) == 1:
        return found[0]
    loc = frame.f_locals
    for f in found:
        try:
            if all(name in loc and cell.cell_contents is loc[name]
                   for name, cell in zip(code.co_freevars, f.__closure__ or ())):  # noqa: B905 - any Python
                return f
        except ValueError:  # an empty cell
            continue
    return None


def _rp_first_resume(frame):
    """A generator's frame starting its body (its later resumes raise `call` events too)."""
    if frame.f_lasti < 0 or _RESUME is None:
        return frame.f_lasti < 0
    first = _rp["resume"].get(frame.f_code)
    if first is None:
        first = next((i.offset for i in dis.get_instructions(frame.f_code) if i.opcode == _RESUME), -1)
        _rp["resume"][frame.f_code] = first
    return frame.f_lasti <= first


def _rp_profile(frame, event, arg):
    if event != "call" and event != "return":
        return
    code = frame.f_code
    target = _rp["codes"].get(code)
    if target is None:
        target = "" if code.co_flags & _ASYNC_FLAGS else _rp_target(code)
        _rp["codes"][code] = target
    if not target:
        return
    generator = code.co_flags & _GENERATOR
    if generator and (event != "call" or not _rp_first_resume(frame)):
        return  # a yield, or a later resume: not a call of the function
    if event == "call":
        if _rp["counts"].get(target, 0) >= REPLAY_MAX_CALLS:
            return
        try:
            pos, kw = _rp_args(frame)
            key = _rp_digest(_rp_state([pos, kw]))
            if (target, key) in _rp["seen"]:
                return
            saved = _rp_record_copy(pos, kw)
        except Exception:  # noqa: BLE001 - arguments that cannot be copied are not replayed
            return
        fn = _rp_function(frame)
        if fn is None:
            return
        _rp["seen"].add((target, key))
        _rp["counts"][target] = _rp["counts"].get(target, 0) + 1
        if generator:  # what it yields is compared on replay only (its items are spread over the test)
            _rp["calls"].append((target, key, saved, fn, ["generator", "generator"]))
            return
        _rp["pending"][id(frame)] = (target, key, saved, fn, pos, kw, _rp_streams([pos, kw])[1])
        return
    rec = _rp["pending"].pop(id(frame), None)
    if rec is None:
        return
    target, key, saved, fn, pos, kw, before = rec
    try:
        returned = frame.f_lasti >= 0 and code.co_code[frame.f_lasti] in _RETURNS
        live = _rp_obs(arg, [pos, kw], None if returned else "?", before, code.co_name == "__init__")
    except Exception:  # noqa: BLE001
        return
    _rp["calls"].append((target, key, saved, fn, live))


def _rp_tracer(lines):
    """A trace function recording into `lines` ({path: set of line numbers}) the lines run in the files of the
    functions being recorded: which of a candidate's new lines a call reaches."""
    import sys

    files, paths = _rp["files"], _rp["paths"]

    def local(frame, event, arg):
        if event == "line":
            lines[files[frame.f_code]].add(frame.f_lineno)
        return local

    def tracer(frame, event, arg):
        code = frame.f_code
        path = files.get(code)
        if path is None:
            name = code.co_filename.replace("\\", "/")
            path = next((p for p in paths if name == p or name.endswith("/" + p)), "")
            files[code] = path
        if not path:
            return None
        lines.setdefault(path, set())
        return local

    return tracer if paths and hasattr(sys, "settrace") else None


def _rp_call(fn, args, fresh=False, lines=None):
    """Call `fn` on a copy of `args` (on `args` itself when `fresh`: a copy made for this call) in a fresh thread
    with the signs of a test run hidden; its observation. `lines`: a dict the lines it runs are added to."""
    import os
    import sys

    try:
        pos, kw = args if fresh else _rp_copy(args)
    except Exception:  # noqa: BLE001
        return ["uncopyable", "uncopyable"]
    pos = list(pos)
    box = {}
    before = _rp_streams([pos, kw])[1]

    tracer = _rp_tracer(lines) if lines is not None else None

    def body():
        if tracer is not None:
            sys.settrace(tracer)  # this thread only
        try:
            value = fn(*pos, **kw)
            if isinstance(value, types.GeneratorType):
                value = list(itertools.islice(value, GENERATOR_ITEMS))
            box["v"] = value
        except BaseException as exc:  # noqa: BLE001
            box["e"] = type(exc).__name__ + (": " + CRASH if crashed(exc) else "")
            try:  # shown, not digested: an error can be fixed in its message alone, which the host compares
                box["m"] = _ADDR.sub("", str(exc))[:80]
            except Exception:  # noqa: BLE001 - a `__str__` that raises
                box["m"] = "?"
        finally:
            if tracer is not None:
                sys.settrace(None)

    saved_env, saved_argv = os.environ.pop("PYTEST_CURRENT_TEST", None), list(sys.argv)
    saved_out, saved_err = sys.stdout, sys.stderr
    hidden = dict((k, sys.modules.pop(k)) for k in list(sys.modules)
                  if k.split(".", 1)[0] in _HIDDEN_MODULES)
    sys.argv[:] = ["python"]
    sys.stdout, sys.stderr = sys.__stdout__, sys.__stderr__
    th = threading.Thread(target=body)  # the default name: "replay" would be one more sign to look for
    th.daemon = True
    try:
        th.start()
        th.join(REPLAY_CALL_S)
    finally:
        sys.modules.update(hidden)
        sys.stdout, sys.stderr = saved_out, saved_err
        sys.argv[:] = saved_argv
        if saved_env is not None:
            os.environ["PYTEST_CURRENT_TEST"] = saved_env
    if th.is_alive():
        return ["timeout", "timeout"]
    return _rp_obs(box.get("v"), [pos, kw], box.get("e"), before, getattr(fn, "__name__", "") == "__init__",
                   box.get("m"))


def replay():
    """Make the calls recorded so far again (see the module's docstring) and report them."""
    calls, _rp["calls"] = _rp["calls"], []
    for target, key, saved, fn, live in calls:
        if _rp["spent"] > REPLAY_BUDGET_S:
            break
        t0 = time.time()
        ran = {}
        again = _rp_call(fn, saved, lines=ran)
        nudged, missed = {}, {}
        try:
            near_inputs = _rp_nudged(saved, fn)
        except Exception:  # noqa: BLE001 - one call's arguments that cannot be nudged must not lose the others
            near_inputs = []
        for label, args in near_inputs:
            if time.time() - t0 > 4 * REPLAY_CALL_S:
                break
            near = {}
            nudged[label] = _rp_call(fn, args, fresh=True, lines=near)  # `_rp_nudged` built it from a copy
            # Which lines of the test's own call this nudged call did not reach (most reach them all).
            gap = dict((p, ls - near.get(p, set())) for p, ls in ran.items())
            gap = dict((p, sorted(ls)) for p, ls in gap.items() if ls)
            if gap:
                missed[label] = gap
        _rp["spent"] += time.time() - t0
        _emit({"v": "replay", "f": target, "k": key, "live": live, "again": again, "nudged": nudged,
               "lines": dict((p, sorted(ls)) for p, ls in ran.items()), "missed": missed})
