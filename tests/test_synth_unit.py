"""`gagar tasks synth` without Docker: problem statements and the leak check, sources, coverage data, splits,
the command line's input checks."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest
from sandbox_fixtures import commit_tree

from synth import cli
from synth.factory import ProjectRun, split_repos
from synth.mutate import find_mutations
from synth.sources import Source, SourceError, prepare
from synth.statement import Leak, leaks, problem_statement, stable_messages
from synth.validate import Baseline, covering, pytest_cmd, read_coverage

GOLD = """\
diff --git a/pkg/m.py b/pkg/m.py
--- a/pkg/m.py
+++ b/pkg/m.py
@@ -1,4 +1,4 @@
 def window(items, size):
-    return [items[i:i + size + 1] for i in range(len(items))]
+    return [items[i:i + size] for i in range(len(items))]
"""


def test_statement_names_tests_and_messages_and_never_quotes_the_fix() -> None:
    messages = {
        "tests/test_m.py::test_window": "AssertionError: assert [[1, 2]] == [[1]]\n  Use -v to get more diff",
        # A message that quotes the code (e.g. a SyntaxError's text): its line must not reach the statement.
        "tests/test_m.py::test_other": "ValueError: bad\n    return [items[i:i + size] for i in range(len(items))]",
    }
    text = problem_statement("mod", list(messages), messages, GOLD)
    assert "`tests/test_m.py::test_window`" in text and "assert [[1, 2]] == [[1]]" in text
    assert "ValueError: bad" in text and "Use -v" not in text
    assert leaks(text, GOLD) == []
    assert "items[i:i + size]" not in text and "size + 1" not in text
    assert text.startswith("2 tests of mod fail:")


def test_leak_check_finds_a_quoted_line_and_a_leaking_test_name_drops_the_task() -> None:
    assert leaks("here:   return [items[i:i + size]   for i in range(len(items))] !", GOLD)
    assert not leaks("assert 1 == 2", GOLD)
    with pytest.raises(Leak):
        problem_statement("mod", ["return [items[i:i + size] for i in range(len(items))]"], {}, GOLD)


def test_statement_lists_at_most_five_tests() -> None:
    tests = [f"t.py::test_{i}" for i in range(8)]
    text = problem_statement("mod", tests, {"t.py::test_0": "assert <object at 0x7f7d1963faf0> == 3"}, GOLD)
    assert text.count("- `t.py::") == 5 and "and 3 more" in text
    assert "<object at 0x…> == 3" in text  # run-specific addresses never make two runs' statements differ


def test_statement_keeps_only_what_every_run_printed() -> None:
    # Two real runs of toolz's and parse's broken trees: pytest's shortened repr cuts the `0x` to `x`, and an
    # explanation line carries the clock. Before, two syntheses of one task worded its statement differently.
    run = lambda addr, now: {  # noqa: E731
        "t.py::test_dissoc": f"assert <toolz.tests....x{addr}> == <toolz.tests....x7fec0c286e10>",
        "t.py::test_year": f"assert 1 == 2\n+  where 2026 = datetime.datetime(2026, 12, 4, {now}).year",
        "t.py::test_plain": "AssertionError: assert 3 == 4",
    }
    a, b = run("7fec0afefe90", "8, 42, 50, 588002"), run("7fa41b91c6d0", "13, 50, 56, 501296")
    texts = {problem_statement("toolz", sorted(a), stable_messages(runs), GOLD) for runs in ([a, b], [b, a])}
    assert len(texts) == 1
    text = texts.pop()
    assert "<toolz.tests....0x…> == <toolz.tests....0x…>" in text and "assert 1 == 2" in text
    assert "datetime" not in text and "AssertionError: assert 3 == 4" in text
    assert stable_messages([]) == {} and stable_messages([a])["t.py::test_plain"] == a["t.py::test_plain"]


def test_statement_masks_addresses_a_shortened_repr_cut() -> None:
    # more-itertools' ValueChainTests::test_complex as two syntheses printed it: unittest's shortened repr kept only
    # the last three hex digits of an object's address, and every run of one synthesis printed the same ones, so
    # `stable_messages` kept the line and the two syntheses worded the statement differently.
    line = ("AssertionError: Lists differ: [(1, (2, (3,))), ['foo', ['bar', ['baz']],[59 chars]{0}>] != "
            "[1, (2, (3,)), 'foo', ['bar', ['baz']], 't[41 chars]{0}>]")
    texts = {problem_statement("more-itertools", ["t.py::test_complex"], {"t.py::test_complex": line.format(tail)}, GOLD)
             for tail in ("d00", "380")}
    assert len(texts) == 1 and "[59 chars]…>] != " in texts.pop()
    cut = {problem_statement("m", ["t.py::t"], {"t.py::t": f"assert <m.C object at 0x{h}[40 chars] == 1"}, GOLD)
           for h in ("7f", "55d")}
    assert len(cut) == 1 and "at 0x…[40 chars]" in cut.pop()
    # Text that only looks like it is kept: a cut followed by a word, a short hex word in prose.
    kept = problem_statement("m", ["t.py::t"], {"t.py::t": "assert 'abc[3 chars]def' == x0 == 'face'"}, GOLD)
    assert "'abc[3 chars]def' == x0 == 'face'" in kept


def _git_repo(root: Path, files: dict[str, str]) -> Path:
    commit_tree(root, files)
    return root


def test_local_source_naming_and_bad_inputs(tmp_path: Path) -> None:
    good = _git_repo(tmp_path / "acme__thing", {"thing/core.py": "def f(x):\n    return x + 1\n",
                                                 "tests/test_core.py": "def test_f():\n    pass\n"})
    p = prepare(Source(path=str(good)), tmp_path / "out", {})
    assert p.repo == "acme/thing" and p.clone == tmp_path / "out" / "repos" / "acme__thing"
    assert p.version == p.base_commit[:12] and list(p.sources) == ["thing/core.py"]
    again = prepare(Source(path=str(good)), tmp_path / "out", {"base_commit": p.base_commit})
    assert again.base_commit == p.base_commit
    plain = _git_repo(tmp_path / "notests", {"lib.py": "def f():\n    return 1\n"})
    assert Source(path=str(plain)).repo_name() == "local/notests"
    with pytest.raises(SourceError, match="ships no tests"):
        prepare(Source(path=str(plain)), tmp_path / "out", {})
    (tmp_path / "nogit").mkdir()
    with pytest.raises(SourceError, match="not a git repository"):
        prepare(Source(path=str(tmp_path / "nogit")), tmp_path / "out", {})
    assert Source(sdist="More_Itertools==10.5.0").repo_name() == "pypi/more-itertools"


@pytest.mark.parametrize("row, message", [
    ({"sdist": "toolz"}, "NAME==VERSION"),
    ({"sdist": "a==1", "path": "/x"}, "exactly one"),
    ({"path": "/x", "split": "test"}, "split"),
    ({"path": "/x", "tesst": []}, "unknown key"),
    ({"path": "/x", "repo": "noslash"}, "owner/name"),
    ({"path": "/x", "env": {"pyhton": "3.11"}}, "unknown env spec key"),
])
def test_source_rows_are_checked(row: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Source.from_dict(row, "sources[0]")


def test_cli_rejects_bad_input_with_exit_2(tmp_path: Path, capsys) -> None:
    assert cli.main(["synth", "--out", str(tmp_path / "o")]) == 2
    assert "at least one" in capsys.readouterr().err
    assert cli.main(["synth", "--sdist", "toolz", "--out", str(tmp_path / "o")]) == 2
    assert cli.main(["synth", "--repo", str(tmp_path / "missing"), "--out", str(tmp_path / "o")]) == 2
    (tmp_path / "s.json").write_text("{not json")
    assert cli.main(["synth", "--sources", str(tmp_path / "s.json"), "--out", str(tmp_path / "o")]) == 2
    assert "not valid JSON" in capsys.readouterr().err
    assert cli.main(["synth", "--sdist", "a==1", "--kinds", "off_by_two", "--out", str(tmp_path / "o")]) == 2
    assert "off_by_two" in capsys.readouterr().err
    assert cli.main(["synth", "--sdist", "a==1", "--sdist", "A==2", "--out", str(tmp_path / "o")]) == 2
    assert "same repository" in capsys.readouterr().err
    (tmp_path / "e.json").write_text(json.dumps({"x": 1}))
    assert cli.main(["synth", "--sdist", "a==1", "--env-specs", str(tmp_path / "e.json"), "--out",
                     str(tmp_path / "o")]) == 2
    # `gagar tasks repos`: a set that cannot be read, or whose instances have no bug record, is refused.
    assert cli.main(["repos", str(tmp_path / "no-set"), "--out", str(tmp_path / "r")]) == 2
    assert "gagar tasks repos: error:" in capsys.readouterr().err
    (tmp_path / "set").mkdir()
    (tmp_path / "set" / "manifest.json").write_text(json.dumps({"sources": []}))
    (tmp_path / "set" / "instances.jsonl").write_text(json.dumps(
        {"instance_id": "p__q-synth-0", "repo": "p/q", "base_commit": "0" * 40, "patch": GOLD}) + "\n")
    (tmp_path / "set" / "tasks_meta.jsonl").write_text("")
    assert cli.main(["repos", str(tmp_path / "set"), "--out", str(tmp_path / "r")]) == 2
    assert "no row for 1 instance(s), e.g. p__q-synth-0" in capsys.readouterr().err


def test_coverage_data_is_read_per_line_and_test(tmp_path: Path) -> None:
    """coverage.py's SQLite layout: numbits (bit n of byte n // 8 = line n) per file and `<node id>|run` context."""
    db = tmp_path / "coverage.db"
    con = sqlite3.connect(db)
    con.executescript("create table file (id integer primary key, path text);"
                      "create table context (id integer primary key, context text);"
                      "create table line_bits (file_id integer, context_id integer, numbits blob);")
    con.execute("insert into file values (1, '/testbed/pkg/m.py'), (2, '/usr/lib/python3/x.py')")
    con.execute("insert into context values (1, ''), (2, 'tests/t.py::test_a|run'), (3, 'tests/t.py::test_b[1]|run')")
    bits = lambda *lines: bytes(sum(1 << (n % 8) for n in lines if n // 8 == i) for i in range(4))  # noqa: E731
    con.execute("insert into line_bits values (1, 2, ?), (1, 3, ?), (1, 1, ?), (2, 2, ?)",
                (bits(2, 3, 17), bits(3), bits(1), bits(5)))
    con.commit()
    con.close()
    cov = read_coverage(db)
    assert cov == {"pkg/m.py": {2: {"tests/t.py::test_a"}, 3: {"tests/t.py::test_a", "tests/t.py::test_b[1]"},
                                17: {"tests/t.py::test_a"}}}
    base = Baseline(passing={"tests/t.py::test_a"}, coverage=cov)
    src = "def f(x):\n    if x > 1:\n        return 2\n    return 3\n"
    by_line = {m.lines[0] for m in find_mutations("pkg/m.py", src)}
    assert {m.lines[0] for m in find_mutations("pkg/m.py", src) if covering(m, base)} == by_line & {2, 3}
    base.passing.add("tests/t.py::test_b[1]")
    assert {covering(m, base) for m in find_mutations("pkg/m.py", src) if m.lines == (3, 3)} == {2}


def test_pytest_cmd_quotes_ids_and_clears_ini_addopts() -> None:
    cmd = pytest_cmd(["-p", "no:randomly"], ["tests/t.py::T::test_a", "tests/t.py::test b"])
    assert cmd == ("PYTHONHASHSEED=0 python -m pytest -rA -o addopts= -p no:randomly -p no:pytest_cov "
                   "tests/t.py::T::test_a 'tests/t.py::test b'")
    assert pytest_cmd([], ["tests"], coverage=True).startswith('COVERAGE_FILE="$GAGAR_REPORT_DIR/coverage.db" ')
    # Unless the project turns pytest-randomly off, every test starts from one seed, in file order.
    assert " -o addopts= --randomly-seed=0 --randomly-dont-reorganize -p no:pytest_cov tests" in pytest_cmd([], ["tests"])


def test_splits_hold_out_whole_repositories_deterministically() -> None:
    runs = []
    for i in range(8):
        r = ProjectRun(Source(sdist=f"p{i}==1"), f"pypi/p{i}")
        r.tasks = [{"instance_id": f"pypi__p{i}-synth-{k}"} for k in range(2)]
        runs.append(r)
    runs[3].source.split = "heldout"
    a, b = split_repos(runs, 0, 0.25), split_repos(runs, 0, 0.25)
    assert a == b and len(a["heldout"]) == 2 and "pypi/p3" in a["heldout"]
    assert set(a["train"]) | set(a["heldout"]) == {r.repo for r in runs} and not set(a["train"]) & set(a["heldout"])
    assert split_repos(runs[:1], 0, 0.25) == {"train": ["pypi/p0"], "heldout": []}


def _junit(tmp: Path, cases: list[tuple[str, str | None]]) -> Path:
    """A pytest xunit1 report in `tmp/report` with (node id, failure message or None) cases."""
    report = tmp / "report"
    report.mkdir(parents=True)
    rows = []
    for tid, msg in cases:
        path, name = tid.split("::", 1)
        cls = path[:-3].replace("/", ".")
        body = f'<failure message="{msg}">trace</failure>' if msg else ""
        rows.append(f'<testcase classname="{cls}" name="{name}" file="{path}" line="1" time="0.1">{body}</testcase>')
    (report / "pytest-junit.xml").write_text(f'<testsuites><testsuite name="pytest">{"".join(rows)}</testsuite></testsuites>')
    return tmp


def test_baseline_reports_network_only_suites_and_failing_installs(tmp_path: Path) -> None:
    from sandbox.records import EvalResult
    from synth.validate import read_baseline

    logs = _junit(tmp_path / "net", [("tests/test_n.py::test_a", "urllib.error.URLError: &lt;urlopen error "
                                      "[Errno -3] Temporary failure in name resolution&gt;"),
                                     ("tests/test_n.py::test_b", "requests.exceptions.ConnectionError: x")])
    res = EvalResult("i", "m", "r", "unresolved", log_path=str(logs))
    assert "need the network" in (read_baseline(res).error or "")
    logs = _junit(tmp_path / "fail", [("tests/test_n.py::test_a", "AssertionError: 1 != 2")])
    err = read_baseline(EvalResult("i", "m", "r", "unresolved", log_path=str(logs))).error or ""
    assert err.startswith("no test passes") and "AssertionError" in err
    broken = EvalResult("i", "m", "r", "infra_error", error="env image for local/x@abc failed to build: pip cannot "
                        "find gagar-no-such-package==1.0 on the package index (log: x)")
    assert read_baseline(broken).error.startswith("its environment does not build: ")
    # A suite that cannot even be collected (jmespath 1.1.0's sdist ships its tests without tests/__init__.py):
    # the reason names the import error, not pytest's fixed "collection failure".
    (tmp_path / "coll" / "report").mkdir(parents=True)
    (tmp_path / "coll" / "report" / "pytest-junit.xml").write_text(
        '<testsuites><testsuite name="pytest"><testcase classname="" name="tests.test_lexer" time="0">'
        '<error message="collection failure">ImportError while importing test module\n'
        "E   ImportError: cannot import name 'unittest' from 'tests' (unknown location)</error></testcase>"
        "</testsuite></testsuites>")
    err = read_baseline(EvalResult("i", "m", "r", "unresolved", log_path=str(tmp_path / "coll"))).error or ""
    assert "collection failure: ImportError: cannot import name 'unittest'" in err, err
    logs = _junit(tmp_path / "ok", [("tests/test_n.py::test_a", None), ("tests/test_n.py::test_b", "boom")])
    base = read_baseline(EvalResult("i", "m", "r", "unresolved", log_path=str(logs)))
    assert base.passing == {"tests/test_n.py::test_a"} and base.failing == {"tests/test_n.py::test_b": "boom"}
    assert "coverage" in (base.error or "")  # the report has no coverage data: said, not guessed


def test_tests_named_for_time_limits_are_never_listed() -> None:
    """A timing test passes the repeats on a quiet machine and fails under load: no group lists or runs it."""
    from types import SimpleNamespace

    from synth.validate import group_for

    slow, ok = "tests/test_s.py::test_socketutils_netstring_timeout", "tests/test_s.py::test_netstring"
    base = Baseline(passing={slow, ok}, coverage={"pkg/s.py": {3: {slow, ok}, 9: {slow}}})
    prepared = SimpleNamespace(repo="pypi/x", base_commit="c0", version="1", source=SimpleNamespace(pytest_args=[]))
    g = group_for(prepared, base, {}, "pkg/s.py", "f", (1, 5))
    assert g.tests == [ok] and g.instance.PASS_TO_PASS == [ok] and "timeout" not in g.instance.test_cmd
    assert group_for(prepared, base, {}, "pkg/s.py", "g", (8, 9)).tests == []


def test_every_task_commit_is_on_a_branch_a_plain_clone_can_check_out(tmp_path: Path) -> None:
    """`gagar tasks repos` (and the factory, through the same `write_commits`) puts each task's commit on a
    branch named by its instance id: `git clone` brings them all, `git checkout <base_commit>` works, and
    `git gc --prune=now` keeps them. A ref outside refs/heads and refs/tags reached none of that."""
    import subprocess

    from synth.rebuild import rebuild
    from synth.sources import diffs, write_commits

    src = _git_repo(tmp_path / "acme__calc", {"calc/core.py": "def add(a, b):\n    return a + b\n\n\n"
                                                             "def neg(a):\n    if a > 0:\n        return -a\n"
                                                             "    return 0 - a\n",
                                              "tests/test_core.py": "def test_add():\n    pass\n"})
    scratch = prepare(Source(path=str(src)), tmp_path / "scratch", {})
    muts = find_mutations("calc/core.py", scratch.sources["calc/core.py"])[:3]
    ids = [f"acme__calc-synth-{i}" for i in range(len(muts))]
    pairs = list(zip(ids, muts, strict=True))
    commits = write_commits(scratch, {iid: (m.path, m.apply(scratch.sources[m.path])) for iid, m in pairs},
                            "refs/scratch/")
    reverts = diffs(scratch, commits, reverse=True)
    sset = tmp_path / "set"
    sset.mkdir()
    (sset / "manifest.json").write_text(json.dumps({"sources": [{"path": str(src), "repo": "acme/calc",
                                                                 "status": "ok", "base_commit": scratch.base_commit}]}))
    (sset / "instances.jsonl").write_text("".join(json.dumps({"instance_id": iid, "repo": "acme/calc",
                                                              "base_commit": commits[iid], "patch": reverts[iid]}) + "\n"
                                                  for iid in ids))
    (sset / "tasks_meta.jsonl").write_text("".join(json.dumps({"instance_id": iid, "path": m.path, "key": m.key,
                                                               "kind": m.kind}) + "\n" for iid, m in pairs))
    done = rebuild(sset, tmp_path / "out")
    assert done.mismatches == [] and done.tasks == {"acme/calc": 3}
    repo = tmp_path / "out" / "repos" / "acme__calc"

    def git(cwd: Path, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["git", "-c", "advice.detachedHead=false", *args], cwd=cwd, capture_output=True,
                              text=True)

    assert git(repo, "gc", "-q", "--prune=now").returncode == 0
    clone = tmp_path / "clone"
    assert git(tmp_path, "clone", "-q", str(repo), str(clone)).returncode == 0
    for iid in ids:
        got = git(clone, "checkout", "-q", commits[iid])
        assert got.returncode == 0, got.stderr
        assert git(clone, "rev-parse", "HEAD").stdout.strip() == commits[iid]
        assert git(clone, "rev-parse", f"origin/{iid}").stdout.strip() == commits[iid]


def test_tests_named_otherwise_are_found_when_named_and_a_run_with_no_task_fails_once_said(tmp_path: Path,
                                                                                            capsys) -> None:
    """pytimeparse ships `pytimeparse/tests/testtimeparse.py` (unittest's naming): not "no tests" but a reason
    that names the file and `--tests`, and `--tests FILE` makes it a test file. A run in which every source is
    skipped exits 1, saying why, and each reason is printed once."""
    files = {"timeparse/core.py": "def parse(s):\n    return int(s)\n",
             "timeparse/tests/__init__.py": "",
             "timeparse/tests/testcore.py": "import unittest\n\n\nclass T(unittest.TestCase):\n"
                                            "    def test_parse(self):\n        self.assertEqual(1, 1)\n"}
    repo = _git_repo(tmp_path / "acme__timeparse", files)
    with pytest.raises(SourceError, match=r"not named as pytest finds them.*timeparse/tests/testcore.py.*--tests"):
        prepare(Source(path=str(repo)), tmp_path / "out", {})
    got = prepare(Source(path=str(repo), tests=["timeparse/tests/testcore.py"]), tmp_path / "out", {})
    assert got.test_files == ["timeparse/tests/testcore.py"] and list(got.sources) == ["timeparse/core.py"]
    with pytest.raises(SourceError, match="name the files themselves"):
        prepare(Source(path=str(repo), tests=["timeparse/tests"]), tmp_path / "out", {})

    other = _git_repo(tmp_path / "acme__other", {"lib.py": "def f():\n    return 1\n"})
    for quiet in ([], ["--quiet"]):
        rc = cli.main(["synth", "--repo", str(repo), "--repo", str(other), "--out", str(tmp_path / "run"), *quiet])
        err = capsys.readouterr().err
        assert rc == 1, err
        assert "no task was made: every source was skipped" in err
        assert err.count("--tests") == 1 and err.count("ships no tests") == 1, err


def test_runs_the_sandbox_failed_are_retried_before_anything_is_decided(tmp_path: Path, monkeypatch) -> None:
    """An infra_error (an image build cut short, the engine) says nothing about a bug: the factory evaluates
    again (the sandbox redoes only those) before it decides, so a transient failure cannot drop a candidate in
    one synthesis and keep it in the next; one that fails every time is decided as it stands."""
    import sandbox.run
    from sandbox.records import EvalResult, Prediction
    from synth import factory

    repo = _git_repo(tmp_path / "acme__calc", {"calc/core.py": "def add(a, b):\n    return a + b\n",
                                               "tests/test_core.py": "def test_add():\n    pass\n"})
    prepared = prepare(Source(path=str(repo)), tmp_path / "out", {})
    calls: list[int] = []
    failing = {"calls": 0}

    def fake(instances, preds, config, **kw):
        calls.append(len(preds))
        status = "infra_error" if len(calls) <= failing["calls"] else "resolved"
        return [EvalResult(p.instance_id, p.model_name_or_path, p.rollout_id, status, resolved=status == "resolved",
                           error="the env image build was cut short" if status == "infra_error" else None)
                for p in preds]

    monkeypatch.setattr(sandbox.run, "evaluate_predictions", fake)
    for fails, want, n in ((1, "resolved", 2), (5, "infra_error", 1 + factory.INFRA_RETRIES)):
        calls.clear()
        failing["calls"] = fails
        proj = factory._Project(prepared, {"python": "3.11"}, factory.Options(out=tmp_path / "out", progress=False))
        proj.preds["i", "r"] = Prediction("i", "diff", "m", "r")
        proj.evaluate(60)
        assert proj.results["i", "r"].status == want and len(calls) == n
