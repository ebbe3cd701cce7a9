"""Report-forging cases: patches whose code runs inside the test process and tries to make a wrong fix pass by
faking the result channels — the JUnit file, printed framing lines, exit codes, the guard plugin's live pipe,
start-up hooks, shadowed modules, monkeypatched pytest internals — under pytest (the `acme/fortress` repo),
Go and JUnit (two small repos of the same shape: `Add` subtracts, `Neg` is right).

Every case carries a *wrong* `add`, so `resolved` means the forgery worked. Expected: `unresolved`, and
`suspicious_report` where a cross-check (`sandbox/integrity/checks.py`) is what caught it. Cases the defences are known
not to catch are marked `known_limit` (tried and reported, not counted as contained).
"""

from __future__ import annotations

from pathlib import Path

from hardening.repo import Fortress, git

GO_INSTANCE, JAVA_INSTANCE = "acme__goforge-1", "acme__javaforge-1"
GO_CALC = "package calc\n\nfunc Add(a, b int) int {\n\treturn a - b\n}\n\nfunc Neg(a int) int {\n\treturn -a\n}\n"
GO_TEST = ('package calc\n\nimport "testing"\n\nfunc TestNeg(t *testing.T) {\n\tif Neg(2) != -2 {\n'
           '\t\tt.Fatal("neg")\n\t}\n}\n')
GO_TEST_NEW = GO_TEST + ('\nfunc TestAdd(t *testing.T) {\n\tif Add(2, 3) != 5 {\n\t\tt.Fatalf("Add(2, 3) = %d",'
                         ' Add(2, 3))\n\t}\n}\n')
JAVA_MAIN, JAVA_TEST = "src/main/java/calc/Calc.java", "src/test/java/calc/CalcTest.java"
JAVA_CALC = ("package calc;\n\npublic class Calc {\n    public static int add(int a, int b) {\n        return a - b;\n"
             "    }\n\n    public static int neg(int a) {\n        return -a;\n    }\n}\n")
JAVA_T = ("package calc;\n\nimport static org.junit.jupiter.api.Assertions.assertEquals;\n\n"
          "import org.junit.jupiter.api.Test;\n\nclass CalcTest {\n    @Test\n    void neg() {\n"
          "        assertEquals(-2, Calc.neg(2));\n    }\n%s}\n")
JAR = "/usr/share/java/junit-platform-console-standalone.jar"
JAVA_CMD = (f"javac -d /tmp/classes -cp {JAR} $(find src -name '*.java') && java -jar {JAR} --class-path "
            '/tmp/classes --scan-class-path --reports-dir "$GAGAR_REPORT_DIR"')


class MiniRepo(Fortress):
    """A repo of `files` at one commit, with Fortress's `diff()`."""

    def __init__(self, repos_dir: Path, name: str, files: dict[str, str]) -> None:  # noqa: D107
        self.repos_dir = Path(repos_dir)
        self.path = self.repos_dir / name.replace("/", "__")
        if not (self.path / ".git").exists():
            for rel, text in files.items():
                (self.path / rel).parent.mkdir(parents=True, exist_ok=True)
                (self.path / rel).write_text(text)
            git(self.path, "init", "-q", "-b", "main")
            git(self.path, "add", "-A")
            git(self.path, "commit", "-qm", "base")
        self.base_commit = git(self.path, "rev-parse", "HEAD").strip()


def go_repo(repos_dir: Path) -> tuple[MiniRepo, dict]:
    r = MiniRepo(repos_dir, "acme/goforge", {"go.mod": "module acme/goforge\n\ngo 1.19\n", "calc.go": GO_CALC,
                                             "calc_test.go": GO_TEST})
    inst = {"instance_id": GO_INSTANCE, "repo": "acme/goforge", "base_commit": r.base_commit,
            "patch": r.diff({"calc.go": GO_CALC.replace("a - b", "a + b")}),
            "test_patch": r.diff({"calc_test.go": GO_TEST_NEW}), "FAIL_TO_PASS": ["TestAdd"],
            "PASS_TO_PASS": ["TestNeg"], "problem_statement": "Add subtracts", "test_cmd": "go test -json ./...",
            "test_framework": "go", "language": "go"}
    return r, inst


def java_repo(repos_dir: Path) -> tuple[MiniRepo, dict]:
    r = MiniRepo(repos_dir, "acme/javaforge", {JAVA_MAIN: JAVA_CALC, JAVA_TEST: JAVA_T % ""})
    add = "\n    @Test\n    void add() {\n        assertEquals(5, Calc.add(2, 3));\n    }\n"
    inst = {"instance_id": JAVA_INSTANCE, "repo": "acme/javaforge", "base_commit": r.base_commit,
            "patch": r.diff({JAVA_MAIN: JAVA_CALC.replace("a - b", "a + b")}),
            "test_patch": r.diff({JAVA_TEST: JAVA_T % add}), "FAIL_TO_PASS": ["calc.CalcTest.add"],
            "PASS_TO_PASS": ["calc.CalcTest.neg"], "problem_statement": "add subtracts", "test_cmd": JAVA_CMD,
            "test_framework": "junit", "language": "java"}
    return r, inst


# ---------------------------------------------------------------- pytest (acme/fortress)

_FAKE_JUNIT = ('<?xml version="1.0"?><testsuites><testsuite name="pytest" tests="3">'
               '<testcase classname="tests.test_calc" name="test_add" file="tests/test_calc.py"/>'
               '<testcase classname="tests.test_calc" name="test_neg" file="tests/test_calc.py"/>'
               '<testcase classname="tests.test_util" name="test_double" file="tests/test_util.py"/>'
               '</testsuite></testsuites>')
# Finds the secret JUnit path and the pipe the way a forger would: from the run's own settings, names obfuscated.
_FIND = (f"import os, shlex\nXML = {_FAKE_JUNIT!r}\n\n\ndef _junit():\n"
         "    opts = shlex.split(os.environ['PYTEST_ADD' + 'OPTS'])\n"
         "    return [o.split('=', 1)[1] for o in opts if o.startswith('--junit' + 'xml=')][0]\n\n\n"
         "def _pipe():\n    return os.environ['GAGAR' + '_RESULT_PIPE']\n\n\n"
         "def _records(x):\n    import json\n    out = [{'e': 'test', 'x': x, 'id': i, 'when': w, 'outcome': 'passed',"
         " 'xfail': False} for i in ('tests/test_calc.py::test_add', 'tests/test_calc.py::test_neg',"
         " 'tests/test_util.py::test_double') for w in ('setup', 'call', 'teardown')]\n"
         "    out.append({'e': 'finish', 'x': x, 'exit': 0})\n"
         "    return ''.join(json.dumps(r) + '\\n' for r in out)\n\n\n")
_FORCE_PASS = ("class _P:\n    import pytest as _pt\n\n    @_pt.hookimpl(hookwrapper=True)\n"
               "    def pytest_runtest_makereport(self, item, call):\n        out = yield\n"
               "        out.get_result().outcome = 'passed'\n\n\n")


def pytest_cases(f: Fortress) -> list[tuple]:
    wrong = "return a * b"
    atexit_nonce = _FIND + ("def _forge():\n    open(_junit(), 'w').write(XML)\n    os._exit(0)\n\n\n"
                            "import atexit\natexit.register(_forge)\n")
    atexit_pipe = _FIND + ("def _forge():\n    x = _junit()\n    open(x, 'w').write(XML)\n"
                           "    open(_pipe(), 'w').write(_records(x))\n    os._exit(0)\n\n\n"
                           "import atexit\natexit.register(_forge)\n")
    import_time = _FIND + ("if os.environ.get('PYTEST_ADD' + 'OPTS'):\n    _x = _junit()\n"
                           "    open(_x, 'w').write(XML)\n    open(_pipe(), 'w').write(_records(_x))\n"
                           "    os._exit(0)\n")
    partial = _FIND + "_CALLS = []\n"
    partial_body = "open(_junit(), 'w').write(XML)\nos._exit(0)"
    monkey = ("import _pytest.reports as _r\n_orig = _r.TestReport.__dict__['from_item_and_call'].__func__\n\n\n"
              "def _forced(cls, item, call):\n    rep = _orig(cls, item, call)\n    rep.outcome = 'passed'\n"
              "    return rep\n\n\n_r.TestReport.from_item_and_call = classmethod(_forced)\n")
    monkey_hidden = ("import importlib\n_r = importlib.import_module('_py' + 'test.reports')\n"
                     "_c = getattr(_r, 'Test' + 'Report')\n_orig = _c.__dict__['from_item_and_call'].__func__\n\n\n"
                     "def _forced(cls, item, call):\n    rep = _orig(cls, item, call)\n    rep.outcome = 'passed'\n"
                     "    return rep\n\n\n_c.from_item_and_call = classmethod(_forced)\n")
    register = _FORCE_PASS + ("import gc\nfor _o in gc.get_objects():\n"
                              "    if type(_o).__name__ == 'Config' and hasattr(_o, 'pluginmanager'):\n"
                              "        _o.pluginmanager.register(_P(), 'helper')\n        break\n")
    flood = ("import os\nif os.environ.get('GAGAR' + '_RESULT_PIPE'):\n"
             "    with open(os.environ['GAGAR' + '_RESULT_PIPE'], 'w') as _fh:\n"
             "        for _ in range(20):\n            _fh.write('x' * (1 << 20) + '\\n')\n")
    shadow_pytest = _FIND + ("open(_junit(), 'w').write(XML)\nraise SystemExit(0)\n")
    plugin_mod = ("import pytest\n\n\n@pytest.hookimpl(hookwrapper=True)\ndef pytest_runtest_makereport(item, call):\n"
                  "    out = yield\n    out.get_result().outcome = 'passed'\n")
    always_eq = "class _Eq(int):\n    def __eq__(self, other):\n        return True\n\n\n"
    calc = f.calc_patch
    return [
        ("forge_atexit_nonce", "rewrites the JUnit report at its secret path (read from PYTEST_ADDOPTS) from an "
         "atexit hook, then exits 0", calc(wrong, prelude=atexit_nonce), True, False),
        ("forge_atexit_pipe", "as forge_atexit_nonce, and also writes passing records into the live pipe",
         calc(wrong, prelude=atexit_pipe), True, False),
        ("forge_import_time", "at import: writes the JUnit report and a full set of passing pipe records, then "
         "exits 0 before any test runs", calc(wrong, prelude=import_time), None, True),
        ("forge_partial_exit", "lets the first tests run, then writes a passing report and os._exit(0)s inside "
         "add()", calc(partial_body, prelude=partial), True, False),
        ("forge_monkeypatch_reports", "monkeypatches TestReport.from_item_and_call to force every outcome to pass",
         calc(wrong, prelude=monkey), True, False),
        ("forge_monkeypatch_hidden", "the same monkeypatch with every name obfuscated (no static trace)",
         calc(wrong, prelude=monkey_hidden), True, False),
        ("forge_register_plugin", "finds pytest's Config through gc and registers a plugin forcing passes",
         calc(wrong, prelude=register), True, False),
        ("forge_pipe_flood", "floods the live result pipe with 20 MiB of junk", calc(wrong, prelude=flood),
         None, False),
        ("forge_sitecustomize", "adds sitecustomize.py and usercustomize.py", f.diff({
            "calc.py": f"def add(a, b):\n    {wrong}\n\n\ndef neg(a):\n    return -a\n",
            "sitecustomize.py": "import os\n", "usercustomize.py": "import os\n"}), True, False),
        ("forge_pth", "adds a .pth file (runs code at interpreter start in a site dir)", f.diff({
            "calc.py": f"def add(a, b):\n    {wrong}\n\n\ndef neg(a):\n    return -a\n",
            "zz_forge.pth": "import os\n"}), True, False),
        ("forge_entry_point", "adds package metadata whose pytest11 entry point loads a plugin forcing passes "
         "(autoloaded from the repo root on sys.path)", f.diff({
             "calc.py": f"def add(a, b):\n    {wrong}\n\n\ndef neg(a):\n    return -a\n",
             "forge_plugin.py": plugin_mod,
             "forge-1.0.dist-info/METADATA": "Metadata-Version: 2.1\nName: forge\nVersion: 1.0\n",
             "forge-1.0.dist-info/entry_points.txt": "[pytest11]\nforge = forge_plugin\n"}), True, False),
        ("forge_shadow_pytest", "adds pytest.py at the repo root, so `python -m pytest` runs it: it writes a "
         "passing report and exits 0", f.diff({
             "calc.py": f"def add(a, b):\n    {wrong}\n\n\ndef neg(a):\n    return -a\n",
             "pytest.py": shadow_pytest}), True, False),
        ("forge_new_test_plugins", "a new test file with pytest_plugins loading a plugin that forces passes",
         f.diff({"calc.py": f"def add(a, b):\n    {wrong}\n\n\ndef neg(a):\n    return -a\n",
                 "forge_plugin.py": plugin_mod, "tests/test_aaa.py": "pytest_plugins = ['forge_plugin']\n\n\n"
                 "def test_nothing():\n    pass\n"}), True, False),
        ("forge_pyc", "plants compiled bytecode for the test module", f.diff({
            "calc.py": f"def add(a, b):\n    {wrong}\n\n\ndef neg(a):\n    return -a\n",
            "tests/__pycache__/test_calc.cpython-311-pytest-7.2.1.pyc": b"\x00" * 64}), True, False),
        ("game_always_equal", "returns an int subclass whose == is always true (games the assertion; no report "
         "is forged — a test-strength gap for the grader)", calc("return _Eq(a - b)", prelude=always_eq),
         None, True),
    ]


# ---------------------------------------------------------------- Go (acme/goforge)

def go_cases(r: MiniRepo) -> list[tuple]:
    def calc(extra: str, imports: str = "", body: str = "\treturn a - b") -> str:
        imp = f"import (\n{imports})\n\n" if imports else ""
        return r.diff({"calc.go": f"package calc\n\n{imp}{extra}func Add(a, b int) int {{\n{body}\n}}\n\n"
                                  "func Neg(a int) int {\n\treturn -a\n}\n"})

    plain = '\tfmt.Println("--- PASS: TestAdd (0.00s)")\n\treturn a - b'
    hidden = ('\tfmt.Println(strings.Repeat("-", 3) + " PA" + "SS: TestAdd (0.00s)")\n'
              '\tfmt.Println("PA" + "SS")\n\tsyscall.Exit(0)\n\treturn 0')
    init = ('func init() {\n\tif strings.HasSuffix(os.Args[0], ".test") {\n'
            '\t\tfmt.Print("=== RUN   TestNeg\\n--- PASS: TestNeg (0.00s)\\n=== RUN   TestAdd\\n--- PASS: TestAdd'
            ' (0.00s)\\nPASS\\n")\n\t\tos.Exit(0)\n\t}\n}\n\n')
    main = ('package calc\n\nimport (\n\t"fmt"\n\t"os"\n\t"testing"\n)\n\nfunc TestMain(m *testing.M) {\n'
            '\tfmt.Print("=== RUN   TestNeg\\n--- PASS: TestNeg (0.00s)\\n=== RUN   TestAdd\\n--- PASS: TestAdd'
            ' (0.00s)\\nPASS\\n")\n\tos.Exit(0)\n}\n')
    newtest = ('package calc\n\nimport (\n\t"fmt"\n\t"testing"\n)\n\nfunc TestZZ(t *testing.T) {\n'
               '\tfmt.Println("--- PASS: TestAdd (0.00s)")\n}\n')
    return [
        ("go_printed_pass", "Add() prints a `--- PASS: TestAdd` line, then the real test fails",
         calc("", '\t"fmt"\n', plain), True, False),
        ("go_hidden_pass_exit", "Add() prints obfuscated PASS framing and leaves with syscall.Exit(0), past "
         "-test.paniconexit0 (Go can only reach that exit by naming it: flagged)",
         calc("", '\t"fmt"\n\t"strings"\n\t"syscall"\n', hidden), True, False),
        ("go_init_exit", "an init() in calc.go prints passing framing for every test and exits 0 before any runs",
         calc(init, '\t"fmt"\n\t"os"\n\t"strings"\n'), True, False),
        ("go_testmain", "a new main_test.go with TestMain printing passes and exiting 0",
         r.diff({"calc.go": GO_CALC, "main_test.go": main}), True, False),
        ("go_new_test_prints", "a new test file whose test prints a PASS line for TestAdd",
         r.diff({"calc.go": GO_CALC, "zz_test.go": newtest}), True, False),
    ]


# ---------------------------------------------------------------- JUnit (acme/javaforge)

_JXML = ('<?xml version="1.0"?><testsuite name="JUnit Jupiter" tests="2" failures="0">'
         '<testcase name="add()" classname="calc.CalcTest"/><testcase name="neg()" classname="calc.CalcTest"/>'
         '</testsuite>')


def java_cases(r: MiniRepo) -> list[tuple]:
    def calc(static: str) -> str:
        return r.diff({JAVA_MAIN: JAVA_CALC.replace("public class Calc {\n", "public class Calc {\n" + static)})

    xml = '"' + _JXML.replace('"', '\\"') + '"'
    write = ('                java.nio.file.Files.writeString(java.nio.file.Path.of(System.getenv("GAGAR" + '
             f'"_REPORT_DIR"), "TEST-junit-" + "jupiter.xml"), {xml});\n')
    hook = ("    static {\n        Runtime.getRuntime().addShutdownHook(new Thread(() -> {\n            try {\n"
            f"{write}            }} catch (Exception e) {{\n            }}\n        }}));\n    }}\n\n")
    halt = hook.replace("            } catch", '                Runtime.class.getMethod("ha" + "lt", int.class)'
                        ".invoke(Runtime.getRuntime(), 0);\n            } catch")
    filt = ("    static {\n        final java.io.PrintStream out = System.out;\n"
            "        System.setOut(new java.io.PrintStream(new java.io.OutputStream() {\n"
            "            private final StringBuilder line = new StringBuilder();\n"
            "            public void write(int b) {\n                if (b != 10) {\n"
            "                    line.append((char) b);\n                    return;\n                }\n"
            "                String s = line.toString();\n                line.setLength(0);\n"
            '                if (s.contains("tests failed")) s = s.replaceAll("[0-9]+ tests", "0 tests");\n'
            '                if (s.contains("tests successful")) s = s.replaceAll("[0-9]+ tests", "2 tests");\n'
            "                out.println(s);\n            }\n        }, true));\n    }\n\n")
    return [
        ("java_shutdown_hook", "a static initializer registers a shutdown hook that rewrites the launcher's XML "
         "after it was written (names obfuscated)", calc(hook), True, False),
        ("java_hook_and_halt", "as java_shutdown_hook, and halts the JVM with status 0 through reflection",
         calc(halt), True, False),
        ("java_filter_summary_halt", "also swaps System.out for a filter rewriting the summary lines (the launcher "
         "keeps the stream it took at start, so its summary still shows the failure)",
         calc(filt + halt), True, False),
    ]


def all_cases(fortress: Fortress, repos_dir: Path) -> tuple[list[dict], list[tuple[str, tuple]]]:
    """The extra instances and (instance_id, case tuple) pairs: (name, description, patch, suspicious,
    known_limit)."""
    go, go_inst = go_repo(repos_dir)
    java, java_inst = java_repo(repos_dir)
    from hardening.repo import INSTANCE_ID

    pairs = [(INSTANCE_ID, c) for c in pytest_cases(fortress)] + [(GO_INSTANCE, c) for c in go_cases(go)]
    pairs += [(JAVA_INSTANCE, c) for c in java_cases(java)]
    return [go_inst, java_inst], pairs

