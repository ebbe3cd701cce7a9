"""pytest plugin the sandbox loads into every pytest run (`-p gagar_pytest_guard`, from a read-only mount).

It is the second result channel next to the JUnit report: each test phase's outcome is written, as it
happens, as one JSON line to a FIFO whose reader is the host (`$GAGAR_RESULT_PIPE`). A pipe is append-only
and the host reads it live, so code that rewrites the JUnit report after the tests ran (an `atexit` hook,
a shutdown step) cannot take back what was already sent; the host compares the two (`sandbox/integrity/checks.py`).

It also records whether the run's own machinery changed under it: module functions and class methods of
pytest's runner, reports, JUnit writer and of this module are fingerprinted when the plugin loads (before
any conftest or test module is imported) and compared after every test and at the end; hook implementations
registered later by anything but a `conftest.py` are reported too. A finding is sent as a `tamper` record.

Runs inside the container under the test's Python; standard library and pytest only. Every write is a
single `os.write` of at most PIPE_BUF bytes, so records of concurrent writers never interleave.
"""

from __future__ import annotations

import json
import os
import sys

import _pytest.junitxml
import _pytest.main
import _pytest.python
import _pytest.reports
import _pytest.runner
import _pytest.skipping
import pluggy

_MAX_RECORD = 4000  # < PIPE_BUF (4096): one atomic write
_WATCHED_HOOKS = ("pytest_runtest_makereport", "pytest_runtest_logreport", "pytest_report_teststatus",
                  "pytest_runtest_protocol", "pytest_runtest_call", "pytest_pyfunc_call", "pytest_runtestloop",
                  "pytest_sessionfinish")


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
_write, _dumps = os.write, json.dumps


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


def _fingerprint() -> dict[str, int]:
    """id() of every function/method the outcome of a test passes through; any change means monkeypatching."""
    out: dict[str, int] = {}
    targets = [_pytest.runner, _pytest.reports, _pytest.junitxml, _pytest.skipping, _pytest.main, _pytest.python,
               sys.modules[__name__], pluggy]
    classes = [_pytest.reports.BaseReport, _pytest.reports.TestReport, _pytest.reports.CollectReport,
               _pytest.runner.CallInfo, _pytest.junitxml.LogXML, _pytest.junitxml._NodeReporter,
               _pytest.python.Function, pluggy.PluginManager]
    for mod in targets:
        for name, obj in vars(mod).items():
            if callable(obj) and not isinstance(obj, type) and not name.startswith("__"):
                out[f"{mod.__name__}.{name}"] = id(obj)
    for cls in classes:
        for name, obj in vars(cls).items():
            if callable(obj) or isinstance(obj, (property, classmethod, staticmethod)):
                out[f"{cls.__module__}.{cls.__qualname__}.{name}"] = id(obj)
    return out


_state: dict = {"plugins": None, "reported": set(), "xml": None, "config": None}


def _check(config) -> None:
    now = _fingerprint()
    changed = sorted(k for k in set(now) | set(_BASELINE) if now.get(k) != _BASELINE.get(k))
    if _state["plugins"] is not None:
        for hook in _WATCHED_HOOKS:
            caller = getattr(config.hook, hook, None)
            for impl in caller.get_hookimpls() if caller is not None else []:
                origin = getattr(impl.plugin, "__file__", "") or ""
                if id(impl.plugin) not in _state["plugins"] and os.path.basename(origin) != "conftest.py":
                    changed.append(f"hook {hook} from {impl.plugin_name}")
    new = [c for c in changed if c not in _state["reported"]]
    if new:
        _state["reported"].update(new)
        _send({"e": "tamper", "x": _state["xml"], "what": new[:20]})


def pytest_configure(config) -> None:
    _state["xml"], _state["config"] = getattr(config.option, "xmlpath", None), config
    _send({"e": "start", "x": _state["xml"], "pid": os.getpid()})


def pytest_sessionstart(session) -> None:
    # Plugins known here (built-ins, installed plugins, -p, the rootdir conftest) are the legitimate set.
    _state["plugins"] = {id(p) for p in session.config.pluginmanager.get_plugins()}


def pytest_runtest_logreport(report) -> None:
    _send({"e": "test", "x": _state["xml"], "id": report.nodeid, "when": report.when, "outcome": report.outcome,
           "xfail": hasattr(report, "wasxfail")})
    # Checked after teardown, when the test's own monkeypatches (honest tests patch os, even pytest) are undone.
    if report.when == "teardown" and _state["config"] is not None:
        _check(_state["config"])


def pytest_collectreport(report) -> None:
    if report.failed:
        _send({"e": "collect", "x": _state["xml"], "id": report.nodeid, "outcome": report.outcome})


def pytest_sessionfinish(session, exitstatus) -> None:
    _check(session.config)
    _send({"e": "finish", "x": _state["xml"], "exit": int(exitstatus)})


# Taken last, once every function of this module exists, and before any conftest or test module is imported.
_BASELINE = _fingerprint()
