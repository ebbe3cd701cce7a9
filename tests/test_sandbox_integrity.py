"""Report integrity (issue 11, part B): a forged report needs more than one channel, and disagreements set
`suspicious_report`; evaluation calls in one process never remove each other's containers.

Unit tests drive `sandbox.integrity.checks` with hand-made channel data; the Docker tests run real forgers (patch
code inside the pytest process) through `evaluate_predictions`. The full forging corpus (pytest, Go, JUnit)
runs in tests/test_hardening_corpus.py.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest
from sandbox_fixtures import CalcTask, leftover_containers, require_docker

from sandbox import container as ctr
from sandbox.config import SandboxConfig
from sandbox.integrity.channel import ChannelData, ReportChannel, parse_records
from sandbox.integrity.checks import check, static_findings, undefined_tests
from sandbox.parsers.base import PASSED, ParsedTests
from sandbox.patchcheck import validate_patch
from sandbox.records import Instance, Prediction

JUNIT = "/gagar/report/n/pytest-junit.xml"
XML_PASS = ('<?xml version="1.0"?><testsuites><testsuite name="pytest">'
            '<testcase classname="tests.test_calc" name="test_add" file="tests/test_calc.py"/>'
            '<testcase classname="tests.test_calc" name="test_neg" file="tests/test_calc.py"/>'
            '</testsuite></testsuites>')


@pytest.fixture
def task(tmp_path: Path) -> CalcTask:
    return CalcTask(tmp_path)


def _records(*recs: dict) -> ChannelData:
    raw = b"".join(json.dumps({"x": JUNIT, **r}).encode() + b"\n" for r in recs)
    return parse_records(raw, JUNIT)


def _honest(add: str = "passed") -> ChannelData:
    recs = [{"e": "start"}]
    for tid, outcome in (("tests/test_calc.py::test_neg", "passed"), ("tests/test_calc.py::test_add", add)):
        recs += [{"e": "test", "id": tid, "when": w, "outcome": outcome if w == "call" else "passed"}
                 for w in ("setup", "call", "teardown")]
    return _records(*recs, {"e": "finish", "exit": 0 if add == "passed" else 1})


def _check(task: CalcTask, report: Path, data: ChannelData | None, **kw) -> list[str]:
    inst = Instance.from_dict(task.instance)
    parsed = ParsedTests({"tests/test_calc.py::test_add": PASSED, "tests/test_calc.py::test_neg": PASSED},
                         source="report")
    return check(inst, parsed, report_dir=report, output=kw.get("output", ""), exit_code=kw.get("exit_code", 0),
                 channel=data, undefined=kw.get("undefined", set()), static=[])


def test_cross_checks_agree_on_an_honest_run_and_catch_each_disagreement(task: CalcTask, tmp_path: Path) -> None:
    report = tmp_path / "r"
    report.mkdir()
    (report / "pytest-junit.xml").write_text(XML_PASS)
    assert _check(task, report, _honest()) == []
    # The report was rewritten after the run: the live channel saw test_add fail, pytest exited 1.
    found = " | ".join(_check(task, report, _honest(add="failed")))
    assert "live result channel did not see: tests/test_calc.py::test_add" in found and "exited with" in found
    assert "guard plugin" in " ".join(_check(task, report, _records()))  # pytest ran without the plugin
    no_finish = _records(*[r for r in _honest().records if r["e"] != "finish"])
    assert "never finished" in " ".join(_check(task, report, no_finish))
    tamper = _records(*_honest().records, {"e": "tamper", "what": ["_pytest.runner.call_and_report"]})
    assert "call_and_report" in " ".join(_check(task, report, tamper))
    junk = parse_records(b"garbage\n" + b"".join(json.dumps(r).encode() + b"\n" for r in _honest().records), JUNIT)
    assert "foreign lines" in " ".join(_check(task, report, junk))
    # Another session's records (a nested pytest with its own settings) are neither trusted nor held against it.
    other = parse_records(json.dumps({"e": "test", "x": "/elsewhere.xml", "id": "t", "when": "call",
                                      "outcome": "failed"}).encode() + b"\n", JUNIT)
    assert other.other_sessions == 1 and other.records == []
    (report / "pytest-junit.xml").write_text(XML_PASS.replace("</testsuite>", '<testcase classname="tests.test_'
                                                              'calc" name="test_add" file="tests/test_calc.py"/>'
                                                              "</testsuite>"))
    assert "more than once: tests/test_calc.py::test_add" in " ".join(_check(task, report, _honest()))
    ghosts = _check(task, report, None, undefined={"tests/test_calc.py::test_add"})
    assert any("no test file defines" in g for g in ghosts)


def test_go_and_junit_cross_checks() -> None:
    from sandbox.integrity.checks import _check_go, _check_junit

    inst = Instance.from_dict({"instance_id": "g", "repo": "a/g", "base_commit": "x", "FAIL_TO_PASS": ["TestAdd"],
                               "PASS_TO_PASS": [], "test_framework": "go"})
    ev = lambda a, t: json.dumps({"Action": a, "Package": "p", "Test": t})  # noqa: E731
    honest = "\n".join([ev("run", "TestAdd"), ev("pass", "TestAdd")])
    passed = ParsedTests({"TestAdd": PASSED}, source="log")
    assert _check_go(inst, passed, honest, 0) == []
    assert "more than once" in " ".join(_check_go(inst, passed, honest + "\n" + ev("fail", "TestAdd"), 1))
    assert "never started" in " ".join(_check_go(inst, passed, ev("pass", "TestAdd"), 0))
    assert "exited 1" in " ".join(_check_go(inst, passed, honest, 1))
    assert _check_go(inst, passed, honest + "\nFAIL\tp/b [build failed]\n", 2) == []  # Go 1.19: text only
    jinst = Instance.from_dict({"instance_id": "j", "repo": "a/j", "base_commit": "x", "FAIL_TO_PASS": ["c.T.add"],
                                "PASS_TO_PASS": [], "test_framework": "junit",
                                "test_cmd": "java -jar /j/junit-platform-console-standalone.jar"})
    summary = "[         1 tests successful      ]\n[         1 tests failed          ]\n"
    ok = ParsedTests({"c.T.add": PASSED}, source="report")
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        Path(d, "TEST-junit-jupiter.xml").write_text('<testsuite><testcase classname="c.T" name="add()"/>'
                                                     '<testcase classname="c.T" name="neg()"/></testsuite>')
        found = " | ".join(_check_junit(jinst, ok, Path(d), summary, 1, jinst.test_cmd))
        assert "counted 1 failed" in found and "2 passing tests" in found and "exited 1" in found
        assert "no summary" in " ".join(_check_junit(jinst, ok, Path(d), "", 0, jinst.test_cmd))
        honest = summary.replace("1 tests successful", "2 tests successful").replace("1 tests failed", "0 tests failed")
        assert _check_junit(jinst, ok, Path(d), honest, 0, jinst.test_cmd) == []


def test_static_findings(task: CalcTask) -> None:
    def found(files: dict) -> str:
        patch = task.diff(files)
        info = validate_patch(patch, task.repo, max_bytes=1 << 20)
        return " | ".join(static_findings(patch, info, {"tests/test_calc.py"}, task.repo))

    assert found({"calc.py": "def add(a, b):\n    return a + b\n\n\ndef neg(a):\n    return -a\n"}) == ""
    assert "start-up hook" in found({"sitecustomize.py": "x = 1\n"})
    assert "start-up hook" in found({"a.pth": "import os\n"})
    assert "entry points" in found({"x-1.dist-info/entry_points.txt": "[pytest11]\nx = y\n"})
    assert "shadows `json`" in found({"json.py": "x = 1\n"})
    assert found({"pkg/json.py": "x = 1\n"}) == ""  # not top level: shadows nothing
    assert "report channel" in found({"calc.py": "import os\nD = os.environ['GAGAR_REPORT_DIR']\n"})
    assert "registers pytest plugins" in found({"tests/test_new.py": "pytest_plugins = ['x']\n"})
    assert "internals" in found({"calc.py": "from _pytest.reports import TestReport\n"})
    assert "TestMain" in found({"m_test.go": "package m\n\nfunc TestMain(m *testing.M) {}\n"})
    assert "init()" in found({"m.go": "package m\n\nfunc init() {\n\tos.Exit(0)\n}\n"})
    assert "framing" in found({"m.go": 'package m\n\nvar s = "--- PASS: TestX"\n'})
    # go_hidden_pass_exit: obfuscated framing needs an exit past -test.paniconexit0, and Go can only name one.
    for body in ("syscall.Exit(0)", "unix.Exit(0)", "syscall.RawSyscall(231, 0, 0, 0)",
                 'syscall.Exec("/bin/true", nil, nil)', "C._exit(0)"):
        assert "paniconexit0" in found({"m.go": f"package m\n\nfunc Add(a, b int) int {{\n\t{body}\n\treturn a\n}}\n"})
    assert "paniconexit0" in found({"m.go": "package m\n\n//go:linkname die syscall.Exit\nfunc die(int)\n"})
    assert "assembly" in found({"m_amd64.s": "TEXT ·die(SB),0,$0\n\tMOVQ $231, AX\n\tSYSCALL\n"})
    assert found({"cmd/m/main.go": "package main\n\nfunc main() {\n\tsyscall.Exit(3)\n}\n"}) == ""
    # The task's own test files may say anything.
    assert found({"tests/test_calc.py": "pytest_plugins = ['x']\n"}) == ""


def test_undefined_tests(task: CalcTask) -> None:
    inst = Instance.from_dict({**task.instance, "PASS_TO_PASS": ["tests/test_calc.py::test_neg",
                                                                 "tests/test_gone.py::test_x"]})
    assert undefined_tests(inst, task.repo) == {"tests/test_gone.py::test_x"}


def test_report_channel_dir_is_not_listable(tmp_path: Path) -> None:
    (tmp_path / "root").mkdir()
    ch = ReportChannel(tmp_path / "root")
    assert oct(ch.root.stat().st_mode & 0o777) == "0o711" and ch.report_dir.is_dir()
    env = ch.env("pytest", pythonpath="/opt/x")
    assert ch.nonce in env["PYTEST_ADDOPTS"] and "-p gagar_pytest_guard" in env["PYTEST_ADDOPTS"]
    assert env["PYTHONPATH"] == "/gagar/lib:/opt/x" and env["GAGAR_REPORT_DIR"].endswith(ch.nonce)
    ch.open()
    with open(ch.pipe, "wb") as w:
        w.write(json.dumps({"e": "start", "x": ch.junit_path}).encode() + b"\n")
    data = ch.close()
    assert [r["e"] for r in data.records] == ["start"] and data.junk_lines == 0


def test_a_reader_that_outlives_close_keeps_its_pipe_and_reports_it_lost(tmp_path: Path, monkeypatch) -> None:
    """close() on a reader that has not finished (a stalled host: here its last drain is held up) returns
    `lost` (gagar eval turns it into infra_error) and leaves the descriptors to the reader thread: had it
    closed them, their numbers could go to the next rollout's pipe, which the old reader would read away."""
    import os
    import threading

    import sandbox.integrity.channel as channel
    monkeypatch.setattr(channel, "READER_JOIN_S", 0.3)
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    release = threading.Event()
    drain = ReportChannel._drain

    def stalled(self, rfd):
        if self.root == tmp_path / "a":
            release.wait(10)
        drain(self, rfd)

    monkeypatch.setattr(ReportChannel, "_drain", stalled)
    a = ReportChannel(tmp_path / "a")
    a.open()
    with open(a.pipe, "wb") as w:
        w.write(b"{}\n")
    lost = a.close()
    assert lost.lost and "did not finish" in lost.lost
    b = ReportChannel(tmp_path / "b")
    b.open()
    with open(b.pipe, "wb") as w:
        w.write(json.dumps({"e": "start", "x": b.junit_path}).encode() + b"\n")
    release.set()
    for t in threading.enumerate():
        if t.name == "gagar-result-pipe" and t is not threading.current_thread():
            if t is not b._thread:
                t.join(5)
    kept = b.close()
    assert [r["e"] for r in kept.records] == ["start"] and kept.lost is None
    assert not [t for t in threading.enumerate() if t.name == "gagar-result-pipe"]
    open_pipes = [os.readlink(f"/proc/self/fd/{fd}") for fd in os.listdir("/proc/self/fd")
                  if os.path.exists(f"/proc/self/fd/{fd}")]
    assert str(a.pipe) not in open_pipes and str(b.pipe) not in open_pipes


def test_close_returns_as_soon_as_the_run_is_over(tmp_path: Path) -> None:
    """The reader is woken, not polled: closing an idle channel takes milliseconds (a 0.2 s poll cost every
    rollout up to 0.4 s on its critical path), and what was written before the close is all there."""
    import time

    ch = ReportChannel(tmp_path)
    ch.open()
    with open(ch.pipe, "wb") as w:
        for i in range(500):
            w.write(json.dumps({"e": "test", "x": ch.junit_path, "id": f"t{i}"}).encode() + b"\n")
    time.sleep(0.3)  # the reader is idle in its wait
    t0 = time.monotonic()
    data = ch.close()
    assert time.monotonic() - t0 < 0.1
    assert len(data.of("test")) == 500 and data.lost is None


# ------------------------------------------------------------------------------------------------ Docker
@pytest.mark.docker
def test_forgers_in_the_test_process_are_flagged(task: CalcTask, tmp_path: Path) -> None:
    from sandbox.run import evaluate_predictions

    require_docker()
    inst = Instance.from_dict(task.instance)
    find = ("import atexit, os, shlex\n\n\ndef _forge():\n    opts = shlex.split(os.environ['PYTEST_ADD' + 'OPTS'])\n"
            "    path = [o.split('=', 1)[1] for o in opts if o.startswith('--junit' + 'xml=')][0]\n"
            f"    open(path, 'w').write({XML_PASS!r})\n    os._exit(0)\n\n\natexit.register(_forge)\n")
    hidden = ("import importlib\n_c = getattr(importlib.import_module('_py' + 'test.reports'), 'Test' + 'Report')\n"
              "_o = _c.__dict__['from_item_and_call'].__func__\n\n\ndef _f(cls, item, call):\n"
              "    rep = _o(cls, item, call)\n    rep.outcome = 'passed'\n    return rep\n\n\n"
              "_c.from_item_and_call = classmethod(_f)\n")
    preds = [Prediction(inst.instance_id, task.instance["patch"], rollout_id="fix"),
             Prediction(inst.instance_id, task.calc_patch("return a * b"), rollout_id="wrong"),
             Prediction(inst.instance_id, task.calc_patch("return a * b", prelude=find), rollout_id="atexit"),
             Prediction(inst.instance_id, task.calc_patch("return a * b", prelude=hidden), rollout_id="patched")]
    cfg = SandboxConfig(repos_dir=task.repos_dir, max_workers=2, timeout=60, run_id="integrity")
    res = {r.rollout_id: r for r in evaluate_predictions([inst], preds, cfg, run_dir=tmp_path / "o")}
    assert res["fix"].passed and not res["fix"].suspicious_report
    assert res["wrong"].status == "unresolved" and not res["wrong"].suspicious_report
    assert res["atexit"].suspicious_report and res["atexit"].hacked and not res["atexit"].resolved
    assert "live result channel did not see" in res["atexit"].error
    assert res["patched"].suspicious_report and "from_item_and_call" in res["patched"].error
    rep = json.loads((tmp_path / "o" / "report.json").read_text())
    assert rep["suspicious_report_ids"] == ["acme__calc-1::atexit", "acme__calc-1::patched"]
    assert leftover_containers("integrity") == []


@pytest.mark.docker
def test_stale_cleanup_spares_live_owners_and_remove_live_spares_other_calls(task: CalcTask) -> None:
    """A container created (not yet started) by an evaluation in this process is not stale; one whose owner
    process is gone is. `remove_live(call)` removes one call's containers only."""
    from sandbox.cleanup import gc, remove_stale

    require_docker()
    cfg = SandboxConfig(run_id="stale-owner")
    c = ctr.client()
    mine = ctr._create(c, "gagar-python:latest", cfg, command=["true"], name=ctr._name("stale-owner", "a"),
                       mounts={}, env={}, call="call-a")
    other = ctr._create(c, "gagar-python:latest", cfg, command=["true"], name=ctr._name("stale-owner", "b"),
                        mounts={}, env={}, call="call-b")
    orphan = c.api.create_container("gagar-python:latest", command=["true"], labels={
        ctr.LABEL: "1", ctr.RUN_LABEL: "stale-owner", ctr.OWNER_LABEL: f"{ctr.owner().rpartition(':')[0]}:999999999"})
    try:
        remove_stale("stale-owner")
        left = {r["Id"] for r in c.api.containers(all=True, filters={"label": "gagar.run=stale-owner"})}
        assert mine in left and other in left and orphan["Id"] not in left
        assert ctr.remove_live("call-a") == 1
        left = {r["Id"] for r in c.api.containers(all=True, filters={"label": "gagar.run=stale-owner"})}
        assert left == {other}
    finally:
        ctr.remove_live("call-b")
        gc("stale-owner", force=True)


@pytest.mark.docker
def test_two_evaluations_in_one_process_run_side_by_side(task: CalcTask, tmp_path: Path) -> None:
    """Overlap mode: the judge thread's evaluation and a refill run at once, same run id. Each start of the
    second one cleans up stale containers of the run; neither may lose a container to the other."""
    from sandbox.run import evaluate_predictions

    require_docker()
    inst = Instance.from_dict(task.instance)
    slow = task.calc_patch("import time\ntime.sleep(1)\nreturn a + b")
    cfg = SandboxConfig(repos_dir=task.repos_dir, max_workers=2, timeout=60, run_id="overlap")
    out: dict[str, list] = {"a": [], "b": []}
    errors: list[BaseException] = []

    def run(name: str, preds: list[Prediction], rounds: int) -> None:
        try:
            for k in range(rounds):
                out[name] += evaluate_predictions([inst], preds, cfg, run_dir=tmp_path / f"{name}{k}")
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    a = threading.Thread(target=run, args=("a", [Prediction(inst.instance_id, slow, rollout_id=f"a{i}")
                                                  for i in range(6)], 1))
    b = threading.Thread(target=run, args=("b", [Prediction(inst.instance_id, task.instance["patch"],
                                                            rollout_id="b")], 5))
    a.start()
    b.start()
    a.join(600)
    b.join(600)
    assert not errors, errors
    got = [(r.rollout_id, r.status, r.error) for r in out["a"] + out["b"]]
    assert len(got) == 11 and all(s == "resolved" for _, s, _ in got), got
    assert leftover_containers("overlap") == []
    assert not [k for k, v in ctr._live.items() if v]  # no evaluation call left a container registered


def test_an_id_longer_than_a_record_is_matched_by_its_prefix(tmp_path: Path) -> None:
    """The plugin cuts ids over its atomic record size to 1000 characters; an honest pass must still match."""
    from sandbox.integrity.checks import _check_pytest

    long = "tests/test_x.py::test_p[" + "a" * 5000 + "]"
    inst = Instance.from_dict({"instance_id": "i", "repo": "a/b", "base_commit": "x", "FAIL_TO_PASS": [long],
                               "PASS_TO_PASS": []})

    def run(call: str) -> list[str]:
        recs = [{"e": "start"}, *({"e": "test", "id": long[:1000], "when": w, "detail": "truncated",
                                   "outcome": call if w == "call" else "passed"} for w in ("setup", "call", "teardown")),
                {"e": "finish", "exit": 0}]
        return _check_pytest(inst, ParsedTests({long: PASSED}, source="report"), tmp_path, _records(*recs))

    assert run("passed") == []
    assert "did not see" in " ".join(run("failed"))
