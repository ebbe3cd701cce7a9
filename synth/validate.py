"""Validation in the Docker sandbox: every run goes through `sandbox.run.evaluate_predictions` (the images,
environment layers, limits and grading of `gagar eval`) and every verdict through `gagar validate`'s `judge`.

Per project:
1. **baseline** — the whole suite once at the base commit under coverage with per-test contexts (pytest-cov
   `--cov-context=test`, the data file written to the run's report dir): which tests pass, and which tests
   execute each line.
   Then `repeats - 2` runs of the whole suite without coverage: a test that does not pass in all of them is
   flaky at the base and never used.
2. **screen** — candidates are grouped by function: one instance per function (its repo prepared once, one
   container per rollout) whose `test_cmd` runs the tests that execute the function; each candidate's bug is one
   rollout (patch base → broken), run once. It survives when its run completes within the command's CPU limit,
   no test waited (`SLOW_FACTOR`) and 1..K listed tests fail: rules that give the same verdict at any load.
3. **repeat** — for survivors only: `repeats - 1` more runs of the bug, and one run of the clean tree per group
   with the group's command (shared by its candidates: it catches tests that pass in the whole suite but not in
   the selection). `judge` gets the broken runs as `base-k` and, as `gold-k`, the group's clean run, the
   baseline and the suite's repeats seen through the group's tests (`project`): `repeats` clean runs. Every
   FAIL_TO_PASS test fails in every broken run and passes in every clean run, every PASS_TO_PASS test passes in
   every clean run; a test whose outcome changes between repeats is flaky: a flaky PASS_TO_PASS test is dropped
   from the list, a flaky FAIL_TO_PASS test drops the task.
The final instance (base = the broken commit, patch = the revert) is the same trees and the same command.
"""

from __future__ import annotations

import hashlib
import re
import shlex
import signal
import sqlite3
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from sandbox.config import SandboxConfig
from sandbox.env.validate import NOOP_PATCH, judge
from sandbox.parsers.base import PASSED, XFAIL
from sandbox.parsers.pytest import parse_report
from sandbox.records import EvalResult, Instance, Prediction, TestsStatus
from synth.mutate import Mutation
from synth.sources import Prepared

# Installed into every project's environment: the baseline's per-test coverage. Pinned so images are reproducible.
COVERAGE_PINS = ("coverage==7.10.7", "pytest-cov==6.3.0")
# Every test starts from the same `random` seed (pytest-randomly, test order kept): a bug whose failures depend on
# random draws (cachetools' RRCache) otherwise failed a different set of tests per run, was kept by one synthesis
# and dropped as flaky by the next, and as a task would give a policy's rollouts random rewards.
SEED_PINS = ("pytest-randomly==3.16.0",)
SEED_ARGS = ("--randomly-seed=0", "--randomly-dont-reorganize")
RAN = ("resolved", "unresolved")
MAX_TARGETS = 300  # node ids on one command line; past it the selection runs whole test files
# Tests named for time limits: their outcome depends on the machine's load, which the repeats on a quiet machine
# do not show (boltons' test_socketutils_netstring_timeout passed 3 repeats, then failed 1 of 3 at load 7).
# They are never a task's FAIL_TO_PASS or PASS_TO_PASS test.
TIMING = re.compile(r"(?i)timeout|sleep|timing|elapsed|deadline|benchmark")
# A task's command caps each test process's CPU time (`ulimit -t`): an endless loop then dies after the same work
# at any load, where a wall-clock limit killed a bug in one run and let it finish in another. Default 30 CPU-s:
# the longest of the committed tasks' 996 runs took 4.2 s of wall time.
CPU_LIMIT_S = 30
CPU_KILLED = 128 + signal.SIGXCPU  # the shell's exit status when the kernel stops a process at its CPU limit
# A bug that makes a test wait (a socket read or a condition variable with a timeout) costs wall time but no CPU,
# so no CPU cap stops it. It is dropped when one test of its screening run takes `SLOW_FACTOR x` the test's
# baseline time plus `SLOW_EXTRA_S`: on the committed projects such waits add 8.4-10 s to a test, every other bug
# at most 0.22 s (2,742 runs of two syntheses at load 6-9), so the verdict has a wide margin on either side.
SLOW_FACTOR, SLOW_EXTRA_S = 4.0, 3.0
# The clock is the one input a task's command cannot fix (it pins the hash seed and the `random` seed): a test
# whose outcome or message follows the date — parse's `test_flexible_dates_year_current_year_inferred` printed
# `datetime.datetime(2026, 1, 9, …)` into its task's statement — words a task differently in another year. The
# last repeat of each bug, and each group's clean run, run with the clock moved on by `CLOCK_SHIFT_S` (400 days and
# 7 hours: another year, month, weekday and hour) through libfaketime (Debian's `libfaketime`, preloaded; the
# monotonic clocks that time-outs use are left alone): a test whose outcome changes is flaky and never listed (a
# FAIL_TO_PASS test's change drops the task), and a message line that changes never reaches a statement. Those
# runs go through a twin of the group's instance (`Group.clock`) whose environment adds the library; the task's own
# environment and command are unchanged.
CLOCK_SHIFT_S = 400 * 86400 + 7 * 3600
CLOCK_APT = ("libfaketime",)
CLOCK_MISSING_EXIT = 97
CLOCK_PREFIX = (f'L=$(echo /usr/lib/*/faketime/libfaketime.so.1); [ -f "$L" ] || {{ echo "gagar synth: libfaketime '
                f'is not in the environment image" >&2; exit {CLOCK_MISSING_EXIT}; }}; export LD_PRELOAD="$L" '
                f'FAKETIME=+{CLOCK_SHIFT_S} FAKETIME_DONT_FAKE_MONOTONIC=1 && ')
NETWORK = re.compile(r"(?i)ConnectionError|gaierror|Name or service not known|Temporary failure in name resolution|"
                     r"Network is unreachable|URLError|urlopen error|NewConnectionError|socket\.timeout|"
                     r"requests\.exceptions|Failed to establish a new connection")


def env_for(prepared: Prepared, spec: dict[str, Any] | None) -> dict[str, Any]:
    """The project's environment spec plus the coverage pins; with no spec, Python 3.11 and, when the project
    has a build file, an editable install (`--no-deps`: test dependencies come from the spec)."""
    env = dict(spec or {})
    if not spec:
        env["python"] = "3.11"
        if {"pyproject.toml", "setup.py", "setup.cfg"} & set(prepared.files):
            env["install"] = ["python -m pip install --no-deps -e ."]
    pins = list(env.get("pip_packages") or [])
    have = {re.split(r"[=<>!~\[ ]", p, maxsplit=1)[0].lower() for p in pins}
    env["pip_packages"] = pins + [p for p in (*COVERAGE_PINS, *SEED_PINS) if p.split("==")[0] not in have]
    return env


def pytest_cmd(pytest_args: list[str], targets: list[str], *, coverage: bool = False,
               cpu_limit: int | None = None) -> str:
    """The test command: pytest with the project's ini `addopts` cleared (they often need plugins that are not
    installed, or turn on coverage and doctests), its own arguments, a fixed `random` seed per test, then the
    targets; with `cpu_limit`, each process is stopped after that many CPU seconds (and writes no core file)."""
    parts = ["python", "-m", "pytest", "-rA", "-o", "addopts=", *pytest_args]
    if "no:randomly" not in pytest_args:  # a project that turns the plugin off gets no seed options either
        parts += SEED_ARGS
    if coverage:
        parts += ["--cov=/testbed", "--cov-config=/dev/null", "--cov-context=test", "--cov-report="]
    else:
        parts += ["-p", "no:pytest_cov"]  # not loading it saves ~0.4 s a run
    # A fixed hash seed: test ids built from sets (isodate's parametrizations: 48 of 280 ids changed between two
    # runs) and set or dict reprs in failure messages are then the same in every run.
    cmd = "PYTHONHASHSEED=0 " + " ".join(shlex.quote(p) for p in [*parts, *targets])
    if cpu_limit:  # SIGXCPU at the soft limit (exit status CPU_KILLED); the hard one, 5 s on, kills a process that
        # ignores it
        cmd = f"ulimit -c 0 -S -t {int(cpu_limit)} && ulimit -H -t {int(cpu_limit) + 5} && {cmd}"
    return ('COVERAGE_FILE="$GAGAR_REPORT_DIR/coverage.db" ' + cmd) if coverage else cmd


@dataclass
class Baseline:
    """What the base commit's suite says: passing tests, failures (with messages), per-line coverage."""

    passing: set[str] = field(default_factory=set)
    failing: dict[str, str] = field(default_factory=dict)
    coverage: dict[str, dict[int, set[str]]] = field(default_factory=dict)  # path → line → tests executing it
    times: dict[str, float] = field(default_factory=dict)  # test id → seconds in the baseline run (coverage on)
    duration_s: float = 0.0
    error: str | None = None


def baseline_instance(prepared: Prepared, env: dict[str, Any], run_id: str) -> Instance:
    src = prepared.source
    return Instance(instance_id=f"{prepared.repo.replace('/', '__')}-synth-baseline", repo=prepared.repo,
                    base_commit=prepared.base_commit, patch="", test_patch="", FAIL_TO_PASS=[], PASS_TO_PASS=[],
                    test_cmd=pytest_cmd(src.pytest_args, src.tests, coverage=True), test_framework="pytest",
                    language="python", version=prepared.version, environment_setup_commit=prepared.base_commit,
                    env=env)


def suite_instance(prepared: Prepared, env: dict[str, Any], base: Baseline) -> Instance:
    """The whole suite without coverage, every baseline-passing test listed: the repeats of the clean tree that
    every group shares (a test that changes outcome between them is flaky at the base and never used)."""
    src = prepared.source
    return Instance(instance_id=f"{prepared.repo.replace('/', '__')}-synth-suite", repo=prepared.repo,
                    base_commit=prepared.base_commit, patch="", test_patch="", FAIL_TO_PASS=[],
                    PASS_TO_PASS=sorted(base.passing), test_cmd=pytest_cmd(src.pytest_args, src.tests),
                    test_framework="pytest", language="python", version=prepared.version,
                    environment_setup_commit=prepared.base_commit, env=env)


def drop_flaky_baseline(base: Baseline, suite_runs: list[EvalResult]) -> list[str]:
    """Remove from `base.passing` the tests that did not pass in every repeat of the whole suite; returns them."""
    bad = set()
    for r in suite_runs:
        if r.status not in RAN:
            base.error = f"a repeat of the whole suite ended `{r.status}`: {r.error}"
            return []
        bad |= set(r.tests_status.PASS_TO_PASS.get("failure", []))
    base.passing -= bad
    return sorted(bad)


def project(result: EvalResult, tests: list[str], passing: set[str] | None = None) -> EvalResult:
    """A run of the clean tree seen through one group's tests (for `judge`): from its own lists, or, for the
    baseline run (which lists nothing), from the set of tests that passed in it."""
    keep = set(tests)
    if passing is not None:
        ok, bad = [t for t in tests if t in passing], [t for t in tests if t not in passing]
    else:
        p2p = result.tests_status.PASS_TO_PASS
        ok = [t for t in p2p.get("success", []) if t in keep]
        bad = [t for t in p2p.get("failure", []) if t in keep]
    return replace(result, tests_status=TestsStatus(PASS_TO_PASS={"success": ok, "failure": bad}))


def read_baseline(result: EvalResult) -> Baseline:
    """The baseline's verdicts from its JUnit report and coverage data in the run's logs (`result.log_path`)."""
    out = Baseline(duration_s=result.duration_s)
    report = Path(result.log_path or "") / "report"
    if result.status not in RAN:
        why = result.error or ""
        out.error = (f"its environment does not build: {why}" if "env image" in why and "build" in why else
                     f"the baseline run ended `{result.status}`: {why}")
        return out
    parsed = parse_report(report)
    if parsed is None or not parsed.statuses:
        out.error = "the test suite did not run at the base commit (no test report; see the run's test_output.txt)"
        return out
    out.passing = {t for t, s in parsed.statuses.items() if s in (PASSED, XFAIL)}
    out.times = test_times(report)
    messages = failure_messages(report)
    out.failing = {t: messages.get(t, "") for t, s in parsed.statuses.items() if s not in (PASSED, XFAIL, "SKIPPED")}
    if not out.passing:
        net = [t for t, m in out.failing.items() if NETWORK.search(m)]
        first = next(iter(out.failing.items()), ("", ""))
        out.error = (f"its tests need the network ({len(net)} of {len(out.failing)} failures are network errors, "
                     f"e.g. {first[0]}: {first[1][:160]})" if net and len(net) * 2 >= len(out.failing) else
                     f"no test passes at the base commit ({len(out.failing)} fail; first: {first[0]}: "
                     f"{first[1][:160]})")
        return out
    try:
        out.coverage = read_coverage(report / "coverage.db")
    except (OSError, sqlite3.Error) as exc:
        out.error = f"no coverage data from the baseline run ({exc}); is {COVERAGE_PINS[1]} installable?"
    return out


def read_coverage(db: Path) -> dict[str, dict[int, set[str]]]:
    """coverage.py's SQLite data → {repo path: {line: {test node ids}}}; lines are stored as numbits (bit n of
    byte n // 8 is line n), contexts as `<node id>|run` (pytest-cov)."""
    if not db.is_file():
        raise OSError(f"{db.name} is missing")
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        files = {fid: path for fid, path in con.execute("select id, path from file")}
        contexts = {cid: ctx.split("|", 1)[0] for cid, ctx in con.execute("select id, context from context")}
        out: dict[str, dict[int, set[str]]] = {}
        for fid, cid, bits in con.execute("select file_id, context_id, numbits from line_bits"):
            test, path = contexts.get(cid), files.get(fid, "")
            if not test or not path.startswith("/testbed/"):
                continue
            lines = out.setdefault(path[len("/testbed/"):], {})
            for i, byte in enumerate(bits):
                for j in range(8):
                    if byte & (1 << j):
                        lines.setdefault(i * 8 + j, set()).add(test)
        return out
    finally:
        con.close()


def _junit_cases(report_dir: Path):
    """(test id, testcase element) for each test case of the run's JUnit report that has an id."""
    from sandbox.parsers.base import read_xml, testcases
    from sandbox.parsers.pytest import _node_id

    root = read_xml(Path(report_dir) / "pytest-junit.xml")
    for case in testcases(root) if root is not None else ():
        tid = _node_id(case)
        if tid:
            yield tid, case


def failure_messages(report_dir: Path) -> dict[str, str]:
    """test id → its failure or error `message` from the JUnit report (the exception line pytest records, not
    the traceback; for a module that cannot be collected, the error that stopped it)."""
    out: dict[str, str] = {}
    for tid, case in _junit_cases(report_dir):
        for tag in ("failure", "error"):
            el = case.find(tag)
            if el is not None and tid not in out:
                msg = el.get("message") or ""
                if msg == "collection failure":  # pytest's fixed text; the cause is the traceback's last `E` line
                    last = [ln[1:].strip() for ln in (el.text or "").splitlines() if ln.startswith("E ")][-1:]
                    msg = f"collection failure: {last[0]}" if last else msg
                out[tid] = msg
    return out


def test_times(report_dir: Path) -> dict[str, float]:
    """test id → its `time` in the JUnit report (setup, call and teardown; summed over repeated ids)."""
    out: dict[str, float] = {}
    for tid, case in _junit_cases(report_dir):
        try:
            t = float(case.get("time") or 0)
        except ValueError:
            t = 0.0
        out[tid] = out.get(tid, 0.0) + t
    return out


def wait_excess(took: dict[str, float], base_times: dict[str, float]) -> tuple[str, float]:
    """The test whose time in a run most exceeds `SLOW_FACTOR` x its baseline time, and by how many seconds
    (("", 0.0) for a run without test times); the bug waited when that excess passes `SLOW_EXTRA_S`."""
    return max(((t, s - SLOW_FACTOR * base_times.get(t, 0.0)) for t, s in took.items()), key=lambda x: x[1],
               default=("", 0.0))


def cpu_killed(result: EvalResult | None) -> bool:
    """Whether a test process of this run was stopped at the command's CPU limit."""
    return result is not None and result.exit_code == CPU_KILLED


def covering(m: Mutation, base: Baseline) -> int:
    """How many baseline-passing tests execute the lines of the bug (0: no test would notice it)."""
    lines = base.coverage.get(m.path, {})
    return len({t for n in range(m.lines[0], m.lines[1] + 1) for t in lines.get(n, ()) if t in base.passing})


@dataclass
class Group:
    """The candidates in one function: one instance (one repo copy), its tests, its rollouts; `clock` is its twin
    whose runs see a shifted clock (`CLOCK_SHIFT_S`)."""

    gid: str
    instance: Instance
    tests: list[str]  # the baseline-passing tests the command runs (PASS_TO_PASS of the screening instance)
    clock: Instance


def clock_env(env: dict[str, Any]) -> dict[str, Any]:
    """A project's environment with libfaketime added (the clock twins' image)."""
    apt = list(env.get("apt_packages") or [])
    return {**env, "apt_packages": apt + [p for p in CLOCK_APT if p not in apt]}


def clock_twin(inst: Instance) -> Instance:
    """The same trees and tests as `inst`, run with the clock `CLOCK_SHIFT_S` ahead."""
    return replace(inst, instance_id=f"{inst.instance_id}-clock", test_cmd=CLOCK_PREFIX + inst.test_cmd,
                   env=clock_env(inst.env or {}))


def group_for(prepared: Prepared, base: Baseline, env: dict[str, Any], path: str, function: str,
              func_lines: tuple[int, int], cpu_limit: int | None = CPU_LIMIT_S) -> Group:
    lines = base.coverage.get(path, {})
    tests = sorted({t for n in range(func_lines[0], func_lines[1] + 1) for t in lines.get(n, ())
                    if t in base.passing and not TIMING.search(t)})
    targets = sorted({t.split("[", 1)[0] for t in tests})
    if len(targets) > MAX_TARGETS:
        targets = sorted({t.split("::", 1)[0] for t in tests})
    prefixes = tuple(targets)
    ran = sorted(t for t in base.passing if (t.split("[", 1)[0] in targets or t.split("::", 1)[0] in prefixes)
                 and not TIMING.search(t))
    digest = hashlib.sha1(f"{path}\0{function}".encode()).hexdigest()[:10]
    gid = f"{prepared.repo.replace('/', '__')}-synth-g{digest}"
    inst = Instance(instance_id=gid, repo=prepared.repo, base_commit=prepared.base_commit, patch="", test_patch="",
                    FAIL_TO_PASS=[], PASS_TO_PASS=ran, test_cmd=pytest_cmd(prepared.source.pytest_args, targets, cpu_limit=cpu_limit),
                    test_framework="pytest", language="python", version=prepared.version,
                    environment_setup_commit=prepared.base_commit, env=env)
    return Group(gid, inst, ran, clock_twin(inst))


def bug_prediction(gid: str, key: str, patch: str, k: int) -> Prediction:
    return Prediction(gid, patch, "gagar-synth", f"bug-{key}-{k}")


def clean_prediction(gid: str, k: int) -> Prediction:
    return Prediction(gid, NOOP_PATCH, "gagar-synth", f"clean-{k}")


def screen_verdict(result: EvalResult | None, max_fail: int,
                   base_times: dict[str, float] | None = None) -> tuple[list[str], str | None]:
    """(the tests the bug breaks, why it is dropped or None) from its first run. With the baseline's test times,
    a bug that makes a test wait (see `SLOW_FACTOR`) is dropped as `slow`."""
    if result is None:
        return [], "not run"
    if cpu_killed(result):
        return [], "cpu limit: a test process used up the command's CPU seconds"
    if result.status not in RAN:
        return [], f"{result.status}: {result.error or ''}".strip()
    if result.suspicious_report:
        return [], "suspicious report"
    if result.error:  # out of memory, output cut: a bug that eats resources gives no stable verdict
        return [], f"resources: {result.error}"
    if base_times is not None:
        took = test_times(Path(result.log_path or "") / "report")
        t, excess = wait_excess(took, base_times)
        if excess > SLOW_EXTRA_S:
            return [], f"slow: {t} took {took[t]:.1f} s ({base_times.get(t, 0.0):.2f} s at the base)"
    failed = sorted(result.tests_status.PASS_TO_PASS.get("failure", []))
    if not failed:
        return [], "no test fails"
    if len(failed) > max_fail:
        return failed, f"breaks {len(failed)} tests (> {max_fail})"
    return failed, None


def repeat_verdict(group: Group, fail: list[str], revert: str, bug_runs: list[EvalResult],
                   clean_runs: list[EvalResult]) -> dict[str, Any]:
    """`gagar validate`'s judge over the repeats: the broken runs are its `base-k`, the clean runs its `gold-k`.
    Adds `task_flaky` (a FAIL_TO_PASS test changed outcome: the task is dropped)."""
    inst = replace(group.instance, FAIL_TO_PASS=fail, PASS_TO_PASS=[t for t in group.tests if t not in set(fail)],
                   patch=revert)
    runs = [replace(r, rollout_id=f"base-{k}") for k, r in enumerate(bug_runs, 1)]
    runs += [replace(r, rollout_id=f"gold-{k}") for k, r in enumerate(clean_runs, 1)]
    rep = judge(inst, runs, drop_flaky=True)
    rep["task_flaky"] = sorted(set(rep["flaky"]) & set(fail))
    if rep["task_flaky"]:
        rep["valid"] = False
        rep["reasons"] = [*rep["reasons"], "flaky FAIL_TO_PASS tests: " + ", ".join(rep["task_flaky"][:3])]
    return rep


def sandbox_config(repos_dir: Path, *, timeout: float, max_workers: int, run_id: str) -> SandboxConfig:
    return SandboxConfig(repos_dir=repos_dir.resolve(), timeout=timeout, max_workers=max_workers, run_id=run_id)
