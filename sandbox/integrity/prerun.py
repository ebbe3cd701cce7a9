"""What the host knows about a tree before its tests run, and the judgements that need it afterwards.

Taken once the patch is applied, the task's tests are restored and the tree is handed to the container user
(`PreRun.take`), so nothing the tests do can change it:
- `changed`: the paths the model patch really changed (from the tree, `sandbox.integrity.treefs`) and that the
  restore did not revert: the patch's code;
- a metadata snapshot of the whole tree: which files existed before the run, and the state of every file pytest
  reads as configuration (`sandbox.integrity.pytestcfg`) and of the task's test files.

After the run:
- `vouches(file)`: whether a source file (a frame's or a function's `co_filename` the guard plugin reported)
  is one the patch did not write: a file of the tree from before the run that the patch did not change, or a
  file of the image. A file the patch changed or added, one written during the run (in the tree, `/tmp`, ...),
  or code with no file never vouches;
- `changed_during_run()`: configuration, `conftest.py` and task test files the tests added, changed or removed
  while they ran (a pytest run reads them as it goes: a conftest written into a directory not collected yet
  is loaded as if it were the task's);
- `foreign_conftests(paths)`: conftest files pytest imported that were not in the tree before the run;
- `settle_xfails(...)`: an XFAIL is a success only when it came from the test itself (module docstring of
  `settle_xfails`).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from sandbox.container import TESTBED
from sandbox.integrity import pytestcfg, treefs
from sandbox.integrity.channel import ChannelData
from sandbox.parsers.base import FAILED, XFAIL, ParsedTests
from sandbox.records import Instance

# Mounts the tests can write to: a source file there was written by the run, never by the image.
WRITABLE = (TESTBED, "/tmp", "/dev/shm", "/gagar", "/var/tmp", "/run", "/home")
_PYTESTMARK = re.compile(r"^pytestmark\s*(?::[^=\n]*)?=", re.M)


def _within(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


@dataclass
class PreRun:
    tree: Path
    changed: set[str] = field(default_factory=set)
    snapshot: dict[str, treefs.Entry] = field(default_factory=dict)
    watched: dict[str, treefs.Entry] = field(default_factory=dict)
    module_marks: dict[str, bool] = field(default_factory=dict)  # test file -> it sets an xfail pytestmark
    tests: set[str] = field(default_factory=set)  # the task's test files

    @classmethod
    def take(cls, instance: Instance, tree: Path, *, changed: list[str], reverted: list[str],
             test_paths: set[str]) -> PreRun:
        """After `hand_over` (it changes every file's ctime). `reverted`: what the restore put back."""
        tree = Path(tree)
        snap = treefs.snapshot(tree)
        pre = cls(tree, set(changed) - set(reverted), snap)
        pre.watched = {p: e for p, e in snap.items() if pytestcfg.is_config_name(p) or p in test_paths}
        pre.tests = set(test_paths)
        for path in {t.split("::", 1)[0] for t in [*instance.FAIL_TO_PASS, *instance.PASS_TO_PASS] if "::" in t}:
            text = treefs.read_text_capped(tree / path, pytestcfg.MAX_CONFIG_BYTES) or ""
            pre.module_marks[path] = bool(_PYTESTMARK.search(text)) and "xfail" in text
        return pre

    def _rel(self, file: str) -> str | None:
        """`file` (a path inside the container) relative to the tree, or None when it is not in the tree."""
        path = os.path.normpath(file if file.startswith("/") else f"{TESTBED}/{file}")
        return os.path.relpath(path, TESTBED) if _within(path, TESTBED) else None

    def vouches(self, file: str) -> bool:
        if not file or file.startswith("<") and not file.startswith("<frozen "):
            return False  # exec'd or compiled from a string: no file to judge
        if file.startswith("<frozen "):
            return True  # the interpreter's own frozen modules
        rel = self._rel(file)
        if rel is None:
            return not any(_within(os.path.normpath(file), w) for w in WRITABLE[1:])
        parts = rel.split("/")
        if any("/".join(parts[:i]) in self.changed for i in range(1, len(parts) + 1)):
            return False  # the patch wrote it, or a directory (a symlink) on the way to it
        entry = self.snapshot.get(rel)
        return entry is not None and entry.kind == "file"

    def changed_during_run(self) -> list[str]:
        """Watched files that differ now, and configuration files that appeared where pytest looks for its
        configuration: the tree's root and every directory on the way to the task's test files. (A conftest.py
        written anywhere else is reported by the guard plugin when pytest imports it.) No walk of the tree:
        the tests may have left millions of entries, or directories thousands deep, in it."""
        dirs = {""} | {p.rsplit("/", i)[0] for p in self.tests for i in range(1, p.count("/") + 1)}
        paths = set(self.watched) | {f"{d}/{n}" if d else n for d in dirs for n in pytestcfg.NAMES}
        return sorted(p for p in paths if treefs.entry(self.tree / p) != self.watched.get(p))

    def foreign_conftests(self, paths: list[str]) -> list[str]:
        out = []
        for p in paths:
            rel = self._rel(p)
            if rel is None and not any(_within(os.path.normpath(p), w) for w in WRITABLE[1:]):
                continue  # the image's own
            if rel is None or rel not in self.watched or rel in self.changed:
                out.append(p)
        return sorted(set(out))


def settle_xfails(instance: Instance, parsed: ParsedTests, data: ChannelData | None,
                  pre: PreRun) -> tuple[ParsedTests, list[str]]:
    """Turn each XFAIL of a listed test that did not come from the test itself into a FAILED.

    SWE-bench counts XFAIL as a success; so does this, but only where the xfail is the test's own: pytest
    applied an xfail mark the test carried when collection ended (its own decorator or parameters, its class,
    or a module `pytestmark` its file really sets), pytest itself raised it (an xfail mark with `run=False`,
    unittest's `expectedFailure`), or `pytest.xfail()` was called along a chain of frames that all run code
    the patch did not write (the test, its fixtures, unchanged library helpers). An xfail raised from code the
    patch changed, or a mark added at run time or planted into the test module, is a failure. Returns the
    settled results and a note per test turned.
    """
    if data is None:
        return parsed, []
    listed = {*instance.FAIL_TO_PASS, *instance.PASS_TO_PASS}
    records: dict[str, list[dict]] = {}
    for r in data.of("test"):
        if r.get("xfail") and r.get("outcome") == "skipped":
            records.setdefault(str(r.get("id")), []).append(r)
    statuses, notes = dict(parsed.statuses), []
    for tid, status in parsed.statuses.items():
        if status != XFAIL or tid not in listed:
            continue
        why = _unearned(tid, records.get(tid) or records.get(tid[:1000]) or [], pre)
        if why:
            statuses[tid] = FAILED
            notes.append(f"{tid}: XFAIL not counted: {why}")
    return ParsedTests(statuses, source=parsed.source, ran=parsed.ran), notes


def _unearned(tid: str, records: list[dict], pre: PreRun) -> str | None:
    if not records:
        return "the live result channel did not report where the xfail came from"
    for r in records:
        how, levels = r.get("xh"), r.get("xl") or []
        if how == "pytest":
            continue
        if how == "call":
            bad = [f for f in r.get("xf") or [""] if not pre.vouches(f)]
            if bad:
                return f"pytest.xfail() was called from code the patch wrote ({', '.join(bad[:3])})"
            continue
        if how != "marker" or not levels:
            return "no xfail mark on the test when collection ended (one added at run time does not count)"
        if "function" in levels or "class" in levels:
            continue
        if not pre.module_marks.get(tid.split("::", 1)[0]):
            return "its xfail mark sits on its module, whose file sets no xfail pytestmark"
    return None
