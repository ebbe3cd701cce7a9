"""pytest plugin the sandbox loads into every pytest run (`-p gagar_pytest_guard`, from a read-only mount).

It is the second result channel next to the JUnit report: each test phase's outcome is written, as it
happens, as one JSON line to a FIFO whose reader is the host (`$GAGAR_RESULT_PIPE`). A pipe is append-only
and the host reads it live, so code that rewrites the JUnit report after the tests ran (an `atexit` hook,
a shutdown step) cannot take back what was already sent; the host compares the two (`sandbox/integrity/checks.py`).

It also reports (as `tamper` records) whether the run's own machinery changed under it:
- every function and class attribute of pytest's and pluggy's modules (runner, reports, JUnit writer,
  collectors, nodes, fixtures, skipping, ... and this module) is fingerprinted when the plugin loads (before
  any conftest or test module is imported) and compared when collection ends, after every test and at the end;
- every plugin registration is watched (`pytest_plugin_registered`), and the table of hook implementations is
  compared with what those registrations put there (a registration through pluggy's own `register`, which
  skips the notification, shows up there). A registration is legitimate when the code that asked for it is
  pytest's, pluggy's or a legitimately registered plugin's, all the way up to the hook call it came from:
  identified by the code objects themselves, never by a `__file__` or a name. Library code calling
  `pluginmanager.register` (directly, or through pytest's own loaders) is not;
- a test item or collector whose instance overrides a method of its class (`item.runtest = ...`), an item
  whose class or test function (`obj`) changed since collection.
Each `conftest.py` pytest imports is reported with the path pytest itself imported it from (a `conftest`
record); the host checks it is one of the tree's conftest files from before the run. Each XFAIL says where
the xfail came from (`xh`: a marker, or a `pytest.xfail()` call and the source files of the frames that led
to it, `xf`; `xl`: which nodes carried an xfail mark when collection ended — the test, its class, its module),
so the host can refuse an xfail that the patched code raised.

Runs inside the container under the test's Python; standard library and pytest only. Every write is a
single `os.write` of at most PIPE_BUF bytes, so records of concurrent writers never interleave.
"""

# ruff: noqa: B905 - this runs under the tests' Python, 3.9 included: zip() takes no `strict` there.
from __future__ import annotations

import json
import os
import shlex
import sys
import types
from operator import getitem as _getitem
from operator import is_ as _is

import _pytest.config
import _pytest.junitxml
import _pytest.main
import _pytest.outcomes
import _pytest.python
import _pytest.reports
import _pytest.runner
import _pytest.skipping
import pluggy  # noqa: F401 - loaded before the fingerprint is taken, as pytest itself is
import pytest

_MAX_RECORD = 4000  # < PIPE_BUF (4096): one atomic write
_MISSING = object()


def _open_pipe() -> int | None:
    path = os.environ.get("GAGAR_RESULT_PIPE")
    if not path:
        return None
    try:
        # Non-blocking open: the host holds the read end; without a reader this fails instead of hanging.
        fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        os.set_blocking(fd, True)
        return fd
    except OSError:
        return None


_FD = _open_pipe()
_write, _dumps, _getframe = os.write, json.dumps, sys._getframe


def _send(record: dict) -> None:
    if _FD is None:
        return
    data = (_dumps(record, separators=(",", ":")) + "\n").encode("utf-8", "replace")
    if len(data) > _MAX_RECORD:
        record = {**record, "id": str(record.get("id", ""))[:1000], "detail": "truncated"}
        data = (_dumps(record, separators=(",", ":")) + "\n").encode("utf-8", "replace")[:_MAX_RECORD - 1] + b"\n"
    try:
        _write(_FD, data)
    except OSError:
        pass


# ---------------------------------------------------------------- what pytest is made of, taken at load


def _own_modules() -> list[types.ModuleType]:
    names = sorted(n for n in sys.modules if n in ("pytest", "pluggy", "_pytest")
                   or n.startswith(("_pytest.", "pluggy.")))
    mods = [m for n in names if isinstance(m := sys.modules[n], types.ModuleType)]
    return [*mods, sys.modules[__name__]]


def _is_attr(obj: object) -> bool:
    return callable(obj) or isinstance(obj, (property, classmethod, staticmethod))


def _functions(ns: dict, globals_of: dict | None = None) -> list:
    """The functions held by a namespace (and by the classes in it), unwrapped from descriptors."""
    out = []
    for obj in list(ns.values()):
        if isinstance(obj, type):
            if globals_of is None or obj.__module__ == globals_of.get("__name__"):
                out += _functions(dict(vars(obj)), globals_of)
            continue
        for f in (getattr(obj, "__func__", None), getattr(obj, "fget", None), getattr(obj, "fset", None), obj):
            if isinstance(f, types.FunctionType) and (globals_of is None or f.__globals__ is globals_of):
                out.append(f)
    return out


def _codes(functions: list) -> dict[int, types.CodeType]:
    out: dict[int, types.CodeType] = {}
    stack = [f.__code__ for f in functions]
    while stack:
        c = stack.pop()
        if id(c) not in out:
            out[id(c)] = c
            stack += [k for k in c.co_consts if isinstance(k, types.CodeType)]
    return out


def _watch_list(mods: list[types.ModuleType]) -> tuple[list, list]:
    """(namespace, name, object, label) for every function and class attribute of pytest's modules, and
    (class namespace, size, methods, label) to notice methods added to a class (pytest itself adds plain
    attributes: a flag per Item subclass)."""
    watch, sizes, seen = [], [], set()
    for mod in mods:
        ns = vars(mod)
        # pytest's own namespace: every public name (`pytest.mark` is an object, not a function)
        watch += [(ns, k, v, f"{mod.__name__}.{k}") for k, v in list(ns.items()) if not k.startswith("__") and (
            callable(v) or mod.__name__ == "pytest" and not k.startswith("_"))]
        for obj in list(ns.values()):
            if isinstance(obj, type) and obj.__module__ == mod.__name__ and id(obj) not in seen:
                seen.add(id(obj))
                cns, label = vars(obj), f"{mod.__name__}.{obj.__qualname__}"
                sizes.append((cns, len(cns), sum(map(_is_attr, cns.values())), label))
                watch += [(cns, k, v, f"{label}.{k}") for k, v in list(cns.items()) if _is_attr(v)
                          and k not in ("__class__", "__subclasshook__", "__init_subclass__")]
    return watch, sizes


class _Fingerprint:
    """The watch list in columns, so that one check is a single pass in C: `getitem` over (namespace, name),
    `is` against the object taken at baseline."""

    def __init__(self, watch: list, sizes: list) -> None:
        self.watch, self.sizes = watch, sizes
        self.nss, self.names, self.objs, _ = (list(c) for c in zip(*watch)) if watch else ([], [], [], [])
        self.size_nss = [s[0] for s in sizes]
        self.lens = [s[1] for s in sizes]

    def changed(self) -> list[str]:
        try:
            same = all(map(_is, map(_getitem, self.nss, self.names), self.objs))
        except KeyError:
            same = False
        bad = [] if same else [label for ns, n, o, label in self.watch if ns.get(n, _MISSING) is not o]
        if list(map(len, self.size_nss)) != self.lens:
            bad += [f"{label} (methods added)" for ns, n, k, label in self.sizes
                    if len(ns) != n and sum(map(_is_attr, ns.values())) != k]
        return bad

    def without(self, label: str) -> _Fingerprint:
        return _Fingerprint([w for w in self.watch if w[3] != label], self.sizes)


def _changed() -> list[str]:
    return _FP.changed()


def _baseline() -> None:
    global _FP
    _FP = _Fingerprint(*_watch_list(_MODULES))


_PM_REGISTER = _pytest.config.PytestPluginManager.register.__code__
_IMPORT_CONFTEST = _pytest.config.PytestPluginManager._importconftest.__code__
_MAIN = _pytest.config.main.__code__
_MULTICALL = {id(f.__code__) for m in ("pluggy._callers", "pluggy.callers") if (f := getattr(sys.modules.get(m),
                                                                                         "_multicall", None))}
# pytest.xfail's own code (a function in pytest 7, a callable object in pytest 9): frames to look past.
_OUTCOMES = _codes(_functions(dict(vars(_pytest.outcomes)), vars(_pytest.outcomes)))
_XFAILED = _pytest.outcomes.XFailed


def _junit_path() -> str | None:
    """The JUnit path the sandbox set (PYTEST_ADDOPTS comes after any ini addopts, so its --junitxml wins):
    records sent before pytest_configure (the initial conftests) carry it too."""
    try:
        opts = shlex.split(os.environ.get("PYTEST_ADDOPTS", ""))
    except ValueError:
        return None
    paths = [o.split("=", 1)[1] for o in opts if o.startswith("--junitxml=") or o.startswith("--junit-xml=")]
    return paths[-1] if paths else None


_state: dict = {"xml": _junit_path(), "config": None, "pm": None, "armed": False, "running": False,
                "impls": set(), "reported": set(), "items": {}, "marked": {}, "xinfo": {}}


# ---------------------------------------------------------------- plugin registrations


def _trust(plugin: object) -> None:
    """A legitimately registered plugin's own code may register plugins in turn (a conftest's
    pytest_configure): its functions' code objects join the trusted set."""
    if isinstance(plugin, types.ModuleType):
        _TRUSTED.update(_codes(_functions(dict(vars(plugin)), vars(plugin))))
    else:
        for cls in type(plugin).__mro__[:-1]:
            _TRUSTED.update(_codes(_functions(dict(vars(cls)))))


def _impl_table(pm) -> set[tuple]:
    out = set()
    for name, caller in list(vars(pm.hook).items()):
        for impl in getattr(caller, "get_hookimpls", lambda: [])():
            out.add((name, id(impl.plugin), id(impl.function)))
    return out


def _who_asked() -> tuple[list[str] | None, str, dict | None]:
    """Who asked pytest's `register` for this registration: the source files of the frames above it that are
    not trusted code, up to the hook call (or pytest's main) it came from; None when there is no such call
    above it. Also a description of the first such frame, and the locals of pytest's conftest loader on the
    way (when it is the one registering)."""
    f, conftest = _getframe(1), None
    while f is not None and f.f_code is not _PM_REGISTER:
        f = f.f_back
    if f is None:  # not through pytest's register: nothing vouches for it
        return None, "outside PytestPluginManager.register", None
    files: list[str] = []
    first = ""
    f = f.f_back
    while f is not None:
        code = f.f_code
        if id(code) in _MULTICALL or code is _MAIN:
            return files, first, conftest
        if _TRUSTED.get(id(code)) is not code:
            first = first or f"{code.co_filename}:{f.f_lineno} ({code.co_name})"
            if code.co_filename not in files:
                files.append(code.co_filename)
        elif code is _IMPORT_CONFTEST and conftest is None and not files:
            conftest = f.f_locals
        f = f.f_back
    return None, first or "no hook call above it", None


def pytest_plugin_registered(plugin, manager) -> None:
    _state["pm"] = manager
    if not _state["armed"]:  # pluggy replays the registrations made before this plugin loaded: trusted
        _trust(plugin)
        _state["armed"] = plugin is sys.modules[__name__]
        _state["impls"] = _impl_table(manager)
        return
    files, first, conftest = _who_asked()
    _state["impls"] = _impl_table(manager)
    if files == []:  # pytest, pluggy or a legitimate plugin's own code, all the way up
        _trust(plugin)
        if conftest is not None and conftest.get("mod") is plugin:  # the path pytest imported it from
            _send({"e": "conftest", "x": _state["xml"], "path": str(conftest.get("conftestpath"))[:1000]})
        return
    # Library code registering a plugin: the host judges the files (those the patch changed never vouch). Once
    # the tests run, nothing but pytest and its plugins has a reason to: the finding stands whatever the files.
    _report([f"a plugin registered by code outside pytest and its plugins: {type(plugin).__name__} "
             f"{manager.get_name(plugin)!r} from {first}"[:400]], None if _state["running"] else files)


# ---------------------------------------------------------------- items and collectors


_CLASS_ATTRS: dict[type, frozenset] = {}


def _overrides(obj: object) -> list[str]:
    """Instance attributes shadowing a method or property of the object's class."""
    cls = type(obj)
    names = _CLASS_ATTRS.get(cls)
    if names is None:
        names = _CLASS_ATTRS[cls] = frozenset(k for c in cls.__mro__ for k, v in vars(c).items() if _is_attr(v))
    return sorted(k for k in getattr(obj, "__dict__", {}) if k in names)


def _func(obj: object) -> object:
    return getattr(obj, "__func__", obj)


def _code_files(obj: object) -> list[str]:
    """Source files of a callable's code (through bound methods and functools.partial); [] when it has none."""
    for _ in range(10):
        obj = _func(getattr(obj, "func", obj))
    code = getattr(obj, "__code__", None)
    return [code.co_filename] if isinstance(code, types.CodeType) else []


def _obj_problems(item, orig: object) -> list[tuple[str, list[str] | None]]:
    """The test's function is no longer `orig`. A wrapper of it (`__wrapped__`, as plugins such as
    pytest-asyncio install) is judged by the host from its source file; anything else is a finding."""
    cur = item.__dict__.get("_obj")
    if cur is None or orig is None or _func(cur) is _func(orig):
        return []
    inner = cur
    for _ in range(10):
        inner = getattr(_func(inner), "__wrapped__", None)
        if inner is None:
            break
        if _func(inner) is _func(orig):
            return [(f"{item.nodeid}: its test function (obj) was wrapped", _code_files(cur))]
    return [(f"{item.nodeid}: its test function (obj) was replaced", None)]


def _item_problems(item) -> list[tuple[str, list[str] | None]]:
    problems: list[tuple[str, list[str] | None]] = [(f"{item.nodeid}: the instance overrides {k}", None)
                                                    for k in _overrides(item)]
    seen = _state["items"].get(id(item))
    if seen is not None:
        cls, obj = seen
        if type(item) is not cls:
            problems.append((f"{item.nodeid}: its class changed since collection", None))
        problems += _obj_problems(item, obj)
    return problems


# ---------------------------------------------------------------- checks and hooks


def _report(found: list[str], files: list[str] | None = None) -> None:
    """Send findings not sent yet. With `files` (the source files of the code responsible), the host decides:
    the finding stands unless every file is one the patch did not change (an installed plugin's, the
    repository's own); without, it always stands."""
    new = [c for c in found if c not in _state["reported"]]
    if new:
        _state["reported"].update(new)
        rec = {"e": "tamper", "x": _state["xml"], "what": new[:20]}
        _send(rec if files is None else {**rec, "files": [f[:300] for f in files[-10:]]})


def _report_each(problems: list[tuple[str, list[str] | None]]) -> None:
    for what, files in problems:
        _report([what], files)


def _check(table: bool = False) -> None:
    """The fingerprint (after every test); with `table`, the hook-implementation table too (when collection
    ends and when the session does: a registration that skipped the notification is still there then)."""
    found = _changed()
    pm = _state["pm"]
    if table and pm is not None and _state["armed"]:
        extra = _impl_table(pm) - _state["impls"]
        found += sorted({f"hook {name} implemented by an unannounced plugin" for name, _, _ in extra})
    _report(found)


def pytest_load_initial_conftests(early_config) -> None:
    # Neither tryfirst nor trylast: after pytest's own early set-up (legacypath adds properties to its classes),
    # before its trylast loader imports the first conftest (and whatever that imports): the fingerprint again.
    _baseline()


def pytest_configure(config) -> None:
    _state["xml"], _state["config"], _state["pm"] = getattr(config.option, "xmlpath", None), config, config.pluginmanager
    if getattr(config.option, "runxfail", False):  # --runxfail replaces pytest.xfail with a no-op, on purpose
        global _FP
        _FP = _FP.without("pytest.xfail")
    _send({"e": "start", "x": _state["xml"], "pid": os.getpid()})


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_make_collect_report(collector):
    _report([f"collector {collector.nodeid or '<session>'}: the instance overrides {k}"
             for k in _overrides(collector)])
    yield


def _xfail_levels(item) -> list[str]:
    """Which nodes carry an xfail mark: the test itself ("function": its decorators and parameters), its class,
    its module (`pytestmark`), a package."""
    return ["function" if node is item else type(node).__name__.lower() for node in item.listchain()
            if any(m.name == "xfail" for m in getattr(node, "own_markers", ()))]


def _defined(item) -> object:
    """The function a Python test's module or class defines under the test's name (None: not such a test)."""
    parent, name = getattr(item, "parent", None), getattr(item, "originalname", None)
    if not isinstance(item, _pytest.python.Function) or name is None \
            or not isinstance(parent, (_pytest.python.Module, _pytest.python.Class)):
        return None
    try:
        return getattr(parent.obj, name)
    except Exception:  # noqa: BLE001 - a test module that cannot be read again: pytest reports it
        return None


def pytest_collection_finish(session) -> None:
    for item in session.items:
        _state["items"][id(item)] = (type(item), item.__dict__.get("_obj"))
        levels = _xfail_levels(item)
        if levels:
            _state["marked"][item.nodeid] = levels
        _report_each(_obj_problems(item, _defined(item)))
    _state["keep"] = list(session.items)  # ids above stay valid
    for item in session.items:
        _report_each(_item_problems(item))
    _check(table=True)
    _state["running"] = True


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_call(item):
    _report_each(_item_problems(item))
    yield


def _xfail_origin(item, call) -> dict:
    """Where an XFAIL came from: `call` when pytest.xfail() was called by code that is not pytest's (with the
    files of the frames that led there), `pytest` when pytest's own code called it, `marker` when pytest turned
    a failure into an XFAIL because of an xfail mark."""
    info = {"xl": _state["marked"].get(item.nodeid, []), "xh": "marker"}
    exc = call.excinfo
    if exc is None or not isinstance(exc.value, _XFAILED):
        return info
    frames, tb = [], exc.tb
    while tb is not None:
        frames.append(tb.tb_frame.f_code)
        tb = tb.tb_next
    while frames and _OUTCOMES.get(id(frames[-1])) is frames[-1]:
        frames.pop()
    if frames and _TRUSTED.get(id(frames[-1])) is frames[-1]:
        return {**info, "xh": "pytest"}  # pytest's own: an xfail mark with run=False, unittest's expectedFailure
    files: list[str] = []
    for code in frames:
        if _TRUSTED.get(id(code)) is not code and code.co_filename not in files:
            files.append(code.co_filename)
    return {**info, "xh": "call", "xf": [f[:300] for f in files[-10:]]}


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_makereport(item, call):
    out = yield
    rep = out.get_result()
    if rep is not None and hasattr(rep, "wasxfail"):
        _state["xinfo"][id(rep)] = _xfail_origin(item, call)


def pytest_runtest_logreport(report) -> None:
    rec = {"e": "test", "x": _state["xml"], "id": report.nodeid, "when": report.when, "outcome": report.outcome,
           "xfail": hasattr(report, "wasxfail")}
    _send({**rec, **_state["xinfo"].pop(id(report), {})})
    # Checked after teardown, when the test's own monkeypatches (honest tests patch os, even pytest) are undone.
    if report.when == "teardown":
        _check()


def pytest_collectreport(report) -> None:
    if report.failed:
        _send({"e": "collect", "x": _state["xml"], "id": report.nodeid, "outcome": report.outcome})


def pytest_sessionfinish(session, exitstatus) -> None:
    _check(table=True)
    _send({"e": "finish", "x": _state["xml"], "exit": int(exitstatus)})


# Taken last, once every function of this module exists, and before any conftest or test module is imported.
_MODULES = _own_modules()
_FP = _Fingerprint([], [])
_baseline()
# Code defined in pytest's and pluggy's modules (not what they import: a thread's or stdlib helper's frame
# vouches for nothing).
_TRUSTED: dict[int, types.CodeType] = _codes([f for m in _MODULES for f in _functions(dict(vars(m)), vars(m))])
