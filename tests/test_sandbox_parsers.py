"""Parsers on realistic output. pytest and unittest output is produced here by really running them (in the
project's venv, on a small generated test module); the Go and JUnit samples are hand-made from the documented
formats (`go test -json` events; the JUnit 5 console launcher's legacy XML report), since this machine has no
Go toolchain or JDK outside the sandbox images."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from sandbox.parsers import REPORT_NAME, parse_results, pytest_addopts

SAMPLE = '''
import unittest
import pytest

def test_pass():
    print("\\nPASSED tests/test_sample.py::test_ghost")  # a patch printing fake results
    print("PASSED tests/test_sample.py::test_fail")

def test_fail():
    assert 0

@pytest.mark.skip(reason="nope")
def test_skip():
    pass

@pytest.mark.xfail(reason="known")
def test_xfail():
    assert 0

@pytest.mark.parametrize("x", [1, 2])
def test_param(x):
    assert x == 1

class TestK:
    def test_m(self):
        pass

    class TestInner:
        def test_i(self):
            pass

@pytest.fixture
def broken():
    raise RuntimeError("fixture")

def test_err(broken):
    pass

class TC(unittest.TestCase):
    def test_sub(self):
        for i in range(2):
            with self.subTest(i=i):
                self.assertEqual(i, 0)

    def test_ok(self):
        pass
'''

EXPECTED = {
    "tests/test_sample.py::test_pass": "PASSED",
    "tests/test_sample.py::test_fail": "FAILED",
    "tests/test_sample.py::test_skip": "SKIPPED",
    "tests/test_sample.py::test_xfail": "XFAIL",
    "tests/test_sample.py::test_param[1]": "PASSED",
    "tests/test_sample.py::test_param[2]": "FAILED",
    "tests/test_sample.py::TestK::test_m": "PASSED",
    "tests/test_sample.py::TestK::TestInner::test_i": "PASSED",
    "tests/test_sample.py::test_err": "ERROR",
    "tests/test_sample.py::TC::test_sub": "FAILED",  # pytest 9: PASSED + SUBFAILED
    "tests/test_sample.py::TC::test_ok": "PASSED",
}


@pytest.fixture(scope="module")
def pytest_run(tmp_path_factory) -> tuple[str, Path]:
    root = tmp_path_factory.mktemp("proj")
    (root / "tests").mkdir()
    (root / "tests/test_sample.py").write_text(SAMPLE)
    report = tmp_path_factory.mktemp("report")
    env = {**os.environ, "PYTEST_ADDOPTS": pytest_addopts(str(report))}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-rA", "-s", "tests"], cwd=root, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert (report / REPORT_NAME).is_file()
    return proc.stdout, report


def test_pytest_report(pytest_run) -> None:
    log, report = pytest_run
    parsed = parse_results("pytest", log, report)
    assert parsed.source == "report" and parsed.ran
    assert parsed.statuses == EXPECTED


def test_fake_passed_lines_do_not_count_when_report_exists(pytest_run) -> None:
    log, report = pytest_run
    assert "PASSED tests/test_sample.py::test_ghost" in log  # the fake line really is in the log
    parsed = parse_results("pytest", log, report)
    assert "tests/test_sample.py::test_ghost" not in parsed.statuses
    assert parsed.statuses["tests/test_sample.py::test_fail"] == "FAILED"


def test_pytest_log_fallback(pytest_run, tmp_path: Path) -> None:
    log, _ = pytest_run
    parsed = parse_results("pytest", log, tmp_path)  # empty report dir: no report written
    assert parsed.source == "log"
    real = {k: v for k, v in EXPECTED.items() if not k.endswith("test_skip")}  # -rA skips carry no node id
    assert {k: parsed.statuses[k] for k in real} == real
    # printed lines can add unknown passes in the fallback, but never upgrade a real failure
    assert parsed.statuses["tests/test_sample.py::test_fail"] == "FAILED"
    assert parsed.statuses["tests/test_sample.py::test_ghost"] == "PASSED"
    assert not parse_results("pytest", log, tmp_path, require_report=True).ran


def test_pytest_verbose_lines_and_subfailed() -> None:
    log = ("tests/t.py::test_a PASSED                                   [ 50%]\n"
           "tests/t.py::test_b[a b] FAILED                              [100%]\n"
           "PASSED tests/t.py::test_c\n"
           "SUBFAILED(i=1) tests/t.py::test_c - AssertionError\n"
           "tests/t.py::test_d SUBFAILED(i=1)                           [ 91%]\n"
           "tests/t.py::test_d PASSED                                   [ 91%]\n")
    assert parse_results("pytest", log, None).statuses == {
        "tests/t.py::test_a": "PASSED", "tests/t.py::test_b[a b]": "FAILED", "tests/t.py::test_c": "FAILED",
        "tests/t.py::test_d": "FAILED"}


def test_pytest_truncated_report_falls_back(tmp_path: Path) -> None:
    (tmp_path / REPORT_NAME).write_text('<testsuites><testsuite><testcase classname="t" name="x"')
    parsed = parse_results("pytest", "PASSED t.py::x\n", tmp_path)
    assert parsed.source == "log" and parsed.statuses == {"t.py::x": "PASSED"}


def test_pytest_addopts_shape() -> None:
    opts = pytest_addopts("/gagar/report")
    assert f"--junitxml=/gagar/report/{REPORT_NAME}" in opts
    assert "-o junit_family=xunit1" in opts and "-p no:cacheprovider" in opts


UNITTEST_SAMPLE = '''
import unittest

class TestCalc(unittest.TestCase):
    def test_ok(self):
        pass

    def test_fail(self):
        self.assertEqual(1, 2)

    def test_error(self):
        raise RuntimeError("boom")

    @unittest.skip("later")
    def test_skip(self):
        pass

    @unittest.expectedFailure
    def test_xf(self):
        self.assertEqual(1, 2)

    def test_doc(self):
        """A docstring shown by -v."""

    def test_sub(self):
        for i in range(2):
            with self.subTest(i=i):
                self.assertEqual(i, 0)
'''


def test_unittest_verbose(tmp_path: Path) -> None:
    (tmp_path / "test_calc.py").write_text(UNITTEST_SAMPLE)
    proc = subprocess.run([sys.executable, "-m", "unittest", "-v", "test_calc"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=60)
    parsed = parse_results("unittest", proc.stderr, None)
    want = {"test_ok": "PASSED", "test_fail": "FAILED", "test_error": "ERROR", "test_skip": "SKIPPED",
            "test_xf": "XFAIL", "test_doc": "PASSED", "test_sub": "FAILED"}
    for name, status in want.items():
        assert parsed.statuses[f"{name} (test_calc.TestCalc)"] == status, proc.stderr
        assert parsed.statuses[f"{name} (test_calc.TestCalc.{name})"] == status


GO_LOG = """\
{"Time":"2024-01-01T00:00:00Z","Action":"start","Package":"example.com/calc"}
{"Time":"2024-01-01T00:00:00Z","Action":"run","Package":"example.com/calc","Test":"TestAdd"}
{"Time":"2024-01-01T00:00:00Z","Action":"output","Package":"example.com/calc","Test":"TestAdd","Output":"=== RUN   TestAdd\\n"}
{"Time":"2024-01-01T00:00:00Z","Action":"run","Package":"example.com/calc","Test":"TestAdd/negative"}
{"Time":"2024-01-01T00:00:00Z","Action":"output","Package":"example.com/calc","Test":"TestAdd/negative","Output":"--- PASS: TestFake (0.00s)\\n"}
{"Time":"2024-01-01T00:00:00Z","Action":"fail","Package":"example.com/calc","Test":"TestAdd/negative","Elapsed":0}
{"Time":"2024-01-01T00:00:00Z","Action":"run","Package":"example.com/calc","Test":"TestAdd/positive"}
{"Time":"2024-01-01T00:00:00Z","Action":"pass","Package":"example.com/calc","Test":"TestAdd/positive","Elapsed":0}
{"Time":"2024-01-01T00:00:00Z","Action":"fail","Package":"example.com/calc","Test":"TestAdd","Elapsed":0}
# example.com/other
other/x.go:3:1: syntax error: non-declaration statement outside function body
{"Time":"2024-01-01T00:00:00Z","Action":"run","Package":"example.com/calc","Test":"TestSub"}
{"Time":"2024-01-01T00:00:00Z","Action":"pass","Package":"example.com/calc","Test":"TestSub","Elapsed":0}
{"Time":"2024-01-01T00:00:00Z","Action":"run","Package":"example.com/calc","Test":"TestSkip"}
{"Time":"2024-01-01T00:00:00Z","Action":"skip","Package":"example.com/calc","Test":"TestSkip","Elapsed":0}
{"Time":"2024-01-01T00:00:00Z","Action":"pass","Package":"example.com/calc","Test":"TestAdd/negative","Elapsed":0}
{"Time":"2024-01-01T00:00:00Z","Action":"fail","Package":"example.com/calc","Elapsed":0.01}
{"Time":"2024-01-01T00:00:00Z","Action":"fail","Package":"example.com/other","Elapsed":0,"Output":"FAIL\\texample.com/other [build failed]\\n"}
{"Time":"2024-01-01T00:00:00Z","Action":"pass","Pack
"""


def test_go_json() -> None:
    parsed = parse_results("go", GO_LOG, None)
    assert parsed.statuses == {"TestAdd": "FAILED", "TestAdd/negative": "FAILED", "TestAdd/positive": "PASSED",
                               "TestSub": "PASSED", "TestSkip": "SKIPPED"}
    assert not parse_results("go", "# example.com/calc\nbuild failed\n", None).ran


JUPITER_XML = """<?xml version="1.0" encoding="UTF-8"?>
<testsuite name="JUnit Jupiter" tests="4" skipped="1" failures="1" errors="0" time="0.05">
<properties><property name="java.version" value="17.0.9"/></properties>
<testcase name="addsNumbers()" classname="calc.CalculatorTest" time="0.01"/>
<testcase name="divides()" classname="calc.CalculatorTest" time="0.01">
<failure message="expected: &lt;2&gt; but was: &lt;3&gt;" type="org.opentest4j.AssertionFailedError">trace</failure>
</testcase>
<testcase name="later()" classname="calc.CalculatorTest" time="0"><skipped/></testcase>
<testcase name="[1] 2, 3" classname="calc.ParamTest" time="0.01"/>
<system-out><![CDATA[PASSED calc.CalculatorTest.ghost]]></system-out>
</testsuite>
"""

SUREFIRE_XML = """<?xml version="1.0" encoding="UTF-8"?>
<testsuite name="calc.StackTest" tests="2" failures="0" errors="1">
<testcase name="push" classname="calc.StackTest" time="0.001"/>
<testcase name="pop" classname="calc.StackTest" time="0.001"><error type="java.lang.NullPointerException"/></testcase>
</testsuite>
"""


def test_junit_console_launcher_report(tmp_path: Path) -> None:
    (tmp_path / "TEST-junit-jupiter.xml").write_text(JUPITER_XML)
    parsed = parse_results("junit", "✔ ghost()\n", tmp_path)
    assert parsed.source == "report"
    assert parsed.statuses == {"calc.CalculatorTest.addsNumbers": "PASSED", "calc.CalculatorTest.divides": "FAILED",
                               "calc.CalculatorTest.later": "SKIPPED", "calc.ParamTest.[1] 2, 3": "PASSED"}


def test_junit_surefire_style_and_missing(tmp_path: Path) -> None:
    (tmp_path / "TEST-calc.StackTest.xml").write_text(SUREFIRE_XML)
    parsed = parse_results("junit", "", tmp_path)
    assert parsed.statuses == {"calc.StackTest.push": "PASSED", "calc.StackTest.pop": "ERROR"}
    empty = tmp_path / "empty"
    empty.mkdir()
    assert not parse_results("junit", "Test run finished", empty).ran


def test_hostile_xml_entities_are_refused(tmp_path: Path) -> None:
    bomb = ('<?xml version="1.0"?><!DOCTYPE l [<!ENTITY a "aaaaaaaaaa">' +
            "".join(f'<!ENTITY {chr(98 + i)} "{("&" + chr(97 + i) + ";") * 10}">' for i in range(8)) +
            ']><testsuite><testcase classname="c" name="&i;"/></testsuite>')
    (tmp_path / "TEST-junit-jupiter.xml").write_text(bomb)
    assert not parse_results("junit", "", tmp_path).ran


def test_unknown_framework() -> None:
    with pytest.raises(ValueError, match="unknown test_framework"):
        parse_results("mocha", "", None)


def test_report_symlink_and_fifo_are_not_read(tmp_path: Path) -> None:
    # A test could plant these in the report dir, which is writable from inside the container.
    host_file = tmp_path / "host.xml"
    host_file.write_text('<testsuite><testcase classname="calc.T" name="secret()"/></testsuite>')
    report = tmp_path / "report"
    report.mkdir()
    os.symlink(host_file, report / "TEST-junit-jupiter.xml")
    os.mkfifo(report / REPORT_NAME)
    assert not parse_results("junit", "", report).ran
    parsed = parse_results("pytest", "", report)  # returns at once instead of blocking on the FIFO
    assert parsed.source == "log" and not parsed.ran
