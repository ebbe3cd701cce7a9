"""SWE-bench rows as shipped (issue 24): the test command SWE-bench would run for a row without `test_cmd`, its
spec data read from the repo, its runners' logs, its test-id spellings — and one row as shipped through
`gagar eval` in real Docker (the last test)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sandbox.env.spec import EnvSpec, SpecError, apply_specs, load_spec_file, parse_spec_map
from sandbox.env.swebench import (
    RunSpec,
    classic_command,
    command_from_eval_script,
    conda_to_pip,
    environment_yml,
    framework_of,
    requirements,
)
from sandbox.env.swebench import (
    test_directives as directives,
)
from sandbox.grading import grade
from sandbox.parsers import STDOUT_REPORT, parse_results
from sandbox.parsers.base import ParsedTests
from sandbox.parsers.swebench import swebench_ids
from sandbox.records import Instance
from sandbox.watch import OutputCap

ROOT = Path(__file__).resolve().parents[1]
SPECS_410 = ROOT / "bench" / "data" / "swebench-4.1.0-specs.json"

TEST_PATCH = ("diff --git a/tests/test_blueprints.py b/tests/test_blueprints.py\n--- a/tests/test_blueprints.py\n"
              "+++ b/tests/test_blueprints.py\n@@ -1 +1,2 @@\n x\n+y\n"
              "diff --git a/tests/static/config.toml b/tests/static/config.toml\n--- a/tests/static/config.toml\n"
              "+++ b/tests/static/config.toml\n@@ -1 +1,2 @@\n a\n+b\n"
              "diff --git a/tests/admin_views/tests.py b/tests/admin_views/tests.py\n--- a/tests/admin_views/tests.py\n"
              "+++ b/tests/admin_views/tests.py\n@@ -1 +1,2 @@\n a\n+b\n")


def _row(**kw) -> Instance:
    d = {"instance_id": "o__r-1", "repo": "o/r", "base_commit": "abc", "patch": "", "test_patch": TEST_PATCH,
         "FAIL_TO_PASS": '["t"]', "PASS_TO_PASS": "[]", "version": "1.0", **kw}
    return Instance.from_dict(d)


def test_directives_as_swebench_derives_them() -> None:
    # data files (.toml, .txt, .json…) are not test directives; Django's runner takes module paths
    assert directives(TEST_PATCH) == ["tests/test_blueprints.py", "tests/admin_views/tests.py"]
    assert directives(TEST_PATCH, module_paths=True) == ["test_blueprints", "admin_views.tests"]


def test_framework_follows_the_command() -> None:
    assert framework_of("pytest --no-header -rA --tb=no -p no:cacheprovider") == "pytest"
    assert framework_of("tox --current-env -epy39 -v --") is None  # tox filters the sandbox's environment
    assert framework_of("./tests/runtests.py --verbosity 2 --settings=test_sqlite --parallel 1") == "django"
    assert framework_of("PYTHONWARNINGS='ignore::UserWarning' bin/test -C --verbose") == "sympy"
    assert framework_of("export X=1\npython -m unittest -v") == "unittest"
    assert framework_of("npm test") is None


def test_classic_command_has_eval_commands_then_test_cmd_and_directives() -> None:
    run = RunSpec(("./tests/runtests.py --verbosity 2",), ("export LANG=en_US.UTF-8",), None)
    cmd, fw, lp = classic_command("django/django", TEST_PATCH, run)
    assert cmd == "export LANG=en_US.UTF-8\n./tests/runtests.py --verbosity 2 test_blueprints admin_views.tests"
    assert (fw, lp) == ("django", "parse_log_django")
    cmd, fw, lp = classic_command("psf/requests", TEST_PATCH, RunSpec(("pytest -rA",)))
    assert cmd == "pytest -rA tests/test_blueprints.py tests/admin_views/tests.py"
    assert (fw, lp) == ("pytest", "parse_log_pytest_options")  # SWE-bench's parser for requests
    with pytest.raises(ValueError, match="cannot tell which test runner"):
        classic_command("o/r", TEST_PATCH, RunSpec(("npm test",)))
    with pytest.raises(ValueError, match="tox runs pytest in an environment it filters"):
        classic_command("sphinx-doc/sphinx", TEST_PATCH, RunSpec(("tox --current-env -epy39 -v --",)))


EVAL_SCRIPT = """#!/bin/bash
set -uxo pipefail
source /opt/miniconda3/bin/activate
conda activate testbed
cd /testbed
export LANG=en_US.UTF-8
git config --global --add safe.directory /testbed
cd /testbed
git status
git -c core.fileMode=false diff 182ce3dd15dfa3537391c3efaf9c3ff407d134d4
source /opt/miniconda3/bin/activate
conda activate testbed
python -m pip install -e .
git checkout 182ce3dd15dfa3537391c3efaf9c3ff407d134d4 tests/test_cli.py
git apply -v - <<'EOF_114329324912'
diff --git a/tests/test_cli.py b/tests/test_cli.py
--- a/tests/test_cli.py
+++ b/tests/test_cli.py
@@ -1 +1,2 @@
 export NOT_A_REAL_LINE=1
+pytest -k nope
EOF_114329324912
: '>>>>> Start Test Output'
pytest -rA tests/test_cli.py
SWEBENCH_TEST_EXIT_CODE=$?
: '>>>>> End Test Output'
echo ">>>>> Test Exit Code: $SWEBENCH_TEST_EXIT_CODE"
git checkout 182ce3dd15dfa3537391c3efaf9c3ff407d134d4 tests/test_cli.py
"""


def test_eval_script_gives_its_test_command_without_git_patch_or_reinstall() -> None:
    cmd = command_from_eval_script(EVAL_SCRIPT)
    lines = cmd.splitlines()
    assert lines[-1] == "pytest -rA tests/test_cli.py"
    assert "export LANG=en_US.UTF-8" in lines
    assert not any(x in cmd for x in ("git ", "pip install", "NOT_A_REAL_LINE", "nope", "EOF_"))
    assert sum("conda activate testbed" in ln and ln.startswith("if ") for ln in lines) == 2  # guarded
    with pytest.raises(ValueError, match="no test command between"):
        command_from_eval_script("#!/bin/bash\ngit status\n")


def test_rows_as_shipped_get_their_command_at_spec_application() -> None:
    specs = parse_spec_map({"o/r": {"1.0": {"python": "3.11", "test_cmd": "pytest -rA", "install": "pip install ."}}},
                           "f")
    assert specs["o/r"]["1.0"].install == ("pip install -e .",)  # the rollout's tree is what gets imported
    row, has_cmd, five = _row(), _row(instance_id="o__r-2", test_cmd="make check"), _row(
        instance_id="o__r-3", eval_script=EVAL_SCRIPT, log_parser="parse_log_flask", image="sweb.eval.x:latest",
        eval_type="pass_and_fail")
    odd = _row(instance_id="o__r-4", eval_script=EVAL_SCRIPT, log_parser="parse_log_jest")
    unknown = _row(instance_id="o__r-5", version="9.9")
    insts = {i.instance_id: i for i in (row, has_cmd, five, odd, unknown)}
    notes = apply_specs(insts, specs)
    assert row.test_cmd == "pytest -rA tests/test_blueprints.py tests/admin_views/tests.py"
    assert row.test_framework == "pytest" and row.env == {"python": "3.11", "install": ["pip install -e ."]}
    assert row.FAIL_TO_PASS == ["t"]  # the JSON string as shipped
    assert has_cmd.test_cmd == "make check"  # a row's own command is never replaced
    assert five.test_cmd.endswith("pytest -rA tests/test_cli.py") and five.log_parser == "parse_log_flask"
    assert five.image is None  # with a spec for its (repo, version), the spec's environment is built
    assert not odd.test_cmd and not unknown.test_cmd
    assert len(notes) == 1 and "o__r-4" in notes[0] and "parse_log_jest" in notes[0] and "supported" in notes[0]


def test_swebench_package_errors_name_version_and_what_works(monkeypatch: pytest.MonkeyPatch) -> None:
    import sandbox.env.swebench as sw

    monkeypatch.setattr(sw, "swebench_version", lambda: None)
    with pytest.raises(SpecError, match="not installed.*swebench>=2,<=4.1.0.*--env-specs FILE"):
        load_spec_file("swebench")
    try:
        import swebench.harness.constants as c  # noqa: F401
        has_map = hasattr(c, "MAP_REPO_VERSION_TO_SPECS")
    except ImportError:
        has_map = False
    if not has_map:
        monkeypatch.setattr(sw, "swebench_version", lambda: "5.0.2")
        with pytest.raises(SpecError, match="swebench 5.0.2 no longer ships MAP_REPO_VERSION_TO_SPECS"):
            load_spec_file("swebench")


def test_swebench_410_spec_file_loads_and_translates() -> None:
    specs = load_spec_file(SPECS_410)
    flask = specs["pallets/flask"]["2.3"]
    assert flask.packages == "requirements.txt" and flask.python == "3.11"
    assert flask.run.test_cmd == ("pytest -rA",) and flask.run.log_parser == "parse_log_pytest"
    sympy = specs["sympy/sympy"]["1.12"]
    assert sympy.conda_packages == ("mpmath", "flake8") and sympy.run.log_parser == "parse_log_sympy"
    assert specs["psf/requests"]["2.4"].install == ("python -m pip install -e .",)  # was `pip install .`


def test_requirements_read_where_swebench_looks() -> None:
    files = {"requirements/dev.txt": "-r docs.txt\n-r tests.txt\n# c\n-e .\npre-commit==3.0\n",
             "requirements/docs.txt": "sphinx==6.1\n#x\n", "requirements/tests.txt": "pytest==7.2\n.[test]\n"}
    path, lines = requirements("pallets/flask", files.get)
    assert path == "requirements/dev.txt" and lines == ["sphinx==6.1", "pytest==7.2", "pre-commit==3.0"]
    # a repo SWE-bench lists no paths for: its own requirements.txt, as the spec says
    assert requirements("o/r", {"requirements.txt": "types-pkg_resources==0.1\n"}.get) == (
        "requirements.txt", ["types-setuptools"])
    with pytest.raises(ValueError, match="no requirements file at requirements/dev.txt"):
        requirements("pallets/flask", {"requirements.txt": "x"}.get)


def test_environment_yml_goes_to_pip() -> None:
    yml = ("name: xarray-tests\nchannels: [conda-forge]\ndependencies:\n  - python=3.10\n  - pip\n  - numpy=1.23\n"
           "  - conda-forge::scipy>=1.5\n  - cxx-compiler\n  - netcdf4\n  - pip:\n    - pytest-env\n")
    path, conda, pip = environment_yml("pydata/xarray", {"ci/requirements/environment.yml": yml}.get)
    assert path == "ci/requirements/environment.yml"
    assert conda == ["numpy==1.23.*", "scipy>=1.5", "netcdf4"] and pip == ["pytest-env"]
    assert conda_to_pip("numpy 1.2.*") == "numpy==1.2.*" and conda_to_pip("python=3.9") is None


DJANGO_LOG = """test_a (admin_views.tests.T) ... ok
test_b (admin_views.tests.T) ... FAIL
test_c (admin_views.tests.T) ... skipped 'no db'
test_d (admin_views.tests.T) ... Internal Server Error: /x/
ok
test_e (admin_views.tests.T) ... ok
test_f (admin_views.tests.T.test_f) ... ERROR

======================================================================
ERROR: test_e (admin_views.tests.T)
----------------------------------------------------------------------
FAIL: test_b (admin_views.tests.T)
"""

SYMPY_LOG = """============================= test process starts ==============================
sympy/polys/tests/test_monomials.py[3]
test_monomials ok
test_monomial_count F
test_monomial_mul E
________________________________________________________________________________
____ sympy/polys/tests/test_monomials.py:test_monomial_count _____
"""


def test_django_and_sympy_runners_read_like_swebench() -> None:
    d = parse_results("django", DJANGO_LOG, None).statuses
    assert d["test_a (admin_views.tests.T)"] == "PASSED" and d["test_b (admin_views.tests.T)"] == "FAILED"
    assert d["test_c (admin_views.tests.T)"] == "SKIPPED" and d["test_d (admin_views.tests.T)"] == "PASSED"
    assert d["test_f (admin_views.tests.T.test_f)"] == "ERROR"
    assert d["test_e (admin_views.tests.T)"] == "ERROR"  # a teardown error after its `ok` is not a pass
    s = parse_results("sympy", SYMPY_LOG, None).statuses
    assert s == {"test_monomials": "PASSED", "test_monomial_count": "FAILED", "test_monomial_mul": "ERROR",
                 "sympy/polys/tests/test_monomials.py:test_monomial_count": "FAILED"}
    assert {"go", "django", "sympy"} <= STDOUT_REPORT and "pytest" not in STDOUT_REPORT


def test_junit_ids_spelled_as_the_named_parser_reads_them() -> None:
    st = {"t.py::test_a[a b]": "PASSED", "t.py::test_p[/tmp/x/f.txt]": "FAILED", "t.py::test_m[MouseButton.LEFT]":
          "PASSED"}
    assert swebench_ids(st, "parse_log_pytest") == {"t.py::test_a[a": "PASSED", "t.py::test_p[/tmp/x/f.txt]": "FAILED",
                                                    "t.py::test_m[MouseButton.LEFT]": "PASSED"}
    assert swebench_ids(st, "parse_log_pytest_options")["t.py::test_p[/f.txt]"] == "FAILED"
    assert swebench_ids(st, "parse_log_pytest_v2")["t.py::test_a[a b]"] == "PASSED"
    assert swebench_ids(st, "parse_log_matplotlib")["t.py::test_m[1]"] == "PASSED"
    assert swebench_ids(st, None) is st
    # two ids spelled alike: the worse outcome stays
    assert swebench_ids({"t::x[a b]": "PASSED", "t::x[a c]": "FAILED"}, "parse_log_pytest") == {"t::x[a": "FAILED"}
    inst = _row(FAIL_TO_PASS='["t.py::test_a[a"]', log_parser="parse_log_flask")
    assert grade(inst, ParsedTests(dict(st)), exit_code=1).resolved
    fail_only = _row(FAIL_TO_PASS='["gone", "t.py::test_p[/tmp/x/f.txt]"]', eval_type="fail_only")
    out = grade(fail_only, ParsedTests(dict(st)), exit_code=1).tests_status.FAIL_TO_PASS
    assert out == {"success": ["gone"], "failure": ["t.py::test_p[/tmp/x/f.txt]"]}


def test_stdout_report_is_kept_whole_past_the_output_cap() -> None:
    cap = OutputCap(1000, report_limit=10_000)
    lines = [f'{{"Action":"pass","Test":"T{i}"}}\n'.encode() for i in range(300)]  # ≈ 9 KB
    for ln in lines:
        cap.feed(ln)
    assert cap.truncated and "bytes dropped" in cap.text()
    whole = cap.report()
    assert whole is not None and whole.encode() == b"".join(lines)
    assert len(parse_results("go", whole, None).statuses) == 300
    over = OutputCap(1000, report_limit=2000)
    for ln in lines:
        over.feed(ln)
    assert over.report() is None and over.report_over
    assert OutputCap(1000).report() is None  # not asked for: nothing kept beyond the cap


def test_env_spec_run_keys_never_change_the_image() -> None:
    a = EnvSpec.from_dict({"python": "3.11", "test_cmd": "pytest"}, "x")
    b = EnvSpec.from_dict({"python": "3.11", "test_cmd": "pytest -x", "log_parser": "parse_log_pytest"}, "x")
    assert a == b and a.to_dict() == b.to_dict() == {"python": "3.11"}


# ------------------------------------------------------------------------------------------ real Docker


@pytest.mark.docker
def test_a_row_as_shipped_passes_through_gagar_eval(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """A SWE-bench-shaped row — no test_cmd, test_framework or language, FAIL_TO_PASS/PASS_TO_PASS as JSON
    strings, a `version` — plus a spec file holding only a test command for that version: the row gets
    `python -m pytest -rA <its test file>` and is graded through the JUnit + guard path."""
    from sandbox_fixtures import CalcTask, leftover_containers, require_docker, results_by_rollout

    from sandbox.cli import eval_main

    require_docker()
    task = CalcTask(tmp_path)
    row = {k: v for k, v in task.instance.items() if k not in ("test_cmd", "test_framework", "language")}
    row.update(version="0.1", PASS_TO_PASS=json.dumps(row["PASS_TO_PASS"]), hints_text="", created_at="2024-01-01",
               environment_setup_commit=row["base_commit"])
    assert isinstance(row["FAIL_TO_PASS"], str)
    task.instance = row
    inst, preds = task.write_inputs([{"instance_id": row["instance_id"], "rollout_id": "gold", "model_patch":
                                      row["patch"]},
                                     {"instance_id": row["instance_id"], "rollout_id": "empty", "model_patch": ""},
                                     {"instance_id": row["instance_id"], "rollout_id": "wrong", "model_patch":
                                      task.calc_patch("return a * b")}])
    specs = tmp_path / "specs.json"
    specs.write_text(json.dumps({"acme/calc": {"0.1": {"test_cmd": "python -m pytest -rA", "log_parser": "parse_log_pytest"}}}))
    argv = ["--instances", str(inst), "--predictions", str(preds), "--repos-dir", str(task.repos_dir),
            "--run-id", "asshipped", "--report-dir", str(tmp_path / "runs"), "--no-progress"]
    # without the spec: no command, refused before anything runs (exit 2, the row and the field named)
    assert eval_main([*argv, "--run-id", "noscmd"]) == 2
    assert not (tmp_path / "runs" / "noscmd" / "results.jsonl").exists()
    assert f"{row['instance_id']}: test_cmd is missing" in capsys.readouterr().err
    assert eval_main([*argv, "--env-specs", str(specs)]) == 0
    res = results_by_rollout(tmp_path / "runs" / "asshipped")
    assert res["gold"]["status"] == "resolved", res["gold"]
    assert res["gold"]["tests_status"]["FAIL_TO_PASS"]["success"] == ["tests/test_calc.py::test_add"]
    assert res["empty"]["status"] == "empty_patch" and res["wrong"]["status"] == "unresolved"
    assert not res["gold"]["suspicious_report"]
    log = (tmp_path / "runs" / "asshipped" / "logs" / row["instance_id"] / "gold" / "report")
    assert (log / "pytest-junit.xml").is_file()  # graded from the JUnit report, not from -rA lines
    assert leftover_containers("asshipped") == []


GO_TEST = """package big

import (
\t"fmt"
\t"testing"
)

func flood(name string) {
\tfor i := 0; i < 9000; i++ {
\t\tfmt.Printf("%s: line %d of the output a chatty real-world Go test prints\\n", name, i)
\t}
}

func TestA(t *testing.T) { flood("a") }

func TestB(t *testing.T) {
\tif Answer() != 42 {
\t\tt.Fatal("wrong answer")
\t}
}

func TestC(t *testing.T) { flood("c") }
"""


@pytest.mark.docker
def test_go_json_report_over_1mib_is_graded_whole(tmp_path: Path) -> None:
    """`go test -json` is the report the Go verdict is read from: over the 1 MiB output cap (≈2.8 MB here), the
    listed test whose events lie in the dropped middle is still graded (before: parsed from the capped log, TestC.s start was lost and the run was flagged suspicious)."""
    import docker
    from sandbox_fixtures import git, require_docker

    from sandbox.config import SandboxConfig
    from sandbox.records import Prediction
    from sandbox.run import evaluate_predictions

    require_docker()
    try:
        docker.from_env().images.get("gagar-go:latest")
    except docker.errors.DockerException:
        pytest.skip("gagar-go image not built (`gagar image build --all`)")
    repo = tmp_path / "repos" / "acme__big"
    repo.mkdir(parents=True)
    (repo / "go.mod").write_text("module example.com/big\n\ngo 1.19\n")
    (repo / "big.go").write_text("package big\n\nfunc Answer() int { return 41 }\n")
    (repo / "big_test.go").write_text(GO_TEST)
    git(repo, "init", "-q", "-b", "main")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "base")
    base = git(repo, "rev-parse", "HEAD").strip()
    fix = ("diff --git a/big.go b/big.go\n--- a/big.go\n+++ b/big.go\n@@ -1,3 +1,3 @@\n package big\n \n"
           "-func Answer() int { return 41 }\n+func Answer() int { return 42 }\n")
    inst = Instance.from_dict({"instance_id": "acme__big-1", "repo": "acme/big", "base_commit": base, "patch": fix,
                               "test_patch": "", "FAIL_TO_PASS": ["TestB"], "PASS_TO_PASS": ["TestA", "TestC"],
                               "test_cmd": "go test -json ./...", "test_framework": "go"})
    cfg = SandboxConfig(repos_dir=tmp_path / "repos", run_id="gojson", timeout=300)
    out = evaluate_predictions({inst.instance_id: inst}, [Prediction(inst.instance_id, fix, "t", "gold"),
                                                         Prediction(inst.instance_id, "\n" + fix.replace("42", "43"),
                                                                    "t", "wrong")],
                               cfg, run_dir=tmp_path / "run")
    by = {r.rollout_id: r for r in out}
    gold = by["gold"]
    assert "bytes; output kept up to" in (gold.error or "")  # the log was capped…
    assert gold.status == "resolved", gold  # …the verdict was not
    assert gold.tests_status.FAIL_TO_PASS["success"] == ["TestB"] and not gold.suspicious_report
    assert by["wrong"].status == "unresolved" and by["wrong"].tests_status.FAIL_TO_PASS["failure"] == ["TestB"]
    kept = (tmp_path / "run" / "logs" / "acme__big-1" / "gold" / "test_output.txt").read_text()
    assert "output truncated" in kept and '"Test":"TestB"' not in kept  # TestB's events were in the dropped part


# pytest's own parametrize ids with spaces, as in pallets/flask's tests/test_cli.py (pallets__flask-5063).
_SPACED_TESTS = '''import pytest

from app import locate


@pytest.mark.parametrize("iname,aname,want", (
    ("cliapp.factory", " create_app () ", "app"),
    ("cliapp.factory", 'create_app2("foo", "bar")', "app2_foo_bar"),
    ("cliapp.app", None, "app"),
))
def test_locate_app(iname, aname, want):
    assert locate(iname, aname) == want
'''


@pytest.mark.docker
def test_ids_with_spaces_match_as_pytest_and_as_swebench_spell_them(tmp_path: Path) -> None:
    """A real pytest run in the sandbox: listed ids match whole (the JUnit name, spaces and all) and cut at the
    first whitespace (SWE-bench's `parse_log_pytest`), with the row's parser named and without one."""
    from sandbox_fixtures import commit_tree, require_docker

    from sandbox.config import SandboxConfig
    from sandbox.records import Prediction
    from sandbox.run import evaluate_predictions

    require_docker()
    repo = tmp_path / "repos" / "acme__spaced"
    broken = "def locate(iname, aname):\n    return 'nope'\n"
    fixed = "def locate(iname, aname):\n    return {None: 'app', 'create_app2(\"foo\", \"bar\")': 'app2_foo_bar'}" \
            ".get(aname, 'app')\n"
    base = commit_tree(repo, {"app.py": broken, "tests/test_cli.py": _SPACED_TESTS})
    patch = ("diff --git a/app.py b/app.py\n--- a/app.py\n+++ b/app.py\n@@ -1,2 +1,2 @@\n"
             " def locate(iname, aname):\n-    return 'nope'\n+" + fixed.split("\n")[1] + "\n")
    t = "tests/test_cli.py::test_locate_app"
    whole = [f"{t}[cliapp.factory- create_app () -app]", f'{t}[cliapp.factory-create_app2("foo", "bar")-app2_foo_bar]']
    cut = [f"{t}[cliapp.factory-", f'{t}[cliapp.factory-create_app2("foo",']
    rows = []
    for iid, parser in (("acme__spaced-1", "parse_log_flask"), ("acme__spaced-2", None)):
        for k, (f2p, p2p) in enumerate(((whole, cut), (cut, [f"{t}[cliapp.app-None-app]"]))):
            rows.append(Instance.from_dict({
                "instance_id": f"{iid}{'ab'[k]}", "repo": "acme/spaced", "base_commit": base, "patch": patch,
                "test_patch": "", "FAIL_TO_PASS": f2p, "PASS_TO_PASS": p2p, "test_cmd": "python -m pytest -rA tests",
                "test_framework": "pytest", "language": "python", **({"log_parser": parser} if parser else {})}))
    preds = [Prediction(r.instance_id, patch, "gold", "gold") for r in rows]
    preds += [Prediction(r.instance_id, patch.replace("'app')", "'other')"), "wrong", "wrong") for r in rows]
    cfg = SandboxConfig(repos_dir=repo.parent, max_workers=2, timeout=120, run_id="spaced-ids")
    got = {(r.instance_id, r.rollout_id): r for r in evaluate_predictions(rows, preds, cfg)}
    for r in rows:
        gold, wrong = got[r.instance_id, "gold"], got[r.instance_id, "wrong"]
        assert gold.status == "resolved", (r.instance_id, gold.status, gold.tests_status)
        assert sorted(gold.tests_status.FAIL_TO_PASS["success"]) == sorted(r.FAIL_TO_PASS)
        # The wrong fix breaks the space-bearing `create_app ()` case: found under either spelling.
        assert wrong.status == "unresolved" and r.FAIL_TO_PASS[0] in wrong.tests_status.FAIL_TO_PASS["failure"], \
            (r.instance_id, wrong.tests_status)
