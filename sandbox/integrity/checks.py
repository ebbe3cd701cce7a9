"""Report integrity: a pass has to be claimed consistently on every channel, not only in the report file.

The test process runs the patch's code, so it can write anything the framework can write. The verdict is
read from the structured report (JUnit XML, `go test -json`), and this module cross-checks it against the
channels a forger would also have to fake:

- the live result pipe of the guard plugin (pytest; `sandbox/integrity/channel.py`): the report may claim a pass only
  for a test the plugin saw pass while it ran; the plugin must have loaded and finished; pytest's own exit
  status must agree with the report; the plugin saw no monkeypatching of pytest's machinery;
- the launcher's printed summary and the exit code (JUnit), the event stream and exit code (Go);
- each listed test reported exactly once, and defined in a test file before the run;
- the patch itself: start-up hooks (`sitecustomize.py`, `.pth`, package metadata with entry points, planted
  bytecode), modules that shadow the standard library or pytest, references to the sandbox's report channel,
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

from sandbox.integrity.channel import ChannelData
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
    try:
        head = (tree / path).read_text(errors="replace")[:4096]
    except OSError:
        return False
    return bool(re.search(r"^package\s+main\b", head, re.M))


def _is_py_test_file(path: str) -> bool:
    name = os.path.basename(path)
    parts = path.split("/")[:-1]
    return name.endswith(".py") and (name.startswith("test_") or name.endswith("_test.py")
                                     or bool({"tests", "test", "testing"} & set(parts)))


def static_findings(patch: str, info: PatchInfo, test_paths: set[str], tree: Path) -> list[str]:
    """What in the model patch can only serve to control the test run or its report (see the module doc)."""
    found: list[str] = []
    for f in info.files:
        if f.change == "deleted":
            continue
        p, parts = f.path, f.path.split("/")
        name = parts[-1]
        if name in ("sitecustomize.py", "usercustomize.py") or name.endswith(".pth"):
            found.append(f"the patch adds an interpreter start-up hook ({p})")
        elif any(c.endswith((".dist-info", ".egg-info")) for c in parts[:-1]):
            found.append(f"the patch adds package metadata, whose entry points load pytest plugins ({p})")
        elif "__pycache__" in parts or name.endswith((".pyc", ".pyo")):
            found.append(f"the patch adds compiled Python ({p})")
        if f.change == "added":
            module = name[:-3] if len(parts) == 1 and name.endswith(".py") else (
                parts[0] if len(parts) == 2 and name == "__init__.py" else None)
            if module in SHADOWED:
                found.append(f"the patch adds a top-level module {p} that shadows `{module}`")
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
                names.update(re.findall(r"^func\s+(\w+)\s*\(", path.read_text(errors="replace"), re.M))
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


def _check_pytest(instance: Instance, parsed: ParsedTests, report_dir: Path, data: ChannelData | None) -> list[str]:
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
        found.append(f"pytest's machinery was changed during the run: {', '.join(map(str, r.get('what', [])))[:300]}")
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
          channel: ChannelData | None, undefined: set[str], static: list[str]) -> list[str]:
    """Every disagreement between the report and the other channels (empty: nothing suspicious)."""
    framework = (instance.test_framework or "").lower()
    found = list(static)
    if parsed.source == "report" and framework == "pytest":
        found += _check_pytest(instance, parsed, report_dir, channel)
    elif framework == "go":
        found += _check_go(instance, parsed, output, exit_code)
    elif parsed.source == "report" and framework == "junit":
        found += _check_junit(instance, parsed, report_dir, output, exit_code, instance.test_cmd)
    ghosts = {t for t in undefined if parsed.statuses.get(t) in SUCCESS}
    if ghosts:
        found.append(f"the report claims passes for listed tests no test file defines: {_short(ghosts)}")
    return found
