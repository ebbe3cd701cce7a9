"""Report integrity: a pass has to be claimed consistently on every channel, not only in the report file.

The test process runs the patch's code, so it can write anything the framework can write. The verdict is
read from the structured report (JUnit XML, `go test -json`), and this module cross-checks it against the
channels a forger would also have to fake:

- the live result pipe of the guard plugin (pytest; `sandbox/integrity/channel.py`): the report may claim a pass only
  for a test the plugin saw pass while it ran; the plugin must have loaded and finished; pytest's own exit
  status must agree with the report; the plugin saw no monkeypatching of pytest's machinery;
- the launcher's printed summary and the exit code (JUnit), the event stream and exit code (Go);
- each listed test reported exactly once, and defined in a test file before the run;
- the patch itself, as applied (the tree's changes, `sandbox.integrity.treefs`): start-up hooks
  (`sitecustomize.py`, `.pth`, package metadata with entry points, planted bytecode), modules of any file type
  (source, bytecode, extension, package directory, symlink) that shadow a module of the repository or of the
  runner from a directory on the tests' import path, references to the sandbox's report channel,
  a Go `TestMain` or an `init()` that exits, printed Go test framing, a Go exit past `-test.paniconexit0` (it has
  to be named: Go has no eval), new test files that register plugins.

`check()` returns the reasons; any reason makes the result `suspicious_report` (and unresolved). The checks are
built so that an honest run never trips them: each is a disagreement no real test run produces.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

from sandbox.integrity import pytestcfg
from sandbox.integrity.channel import ChannelData
from sandbox.integrity.prerun import PreRun
from sandbox.integrity.treefs import Change, read_text_capped
from sandbox.parsers import junit, pytest
from sandbox.parsers.base import ERROR, FAILED, PASSED, SKIPPED, XFAIL, ParsedTests, merge
from sandbox.parsers.go import events as go_events
from sandbox.patchcheck import PatchInfo
from sandbox.records import Instance

SUCCESS = (PASSED, XFAIL)
# What pytest and its dependencies import by name: a top-level module of that name in the repo shadows them.
SHADOWED = frozenset(sys.stdlib_module_names) | {
    "pytest", "_pytest", "pluggy", "py", "iniconfig", "packaging", "exceptiongroup", "tomli", "attr", "attrs",
    "gagar_pytest_guard", "sitecustomize", "usercustomize"}
_CHANNEL_WORDS = re.compile(r"GAGAR_|gagar_pytest_guard|/gagar/(?:report|lib)|TEST-junit-")
_GO_FRAMING = re.compile(r"--- (?:PASS|FAIL|SKIP):|=== RUN ")
# Ways a Go test binary can end with status 0 that `-test.paniconexit0` (which traps os.Exit(0)) does not see.
# Go has no eval: reaching exit_group or execve takes one of these names in the source.
_GO_RAW_EXIT = re.compile(
    r"\b(?:syscall|unix)\.(?:Exit|Exec|RawSyscall6?|Syscall6?|RawSyscallNoError)\s*\(|"
    r"^//go:linkname\s+\w+\s+\S*(?:[Ee]xit|testlog|Syscall|[Ee]xec)|"
    r"\bC\.(?:_?exit|_Exit|quick_exit|syscall|execv\w*)\s*\(", re.M)
_PY_PLUGIN = re.compile(r"^\s*pytest_plugins\s*=|^\s*def\s+pytest_\w+\s*\(|hookimpl")
_PY_INTERNALS = re.compile(r"\b(?:TestReport|CallInfo|runtestprotocol|call_and_report|LogXML|junitxml)\b")
_SUMMARY = re.compile(r"^\[\s*(\d+) tests (successful|failed|aborted)\s*\]", re.M)
_GO_TEXT_FAIL = re.compile(r"^FAIL\s", re.M)  # a plain-text FAIL line: build or setup failure (Go 1.19)
_LAUNCHER = re.compile(r"junit-platform-console|ConsoleLauncher")
MAX_WALK = 50_000
MAX_SOURCE_BYTES = 4 << 20  # a source file the host reads for a static check (larger ones are not read)
_MODULE_FILES = (".py", ".pyc", ".pyo", ".pyw", ".so", ".pyd")
_NOT_MODULES = frozenset({"setup", "conftest", "__init__", "__main__"})


# ---------------------------------------------------------------- the patch itself


def _added_lines(patch: str) -> dict[str, list[str]]:
    """Added lines per new path, from the diff text (hunk bodies are walked by their line counts)."""
    out: dict[str, list[str]] = {}
    path, left = None, 0
    for line in patch.splitlines():
        if left > 0 and path is not None:
            if line.startswith("+"):
                out.setdefault(path, []).append(line[1:])
                left -= 1
            elif line == "" or line.startswith(" "):
                left -= 1  # context; removed lines and "\ No newline" do not count on the new side
            continue
        if line.startswith("+++ "):
            name = line[4:].split("\t")[0].strip().strip('"')
            path = name[2:] if name.startswith("b/") else (None if name == "/dev/null" else name)
        elif line.startswith("@@") and path is not None:
            m = re.match(r"@@ -\d+(?:,\d+)? \+\d+(?:,(\d+))? @@", line)
            left = int(m.group(1)) if m and m.group(1) is not None else 1
    return out


def _go_main_package(tree: Path, path: str) -> bool:
    """A `package main` file (a command: exiting is its job)."""
    text = read_text_capped(tree / path, MAX_SOURCE_BYTES)
    return bool(text and re.search(r"^package\s+main\b", text[:4096], re.M))


def _is_py_test_file(path: str) -> bool:
    name = os.path.basename(path)
    parts = path.split("/")[:-1]
    return name.endswith(".py") and (name.startswith("test_") or name.endswith("_test.py")
                                     or bool({"tests", "test", "testing"} & set(parts)))


def _is_package(path: Path) -> bool:
    """A directory Python imports as a regular package (a directory without `__init__` is a namespace portion,
    which never wins over a module found anywhere on sys.path)."""
    try:
        return path.is_dir() and any(e.name.split(".", 1)[0] == "__init__" for e in os.scandir(path))
    except OSError:
        return False


def _module_name(tree: Path, path: str, kind: str) -> str | None:
    """The top-level module the added entry `path` provides when its directory is on sys.path, if any."""
    name = path.rsplit("/", 1)[-1]
    if kind == "file" and name.endswith(_MODULE_FILES):
        mod = name.split(".", 1)[0]
    elif kind == "dir" or (kind == "link" and not name.endswith(_MODULE_FILES)):
        mod = name if _is_package(tree / path) else None  # a symlink is followed, as the import system does
    elif kind == "link":
        mod = name.split(".", 1)[0]
    else:
        return None
    return mod if mod and mod.isidentifier() and mod not in _NOT_MODULES else None


def _repo_modules(tree: Path, added: set[str], deleted: set[str]) -> dict[str, set[str]]:
    """Top-level modules of the repository before the patch: name -> the directories ("" or "src") holding it."""
    out: dict[str, set[str]] = {}
    for d in ("", "src"):
        try:
            entries = [(e.name, e.is_dir(follow_symlinks=False)) for e in os.scandir(tree / d)]
        except OSError:
            continue
        entries += [(p.rsplit("/", 1)[-1], False) for p in deleted if p.rpartition("/")[0] == d]
        for name, is_dir in entries:
            rel = f"{d}/{name}" if d else name
            if rel in added or name.startswith("."):
                continue
            mod = name[:-3] if name.endswith(".py") else (name if is_dir and (tree / rel / "__init__.py").is_file()
                                                        else None)
            if mod and mod.isidentifier() and mod not in _NOT_MODULES:
                out.setdefault(mod, set()).add(d)
    return out


def _on_import_path(tree: Path, d: str, pythonpath: set[str]) -> bool:
    """Whether pytest puts directory `d` of the tree on sys.path: the root, `src`, a `pythonpath` entry, or a
    directory that is not a package and holds test files or a conftest.py (its "basedir", prepended or
    appended whatever the import mode)."""
    if d in ("", "src") or d in pythonpath:
        return True
    if os.path.lexists(tree / d / "__init__.py"):
        return False
    try:
        names = [e.name for e in os.scandir(tree / d)]
    except OSError:
        return False
    return any(n == "conftest.py" or (n.endswith(".py") and (n.startswith("test_") or n.endswith("_test.py")))
               for n in names)


def shadowing(changes: list[Change], tree: Path) -> list[str]:
    """Modules the patch added (any file type, package directories and symlinks too) that take the place of a
    module of the repository or of the runner, from a directory on the tests' import path."""
    added = {c.path: c.kind for c in changes if c.change == "added"}
    deleted = {c.path for c in changes if c.change == "deleted"}
    repo = _repo_modules(tree, set(added), deleted)
    pythonpath = pytestcfg.pythonpath_dirs(tree)
    found = []
    for path, kind in sorted(added.items()):
        d = path.rpartition("/")[0]
        mod = _module_name(tree, path, kind)
        if mod is None or not (mod in SHADOWED or d not in repo.get(mod, {d})):
            continue
        if _on_import_path(tree, d, pythonpath):
            what = "the standard library or the test runner" if mod in SHADOWED else "the repository"
            found.append(f"the patch adds {path} ({kind}), which shadows `{mod}` of {what} on the tests' import path")
    return found


def static_findings(patch: str, info: PatchInfo, test_paths: set[str], tree: Path,
                    changes: list[Change] | None = None) -> list[str]:
    """What in the model patch can only serve to control the test run or its report (see the module doc).
    `changes` is what applying it really changed (`ApplyOutcome.changes`); without it, what the patch names."""
    found: list[str] = []
    if changes is None:  # what the patch names, with the directories it would create
        changes = [Change(f.path, "modified" if f.change == "renamed" else f.change, "link" if f.symlink else "file")
                   for f in info.files]
        new_dirs = {p.rsplit("/", k)[0] for c in changes if c.change == "added" for k in range(1, c.path.count("/") + 1)
                    for p in [c.path]}
        changes += [Change(d, "added", "dir") for d in sorted(new_dirs) if not os.path.lexists(tree / d)]
    for c in changes:
        if c.change == "deleted" or c.kind == "dir":
            continue
        p, parts = c.path, c.path.split("/")
        name = parts[-1]
        if name in ("sitecustomize.py", "usercustomize.py") or name.endswith(".pth"):
            found.append(f"the patch adds an interpreter start-up hook ({p})")
        elif any(x.endswith((".dist-info", ".egg-info")) for x in parts[:-1]):
            found.append(f"the patch adds package metadata, whose entry points load pytest plugins ({p})")
        elif "__pycache__" in parts or name.endswith((".pyc", ".pyo")):
            found.append(f"the patch adds compiled Python ({p})")
    found += shadowing(changes, tree)
    own_pytest = (tree / "_pytest").is_dir() or (tree / "src" / "_pytest").is_dir()
    for p, lines in _added_lines(patch).items():
        if p in test_paths:
            continue
        text = "\n".join(lines)
        hit = _CHANNEL_WORDS.search(text)
        if hit:
            found.append(f"the patch refers to the sandbox's report channel ({p}: {hit.group(0)!r})")
        if p.endswith(".go"):
            if p.endswith("_test.go") and re.search(r"^func\s+TestMain\s*\(", text, re.M):
                found.append(f"the patch adds TestMain ({p}), which decides whether and how the tests run")
            if re.search(r"^func\s+init\s*\(", text, re.M) and re.search(r"\b(?:os|syscall)\.Exit\b", text):
                found.append(f"the patch adds an init() that can exit before the tests run ({p})")
            if _GO_FRAMING.search(text):
                found.append(f"the patch prints Go test framing lines ({p})")
            hit = _GO_RAW_EXIT.search(text)
            if hit and not (re.search(r"^package\s+main\b", text, re.M) or _go_main_package(tree, p)):
                found.append(f"the patch can end the test binary past -test.paniconexit0 ({p}: {hit.group(0)[:40]!r})")
        elif p.endswith((".s", ".S")) and re.search(r"\bSYSCALL\b|\bSVC\b|\bINT\s+\$0x80", "\n".join(lines)):
            found.append(f"the patch adds assembly that makes system calls ({p})")
        elif p.endswith(".py"):
            if _is_py_test_file(p) and any(_PY_PLUGIN.search(ln) for ln in lines):
                found.append(f"a test file the task does not have registers pytest plugins or hooks ({p})")
            elif not own_pytest and not _is_py_test_file(p) and _PY_INTERNALS.search(text):
                found.append(f"the patch reaches into pytest's reporting internals ({p})")
        elif p.endswith(".java"):
            if "Runtime.getRuntime().halt(" in text.replace(" ", ""):
                found.append(f"the patch halts the JVM, skipping the launcher's own shutdown ({p})")
            if "/src/test/" in f"/{p}" and "addShutdownHook" in text:
                found.append(f"a test file the task does not have adds a JVM shutdown hook ({p})")
    return found


# ---------------------------------------------------------------- the tree before the run


def _walk(tree: Path, suffix: str):
    n = 0
    for root, dirs, files in os.walk(tree):
        dirs[:] = [d for d in dirs if d != ".git"]
        for name in files:
            n += 1
            if n > MAX_WALK:
                return
            if name.endswith(suffix):
                yield Path(root, name)


def undefined_tests(instance: Instance, tree: Path) -> set[str]:
    """Listed tests with no definition in the tree as it is before the run (after the tests were restored)."""
    framework = (instance.test_framework or "").lower()
    listed = [*instance.FAIL_TO_PASS, *instance.PASS_TO_PASS]
    if framework == "pytest":
        return {t for t in listed if "::" in t and t.split("::", 1)[0].endswith(".py")
                and not (tree / t.split("::", 1)[0]).is_file()}
    if framework == "go":
        names: set[str] = set()
        for path in _walk(tree, "_test.go"):
            try:
                names.update(re.findall(r"^func\s+(\w+)\s*\(", read_text_capped(path, MAX_SOURCE_BYTES) or "",
                                        re.M))
            except OSError:
                continue
        return {t for t in listed if t.split("/", 1)[0] not in names}
    if framework == "junit":
        stems = {p.stem for p in _walk(tree, ".java")}
        return {t for t in listed if "." in t and t.rsplit(".", 1)[0].rsplit(".", 1)[-1].split("$")[0] not in stems}
    return set()


# ---------------------------------------------------------------- the run's channels


def _pipe_statuses(data: ChannelData) -> dict[str, str]:
    out: dict[str, str] = {}
    for r in data.of("test"):
        tid, when, outcome = str(r.get("id")), r.get("when"), r.get("outcome")
        if outcome == "failed":
            merge(out, tid, FAILED if when == "call" else ERROR)
        elif outcome == "skipped":
            merge(out, tid, XFAIL if r.get("xfail") else SKIPPED)
        elif outcome == "passed" and when == "call":
            merge(out, tid, PASSED)
    return out


def _listed_twice(instance: Instance, ids: list[str]) -> list[str]:
    listed = {*instance.FAIL_TO_PASS, *instance.PASS_TO_PASS}
    seen: dict[str, int] = {}
    for tid in ids:
        if tid in listed:
            seen[tid] = seen.get(tid, 0) + 1
    return sorted(t for t, n in seen.items() if n > 1)


def _short(ids) -> str:
    ids = sorted(i if len(i) <= 200 else i[:200] + "…" for i in ids)
    return ", ".join(ids[:3]) + (f" (+{len(ids) - 3} more)" if len(ids) > 3 else "")


def _check_pytest(instance: Instance, parsed: ParsedTests, report_dir: Path, data: ChannelData | None,
                  pre: PreRun | None = None) -> list[str]:
    found: list[str] = []
    cases = pytest.report_cases(report_dir) or []
    twice = _listed_twice(instance, [t for t, _ in cases])
    if twice:
        found.append(f"the JUnit report lists a test more than once: {_short(twice)}")
    if data is None:
        return found
    if data.overflow or data.junk_lines:
        found.append(f"the result pipe was flooded or written by something else ({data.junk_lines} foreign lines"
                     f"{', over the cap' if data.overflow else ''})")
    if not data.of("start"):
        return [*found, "the JUnit report was not written by a pytest run that loaded the sandbox's guard plugin"]
    for r in data.of("tamper"):
        files = r.get("files")
        if files and pre is not None and all(pre.vouches(str(f)) for f in files):
            continue  # code the patch did not write (an installed plugin, the repository's own helpers)
        found.append(f"pytest's machinery was changed during the run: {', '.join(map(str, r.get('what', [])))[:300]}")
    if pre is not None:
        foreign = pre.foreign_conftests([str(r.get("path")) for r in data.of("conftest")])
        if foreign:
            found.append(f"pytest imported conftest files that were not in the tree before the run: {_short(foreign)}")
        during = pre.changed_during_run()
        if during:
            found.append(f"the tests changed pytest configuration, conftest or test files while they ran: "
                         f"{_short(during)}")
    finish = data.of("finish")
    live = _pipe_statuses(data)
    live_failed = sum(s in (FAILED, ERROR) for s in live.values())
    if not finish:
        found.append("pytest never finished its session, yet a JUnit report exists")
    elif (any(r.get("exit") == 1 for r in finish) and live_failed
          and not any(s in (FAILED, ERROR) for s in parsed.statuses.values())):
        # Only with failures seen live: a plugin (coverage thresholds) may set exit status 1 on its own.
        found.append(f"pytest exited with 'tests failed' after {live_failed} failing tests, but the JUnit report "
                     "shows no failure")
    # Listed tests only: their ids are what grading reads, and an unlisted id may be spelled differently in
    # the two channels (a test method inherited from another file).
    listed = {*instance.FAIL_TO_PASS, *instance.PASS_TO_PASS}
    # An id over the plugin's record size arrives cut to 1000 characters: matched by that prefix.
    cut = _pipe_statuses(ChannelData(records=[r for r in data.of("test") if r.get("detail") == "truncated"]))
    claimed = [t for t, s in parsed.statuses.items() if t in listed and s in SUCCESS
               and s not in (live.get(t), cut.get(t[:1000]))]
    if claimed:
        found.append(f"the JUnit report claims passes the live result channel did not see: {_short(claimed)}")
    return found


def _check_go(instance: Instance, parsed: ParsedTests, output: str, exit_code: int | None) -> list[str]:
    found: list[str] = []
    listed = {*instance.FAIL_TO_PASS, *instance.PASS_TO_PASS}
    runs: dict[tuple, int] = {}
    ends: dict[tuple, int] = {}
    unrun: set[str] = set()
    failed = False
    for ev in go_events(output):
        action, test, pkg = ev.get("Action"), ev.get("Test"), ev.get("Package")
        failed = failed or action == "fail"
        if not isinstance(test, str) or test not in listed:
            continue
        key = (pkg, test)
        if action == "run":
            runs[key] = runs.get(key, 0) + 1
        elif action in ("pass", "fail", "skip"):
            ends[key] = ends.get(key, 0) + 1
            if action == "pass" and not runs.get(key):
                unrun.add(test)
    twice = {t for (_, t), n in [*runs.items(), *ends.items()] if n > 1}
    if twice:
        found.append(f"go test reported a listed test more than once: {_short(twice)}")
    if unrun:
        found.append(f"go test reported a pass for a test that never started: {_short(unrun)}")
    if (exit_code not in (0, None) and not failed and parsed.statuses
            and all(s in SUCCESS or s == SKIPPED for s in parsed.statuses.values())
            and not _GO_TEXT_FAIL.search(output)):
        found.append(f"go test exited {exit_code} but reported no failure")
    return found


def _check_junit(instance: Instance, parsed: ParsedTests, report_dir: Path, output: str, exit_code: int | None,
                 test_cmd: str) -> list[str]:
    found: list[str] = []
    cases = junit.report_cases(report_dir) or []
    twice = _listed_twice(instance, [t for t, _ in cases])
    if twice:
        found.append(f"the JUnit report lists a test more than once: {_short(twice)}")
    xml_failed = sum(s in (FAILED, ERROR) for _, s in cases)
    xml_passed = sum(s == PASSED for _, s in cases)
    counts = {"successful": 0, "failed": 0, "aborted": 0}
    blocks = 0
    for n, kind in _SUMMARY.findall(output):
        counts[kind] += int(n)
        blocks += kind == "successful"
    if not _LAUNCHER.search(test_cmd):
        return found  # Maven, Gradle…: their exit codes and printouts mean other things
    if not blocks and "--details" not in test_cmd and cases:
        found.append("the JUnit launcher printed no summary, yet a report exists")
    elif blocks:
        if counts["failed"] + counts["aborted"] > 0 and not xml_failed:
            found.append(f"the launcher counted {counts['failed'] + counts['aborted']} failed tests, "
                         "but the JUnit report shows none")
        if xml_passed > counts["successful"]:
            found.append(f"the JUnit report has {xml_passed} passing tests, the launcher counted "
                         f"{counts['successful']}")
    if exit_code not in (0, None) and cases and not xml_failed:
        found.append(f"the test command exited {exit_code} but the JUnit report shows no failure")
    return found


def check(instance: Instance, parsed: ParsedTests, *, report_dir: Path, output: str, exit_code: int | None,
          channel: ChannelData | None, undefined: set[str], static: list[str], pre: PreRun | None = None) -> list[str]:
    """Every disagreement between the report and the other channels (empty: nothing suspicious). `pre`: what
    the host knew before the run (which files the patch wrote, the tree's conftest and configuration files)."""
    framework = (instance.test_framework or "").lower()
    found = list(static)
    if parsed.source == "report" and framework == "pytest":
        found += _check_pytest(instance, parsed, report_dir, channel, pre)
    elif framework == "go":
        found += _check_go(instance, parsed, output, exit_code)
    elif parsed.source == "report" and framework == "junit":
        found += _check_junit(instance, parsed, report_dir, output, exit_code, instance.test_cmd)
    ghosts = {t for t in undefined if parsed.statuses.get(t) in SUCCESS}
    if ghosts:
        found.append(f"the report claims passes for listed tests no test file defines: {_short(ghosts)}")
    return found
