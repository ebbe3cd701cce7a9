"""Issue 36 (reward forging, round 4), the parts that need no Docker: the validator and the applier reading one
patch, the cap on what applying writes, the pytest configuration the restore step protects, shadowing modules,
what the host judges after a run (conftest paths, files changed during the run, where an XFAIL came from), and
the guard plugin itself under the host's pytest (pytest 9; the Docker tests run it under the image's 7.2)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import zlib
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hardening import forging4
from hardening.repo import git
from sandbox import apply as applier
from sandbox.apply import apply_patch, restore_task_tests
from sandbox.integrity import gitsafe, pytestcfg, treefs
from sandbox.integrity.channel import GUEST_DIR, ChannelData, parse_records
from sandbox.integrity.checks import static_findings
from sandbox.integrity.prerun import PreRun, settle_xfails
from sandbox.parsers.base import FAILED, PASSED, XFAIL, ParsedTests
from sandbox.patchcheck import PatchRejected, validate_patch
from sandbox.records import Instance

F2P = "tests/test_calc.py::test_add"


@pytest.fixture
def bastion(tmp_path: Path):
    return forging4.bastion(tmp_path / "repos")


def _tree(r, tmp_path: Path, name: str = "tree") -> Path:
    tree = tmp_path / name
    gitsafe.export_commit(r.path, r.base_commit, tree)
    return tree


# ---------------------------------------------------------------- one patch for the validator and the appliers


def test_sections_in_other_diff_formats_are_refused(bastion) -> None:
    unified = bastion.diff({"calc.py": forging4.FIX})
    context = ("*** a/tests/conftest.py\n--- b/tests/conftest.py\n***************\n*** 0 ****\n--- 1 ----\n"
               "+ import os\n")
    for extra, what in [(context, "context-diff"), ("3c3\n< x\n---\n> y\n", "normal-diff"),
                        ("2a\nimport os\n.\n", "ed-script"), ("1,2d\n", "ed-script"), ("5s/a/b/\n", "ed-script")]:
        with pytest.raises(PatchRejected, match=what):
            validate_patch(unified + extra, bastion.path)
    # Prose around a unified diff (a commit message, git format-patch) is still fine.
    info = validate_patch("Fix add.\n\nIt subtracted; 3 apples.\n---\n" + unified, bastion.path)
    assert info.paths == ["calc.py"]


def test_the_tree_decides_what_a_patch_touched(bastion, tmp_path: Path, monkeypatch) -> None:
    """Were the validator to miss a context-diff section, GNU patch would create the conftest.py; the
    tree's changes show the stray path and the patch is rejected, the tree reset."""
    case = next(c for c in forging4.cases(bastion) if c.name == "applier_context_conftest")
    monkeypatch.setattr("sandbox.patchcheck._FOREIGN", ())
    tree = _tree(bastion, tmp_path)
    with pytest.raises(PatchRejected, match="tests/conftest.py, which the patch's unified diff does not name"):
        apply_patch(tree, case.patch, base_commit=bastion.base_commit, fresh=True)
    assert not (tree / "tests" / "conftest.py").exists()
    # Without that check, the file GNU patch wrote would stay (this is what the check closes).
    monkeypatch.setattr(applier, "_unexpected", lambda *a: [])
    out = apply_patch(tree, case.patch, base_commit=bastion.base_commit)
    assert out.method == "patch --fuzz" and (tree / "tests" / "conftest.py").is_file()
    assert "tests/conftest.py" in out.changed_paths  # and the restore step would now revert it


def test_what_applying_writes_is_capped(bastion, tmp_path: Path) -> None:
    bomb = forging4.binary_literal("big.bin", 4 << 20)
    with pytest.raises(PatchRejected, match="inflate to 4.0 MiB, over the 1.0 MiB cap"):
        validate_patch(bomb, bastion.path, max_expand_bytes=1 << 20)
    assert validate_patch(bomb, bastion.path, max_expand_bytes=8 << 20).expanded_bytes == 4 << 20
    # While writing: an applier dies at RLIMIT_FSIZE (SIGXFSZ), whatever the patch declared.
    tree = _tree(bastion, tmp_path)
    patch_file = applier._write_temp(bomb.encode())
    try:
        rc, _ = applier._try(tree, "git apply", patch_file, 1 << 20)
    finally:
        os.unlink(patch_file)
    assert rc != 0 and (tree / "big.bin").stat().st_size <= 1 << 20
    # A delta declares the size of its result in its header: read from the first bytes of the hunk.
    header = bytes([0x05, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x01])  # source 5 bytes, result 2**42 bytes
    delta = ("diff --git a/calc.py b/calc.py\nindex " + "1" * 40 + ".." + "2" * 40 + "\nGIT binary patch\n"
             f"delta {len(header)}\n" + forging4.git_base85(zlib.compress(header)) + "\n")
    with pytest.raises(PatchRejected, match="inflate to 4194304.0 MiB"):
        validate_patch(delta, bastion.path)


def test_a_real_git_delta_is_measured(tmp_path: Path) -> None:
    repo = tmp_path / "bin"
    repo.mkdir()
    data = bytes((i * 7919 + i // 3) % 251 for i in range(300_000))
    (repo / "data.bin").write_bytes(data)
    git(repo, "init", "-q")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "base")
    (repo / "data.bin").write_bytes(data[:1000] + b"changed" + data[1000:])
    patch = gitsafe.git("diff", "--binary", "--no-ext-diff", cwd=repo)
    assert "\ndelta " in patch
    info = validate_patch(patch, repo)
    assert info.has_binary and len(data) < info.expanded_bytes < 2 * len(data) + 100_000


def test_tree_snapshots_and_bounded_reads(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("x" * 100)
    (tmp_path / "b.txt").write_text("b")
    before = treefs.snapshot(tmp_path)
    os.chmod(tmp_path / "a.txt", 0o755)
    (tmp_path / "b.txt").unlink()
    os.symlink("a.txt", tmp_path / "b.txt")  # a file swapped for a symlink
    (tmp_path / "pkg").mkdir()
    os.mkfifo(tmp_path / "pkg" / "fifo")
    got = {(c.path, c.change, c.kind) for c in treefs.changes(before, treefs.snapshot(tmp_path))}
    assert got == {("a.txt", "modified", "file"), ("b.txt", "modified", "link"), ("pkg", "added", "dir"),
                   ("pkg/fifo", "added", "other")}
    assert treefs.read_capped(tmp_path / "a.txt", 100) == b"x" * 100
    assert treefs.read_capped(tmp_path / "a.txt", 99) is None  # over the cap: not read at all
    assert treefs.read_capped(tmp_path / "b.txt", 1000) is None  # a symlink is never followed
    assert treefs.read_capped(tmp_path / "pkg" / "fifo", 1000) is None  # nor a FIFO opened for long


# ---------------------------------------------------------------- pytest configuration


def _touched(r, tmp_path: Path, files: dict, symlinks: dict | None = None, name: str = "t") -> list[str]:
    tree = _tree(r, tmp_path, name)
    out = apply_patch(tree, r.diff(files, symlinks), base_commit=r.base_commit, fresh=True)
    return restore_task_tests(tree, base_commit=r.base_commit, test_patch="", model_patch_info=out.info,
                              changed=out.changed_paths, config_links=out.config_links).touched


def test_every_file_pytest_reads_is_protected(bastion, tmp_path: Path) -> None:
    fix = {"calc.py": forging4.FIX}
    for name in (".pytest.ini", "pytest.ini", "pytest.toml", ".pytest.toml", "tox.ini", "tests/conftest.py"):
        assert _touched(bastion, tmp_path, {**fix, name: "[pytest]\n"}, name=name.replace("/", "_")) == [name]
    assert _touched(bastion, tmp_path, {**fix, "cfg/x.toml": "[tool.pytest.ini_options]\n"},
                    {"pyproject.toml": "cfg/x.toml"}, name="link") == ["cfg/x.toml", "pyproject.toml"]  # and its target
    header = "[metadata]\nname = x\n\n[tool:pytest]#]\naddopts = -p evil\n"
    assert _touched(bastion, tmp_path, {**fix, "setup.cfg": header}, name="hdr") == ["setup.cfg"]
    # Honest edits to the other sections stay.
    assert _touched(bastion, tmp_path, {**fix, "setup.cfg": "[metadata]\nname = x\n"}, name="meta") == []
    assert _touched(bastion, tmp_path, {**fix, "pyproject.toml": "[project]\nname = 'x'\n"}, name="proj") == []
    big = "[metadata]\n" + "# padding\n" * (pytestcfg.MAX_CONFIG_BYTES // 10)
    assert _touched(bastion, tmp_path, {**fix, "setup.cfg": big}, name="big") == ["setup.cfg"]  # not read


def test_a_config_symlink_the_base_had_protects_its_target(tmp_path: Path) -> None:
    r = forging4.MiniRepo(tmp_path / "repos", "acme/linked", {"calc.py": forging4.CALC, "conf/pytest.cfg": "[x]\n"})
    os.symlink("conf/pytest.cfg", r.path / "setup.cfg")
    git(r.path, "add", "-A")
    git(r.path, "commit", "-qm", "link")
    r.base_commit = git(r.path, "rev-parse", "HEAD").strip()
    assert _touched(r, tmp_path, {"conf/pytest.cfg": "[tool:pytest]\naddopts = -p evil\n"}) == ["conf/pytest.cfg"]


_INI_PIECES = ["[tool:pytest]", "[tool:pytest]#]", "[metadata]", " [tool:pytest]", "addopts = -p x",
               "  -p y", "# c", "; c", "name = a", "[pytest]", "x:y", "[tool:pytest];", ""]


@settings(max_examples=500, deadline=None)
@given(st.lists(st.sampled_from([*_INI_PIECES, "[]", "k: v", "a=b:c", "a:b=c", "=x", " x", "[metadata] ; c"]),
                max_size=8))
def test_the_ini_parse_check_agrees_with_iniconfig(lines: list[str]) -> None:
    """`pytest_view` counts a file pytest refuses apart from one it reads (a repeated section, a stray line in a
    section it never reads): its restated rules must give iniconfig's verdict. Found by the property test below,
    which failed on `[metadata]`, `# c`, `[metadata]`, `[tool:pytest]` with the second `[metadata]` edited."""
    import iniconfig

    text = "\n".join(lines) + "\n"
    try:
        iniconfig.IniConfig("setup.cfg", data=text)
        parses = True
    except iniconfig.ParseError:
        parses = False
    assert pytestcfg._ini_parses(text) == parses


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(_INI_PIECES), min_size=1, max_size=8), st.integers(0, 7),
       st.sampled_from(_INI_PIECES))
def test_the_ini_view_sees_every_change_pytests_parser_sees(lines: list[str], at: int, new: str) -> None:
    """Whenever an edit leaves iniconfig (the parser pytest uses) reading a [tool:pytest] section it did not
    read before, `pytest_view` changes too: no header trick hides a change from the restore step."""
    import iniconfig

    def pytest_reads(text: str):
        try:
            ini = iniconfig.IniConfig("setup.cfg", data=text)
        except iniconfig.ParseError:
            return "error"  # pytest refuses to start: not a way to pass
        return dict(ini["tool:pytest"].items()) if "tool:pytest" in ini.sections else None

    before = "\n".join(lines) + "\n"
    edited = list(lines)
    edited[at % len(edited)] = new
    after = "\n".join(edited) + "\n"
    now = pytest_reads(after)
    if now not in ("error", None) and now != pytest_reads(before):
        assert pytestcfg.pytest_view("setup.cfg", before.encode()) != pytestcfg.pytest_view("setup.cfg",
                                                                                             after.encode())


# ---------------------------------------------------------------- shadowing


def test_modules_that_shadow_are_flagged_whatever_their_file_type(bastion, tmp_path: Path) -> None:
    def found(files: dict, symlinks: dict | None = None, name: str = "t") -> str:
        tree = _tree(bastion, tmp_path, name)
        patch = bastion.diff(files, symlinks)
        out = apply_patch(tree, patch, base_commit=bastion.base_commit, fresh=True)
        return " | ".join(static_findings(patch, out.info, set(), tree, out.changes))

    assert "tests/calc.py (file), which shadows `calc`" in found({"tests/calc.py": forging4.FIX}, name="a")
    assert "tests/calc (dir)" in found({"tests/calc/__init__.py": forging4.FIX}, name="b")
    assert "pytest (link)" in found({"pt/__init__.py": "x = 1\n"}, {"pytest": "pt"}, name="c")
    assert "shadows `json`" in found({"tests/json.py": "x = 1\n"}, name="d")
    assert "tests/calc.cpython-311-x86_64-linux-gnu.so" in found(
        {"tests/calc.cpython-311-x86_64-linux-gnu.so": b"\x7fELF"}, name="e")
    assert "src/util.py" in found({"src/util.py": forging4.UTIL}, name="f")  # src/ is on the import path
    # Not on the tests' import path, or not a module: nothing.
    assert found({"docs/calc.py": "x = 1\n"}, name="g") == ""  # no tests or conftest there
    assert found({"pkg/__init__.py": "", "pkg/calc.py": "x = 1\n"}, name="h") == ""  # pkg.calc, not calc
    assert found({"tests/test_more.py": "def test_x():\n    pass\n"}, name="i") == ""
    assert found({"cmd/main.go": "package main\n"}, name="j") == ""  # a namespace dir never wins an import


# ---------------------------------------------------------------- judged after the run


def _pre(r, tmp_path: Path, files: dict) -> PreRun:
    tree = _tree(r, tmp_path, "pre")
    out = apply_patch(tree, r.diff(files), base_commit=r.base_commit, fresh=True)
    inst = Instance.from_dict(forging4.instances(r)[0])
    return PreRun.take(inst, tree, changed=out.changed_paths, reverted=[],
                       test_paths={"tests/test_calc.py", "tests/test_util.py"})


def test_what_vouches_for_code(bastion, tmp_path: Path) -> None:
    pre = _pre(bastion, tmp_path, {"calc.py": forging4.FIX, "helper.py": "x = 1\n"})
    assert pre.vouches("/testbed/util.py") and pre.vouches("/testbed/tests/test_calc.py")
    assert not pre.vouches("/testbed/calc.py") and not pre.vouches("/testbed/helper.py")  # the patch's
    assert not pre.vouches("/testbed/new_at_run_time.py") and not pre.vouches("/tmp/x.py")
    assert pre.vouches("/usr/lib/python3/dist-packages/_pytest/python.py") and pre.vouches("<frozen os>")
    assert not pre.vouches("<string>") and not pre.vouches("")
    assert pre.foreign_conftests(["/testbed/conftest.py", "/usr/lib/x/conftest.py"]) == []
    assert pre.foreign_conftests(["/testbed/tests/conftest.py", "/tmp/conftest.py"]) == [
        "/testbed/tests/conftest.py", "/tmp/conftest.py"]


def test_files_changed_while_the_tests_ran(bastion, tmp_path: Path) -> None:
    pre = _pre(bastion, tmp_path, {"calc.py": forging4.FIX})
    assert pre.changed_during_run() == []
    conftest = pre.tree / "conftest.py"
    st_before = conftest.stat()
    conftest.write_text(forging4.ROOT_CONFTEST)  # same bytes, and the old mtime put back: ctime still moves
    os.utime(conftest, ns=(st_before.st_atime_ns, st_before.st_mtime_ns))
    (pre.tree / "tests" / "pytest.ini").write_text("[pytest]\n")
    assert pre.changed_during_run() == ["conftest.py", "tests/pytest.ini"]


def _channel(*records: dict) -> ChannelData:
    return ChannelData(records=[{"e": "test", "when": "call", "outcome": "skipped", "xfail": True, **r}
                                for r in records])


def test_an_xfail_counts_only_when_it_is_the_tests_own(bastion, tmp_path: Path) -> None:
    pre = _pre(bastion, tmp_path, {"calc.py": forging4.FIX})
    inst = Instance.from_dict(forging4.instances(bastion)[0])
    parsed = ParsedTests({F2P: XFAIL, "tests/test_calc.py::test_neg": PASSED}, source="report")

    def settle(**rec) -> str:
        return settle_xfails(inst, parsed, _channel({"id": F2P, **rec}), pre)[0].statuses[F2P]

    assert settle(xh="call", xf=["/testbed/tests/test_calc.py", "/testbed/calc.py"]) == FAILED  # patched code
    assert settle(xh="call", xf=["/testbed/tests/test_calc.py", "/testbed/util.py"]) == XFAIL  # unchanged helper
    assert settle(xh="marker", xl=["function"]) == XFAIL and settle(xh="marker", xl=["class"]) == XFAIL
    assert settle(xh="marker", xl=[]) == FAILED  # a mark added at run time
    assert settle(xh="marker", xl=["module"]) == FAILED  # the file sets no xfail pytestmark: planted
    assert settle(xh="pytest", xl=[]) == XFAIL  # pytest's own (run=False, unittest's expectedFailure)
    assert settle_xfails(inst, parsed, ChannelData(), pre)[0].statuses[F2P] == FAILED  # unexplained
    (pre.tree / "tests" / "test_calc.py").write_text("import pytest\npytestmark = pytest.mark.xfail\n")
    pre2 = PreRun.take(inst, pre.tree, changed=[], reverted=[], test_paths={"tests/test_calc.py"})
    assert settle_xfails(inst, parsed, _channel({"id": F2P, "xh": "marker", "xl": ["module"]}),
                         pre2)[0].statuses[F2P] == XFAIL


# ---------------------------------------------------------------- the guard plugin under the host's pytest

_HONEST = {
    "conftest.py": ("import pytest\n\n\nclass Helper:\n    def pytest_runtest_setup(self, item):\n        pass\n\n\n"
                    "def pytest_configure(config):\n    config.pluginmanager.register(Helper(), 'helper')\n"),
    "tests/test_h.py": ("import unittest\n\nimport pytest\n\n\ndef test_ok():\n    assert True\n\n\n"
                        "@pytest.mark.xfail\ndef test_marked():\n    assert False\n\n\n"
                        "@pytest.mark.parametrize('v', [1, pytest.param(2, marks=pytest.mark.xfail)])\n"
                        "def test_p(v):\n    assert v == 1\n\n\ndef test_own_call():\n    pytest.xfail('own')\n\n\n"
                        "class TestK:\n    def test_m(self):\n        assert True\n\n\n"
                        "class TestU(unittest.TestCase):\n    @unittest.expectedFailure\n    def test_e(self):\n"
                        "        assert False\n"),
}
_FIND = ("import gc\n\n\ndef pm():\n    for o in gc.get_objects():\n"
         "        if type(o).__name__ == 'Config' and hasattr(o, 'pluginmanager'):\n            return o.pluginmanager\n\n\n")
_FORGERS = {
    "register": _FIND + "class P:\n    def pytest_runtest_setup(self, item):\n        pass\n\n\npm().register(P())\n",
    "bypass": _FIND + ("import pluggy\n\n\nclass P:\n    @pluggy.HookimplMarker('pytest')\n"
                       "    def pytest_runtest_setup(self, item):\n        pass\n\n\n"
                       "pluggy.PluginManager.register(pm(), P())\n"),
    "collect": ("import _pytest.python as p\n_o = p.PyCollector.collect\n\n\ndef c(self):\n    return _o(self)\n\n\n"
                "p.PyCollector.collect = c\n"),
    "xfail": "import pytest\n\n\ndef add(a, b):\n    pytest.xfail('x')\n",
}


def _guarded_run(root: Path, files: dict[str, str]) -> ChannelData:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    fifo, xml = root / "pipe", str(root / "j.xml")
    os.mkfifo(fifo)
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()))
    reader.start()
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST")}
    env.update(GAGAR_RESULT_PIPE=str(fifo), PYTHONPATH=str(GUEST_DIR), PYTEST_ADDOPTS=f"--junitxml={xml}")
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "gagar_pytest_guard", "-p", "no:cacheprovider",
                           "-q", "tests"], cwd=root, env=env, capture_output=True, text=True, timeout=300)
    reader.join(60)
    assert "Traceback" not in proc.stdout + proc.stderr, proc.stdout + proc.stderr
    return parse_records(b"".join(got), xml)


def test_the_guard_passes_an_honest_suite(tmp_path: Path) -> None:
    data = _guarded_run(tmp_path, _HONEST)
    assert data.of("tamper") == [] and data.of("finish")[0]["exit"] == 0
    assert [r["path"] for r in data.of("conftest")] == [str(tmp_path / "conftest.py")]
    how = {r["id"].split("::", 1)[1]: (r["xh"], r.get("xl")) for r in data.of("test") if r.get("xh")}
    assert how == {"test_marked": ("marker", ["function"]), "test_p[2]": ("marker", ["function"]),
                   "test_own_call": ("call", []), "TestU::test_e": ("pytest", [])}
    own = next(r for r in data.of("test") if r.get("xh") == "call")
    assert own["xf"] == [str(tmp_path / "tests" / "test_h.py")]


@pytest.mark.parametrize("forger", sorted(_FORGERS))
def test_the_guard_reports_each_forger(forger: str, tmp_path: Path) -> None:
    test = "from lib import *  # noqa\n\n\ndef test_add():\n    assert True\n"
    if forger == "xfail":
        test = "from lib import add\n\n\ndef test_add():\n    add(1, 2)\n"
    data = _guarded_run(tmp_path, {"lib.py": _FORGERS[forger], "tests/conftest.py": "import sys\n"
                                   f"sys.path.insert(0, {str(tmp_path)!r})\n", "tests/test_f.py": test})
    what = " ".join(w for r in data.of("tamper") for w in r["what"])
    if forger == "xfail":
        rec = next(r for r in data.of("test") if r.get("xh"))
        assert rec["xh"] == "call" and rec["xf"][-1] == str(tmp_path / "lib.py")
    elif forger == "collect":
        assert "_pytest.python.PyCollector.collect" in what
    elif forger == "register":
        assert "a plugin registered by code outside pytest" in what
        assert str(tmp_path / "lib.py") in json.dumps(data.of("tamper"))
    else:
        assert "hook pytest_runtest_setup implemented by an unannounced plugin" in what
