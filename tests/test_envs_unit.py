"""Environment specs, toolchain choice, build-failure attribution, validate's verdicts: no Docker needed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from sandbox.cli import eval_main, image_main
from sandbox.env.image import build_script, failure_cause
from sandbox.env.plan import EnvInputError, plan_instance
from sandbox.env.spec import EnvSpec, SpecError, load_spec_file, parse_spec_map, spec_for, translate_swebench
from sandbox.env.toolchains import ToolchainError, base_for, build_failure, parse_go_mod
from sandbox.env.validate import judge
from sandbox.records import EvalResult, Instance, TestsStatus

ROOT = Path(__file__).resolve().parents[1]
ENV_TASKS = ROOT / "examples" / "env_tasks"


def _inst(**kw) -> Instance:
    d = {"instance_id": "o__r-1", "repo": "o/r", "base_commit": "HEAD", "patch": "", "test_patch": "",
         "FAIL_TO_PASS": ["t::a"], "PASS_TO_PASS": ["t::b"], **kw}
    return Instance.from_dict(d)


def test_spec_keys_are_checked() -> None:
    s = EnvSpec.from_dict({"python": 3.11, "pip_packages": ["attrs==23.2.0"], "apt-pkgs": ["libxml2-dev"],
                           "install": "python -m pip install -e .", "test_cmd": "pytest"}, "x")
    assert s.python == "3.11" and s.apt_packages == ("libxml2-dev",) and s.install == ("python -m pip install -e .",)
    assert s.run is not None and s.run.test_cmd == ("pytest",) and "test_cmd" not in s.to_dict()
    with pytest.raises(SpecError, match="unknown env spec key.*'pyhton'"):
        EnvSpec.from_dict({"pyhton": "3.11"}, "x")
    with pytest.raises(SpecError, match="`python` must be a version"):
        EnvSpec.from_dict({"python": "latest"}, "x")
    with pytest.raises(SpecError, match="pip_packages"):
        EnvSpec.from_dict({"pip_packages": [1]}, "x")
    with pytest.raises(SpecError, match="repo-relative requirements file"):
        EnvSpec.from_dict({"packages": "../reqs.txt"}, "x")
    # SWE-bench's conda package list is installed with pip (where PyPI has it), not refused.
    assert EnvSpec.from_dict({"packages": "numpy 'pandas<2'"}, "x").conda_packages == ("numpy", "pandas<2")
    with pytest.raises(SpecError, match="not a Debian package"):
        EnvSpec.from_dict({"apt_packages": ["rm -rf /"]}, "x")
    # Specs are values: the same content hashes the same whatever the spelling.
    assert EnvSpec.from_dict({"python": "3.11", "install": ["a"]}, "x") == EnvSpec.from_dict(
        {"install": "a", "python": 3.11}, "y")


def test_spec_map_shape_and_lookup(tmp_path: Path) -> None:
    m = parse_spec_map({"o/r": {"1.0": {"python": "3.11"}}}, "f")
    assert spec_for(_inst(version="1.0"), m).python == "3.11"
    assert spec_for(_inst(version="2.0"), m) is None
    assert spec_for(_inst(version="1.0", env={"python": "3.13"}), m).python == "3.13"  # the instance's own wins
    for bad in ([], {"o/r": {"python": "3.11"}}, {"norepo": {"1": {}}}, {"o/r": []}):
        with pytest.raises(SpecError, match="documented shape|an env spec must be"):
            parse_spec_map(bad, "f")
    f = tmp_path / "s.json"
    f.write_text("{not json")
    with pytest.raises(SpecError, match="not valid JSON"):
        load_spec_file(f)
    assert load_spec_file(ENV_TASKS / "env_specs.json")["acme/verpin"]["0.3"].packages == "requirements-test.txt"


def test_swebench_specs_translate_or_explain() -> None:
    ours, lost = translate_swebench({"python": "3.9", "packages": "numpy scipy pytest", "pip_packages": ["six"],
                                     "install": "python -m pip install -e .", "pre_install": ["conda install x"],
                                     "test_cmd": "pytest -rA"})
    assert ours["pre_install"] == [] and lost == ["pre_install uses conda: 'conda install x'"]
    s = EnvSpec.from_dict(ours, "x")
    assert s.conda_packages == ("numpy", "scipy", "pytest") and s.pip_packages == ("six",)
    assert s.run.test_cmd == ("pytest -rA",)
    try:
        import swebench  # noqa: F401
    except ImportError:
        with pytest.raises(SpecError, match="not installed.*swebench>=2,<=4.1.0"):
            load_spec_file("swebench")


def test_toolchain_choice() -> None:
    assert base_for("python", "3.11") == ("gagar-python", "3.11")
    assert base_for("python", "3.13.1") == ("gagar-python-trixie", "3.13")
    assert base_for("python", "3.9") == ("gagar-python-bullseye", "3.9")
    with pytest.raises(ToolchainError, match=r"python 3\.12 .*offered: 3\.9 \(bullseye\), 3\.11 \(bookworm\), 3\.13 \(trixie\)"):
        base_for("python", "3.12")
    assert base_for("go", "1.17") == ("gagar-go", "1.19")
    assert base_for("go", "1.21.0") == ("gagar-go-trixie", "1.24")
    with pytest.raises(ToolchainError, match="newer than any base"):
        base_for("go", "1.26")
    assert base_for("java", "11") == ("gagar-java", "17") and base_for("java", "21")[0] == "gagar-java-trixie"
    assert base_for("go", None) == ("gagar-go", "1.19")


def test_parse_go_mod() -> None:
    m = parse_go_mod("module x\n\ngo 1.21.0\n\ntoolchain go1.22.3\n\nrequire (\n\tgolang.org/x/text v0.14.0 "
                     "// indirect\n\tgithub.com/a/b v1.0.0\n)\nrequire c.io/d v2.0.0\n")
    assert (m.go, m.toolchain, m.wanted) == ("1.21.0", "1.22.3", "1.22.3")
    assert m.requires == ("golang.org/x/text", "github.com/a/b", "c.io/d")
    assert parse_go_mod("module x\n").wanted is None


def test_build_failure_blames_the_environment_only_when_the_patch_did_not_cause_it() -> None:
    too_old = "go: go.mod requires go >= 1.21 (running go 1.19.8; GOTOOLCHAIN=local)\n"
    assert "toolchain too old" in build_failure("go", too_old, tests_ran=False)
    assert build_failure("go", too_old, tests_ran=False, patch_paths=["go.mod"]) is None
    assert build_failure("go", too_old, tests_ran=True) is None  # tests ran: a test printed it
    unreadable = "go: errors parsing go.mod:\n/testbed/go.mod:3: invalid go version '1.21.0': must match format 1.23"
    assert "which this Go cannot read" in build_failure("go", unreadable, tests_ran=False)
    slog = '{"Action":"build-output","Output":"./handler.go:5:2: package log/slog is not in GOROOT (/usr/lib/go)\\n"}'
    assert "log/slog" in build_failure("go", slog, tests_ran=False)
    assert build_failure("go", slog, tests_ran=False, patch_paths=["handler.go"]) is None
    assert build_failure("go", "x.go:3:2: package foo/bar is not in GOROOT", tests_ran=False) is None
    missing = "x.go:4:2: no required module provides package github.com/a/b/sub; to add it:\n"
    assert "missing Go module" in build_failure("go", missing, tests_ran=False, declared_modules=("github.com/a/b",))
    assert build_failure("go", missing, tests_ran=False, declared_modules=("github.com/c/d",)) is None
    assert "Java 21" in build_failure("junit", "error: release version 21 not supported", tests_ran=False)
    assert build_failure("pytest", too_old, tests_ran=False) is None


def test_failure_cause_names_the_problem() -> None:
    assert failure_cause("== pip_packages: nope==1\nERROR: No matching distribution found for nope==1\n") == \
        "pip cannot find nope==1 on the package index"
    assert failure_cause("== apt: libfoo\nE: Unable to locate package libfoo\n") == "apt cannot find package libfoo"
    assert failure_cause("== install: make\nmake: *** No rule\n") == "step `install: make` failed: make: *** No rule"


def test_build_script_quotes_and_orders_steps(tmp_path: Path) -> None:
    from sandbox.env.plan import EnvPlan

    spec = EnvSpec.from_dict({"python": "3.11", "pre_install": ["echo pre"], "apt_packages": ["libxml2-dev"],
                              "packages": "req.txt", "pip_packages": ["a>=1; python_version>'3'"],
                              "install": "python -m pip install -e ."}, "x")
    s = build_script(EnvPlan("o/r", tmp_path, "c" * 40, "python", "gagar-python", "3.11", spec))
    order = [s.index(k) for k in ("echo pre", "apt-get install", "venv --system", "-r req.txt",
                                  "'a>=1; python_version>'\"'\"'3'\"'\"''", "pip install -e .",
                                  "find /testbed -mindepth 1 -delete")]
    assert order == sorted(order)
    assert "/etc/profile.d/" in s  # the sandbox's login shell keeps the venv on PATH


def _result(rid: str, f2p_ok: list[str], f2p_bad: list[str], p2p_ok: list[str], p2p_bad: list[str],
            status: str = "unresolved") -> EvalResult:
    return EvalResult("o__r-1", "m", rid, status, tests_status=TestsStatus(
        FAIL_TO_PASS={"success": f2p_ok, "failure": f2p_bad}, PASS_TO_PASS={"success": p2p_ok, "failure": p2p_bad}))


def test_validate_judge() -> None:
    inst = _inst(patch="diff", PASS_TO_PASS=["t::b", "t::flaky"])
    good = [_result(f"base-{k}", [], ["t::a"], ["t::b", "t::flaky"], []) for k in (1, 2)] + \
           [_result(f"gold-{k}", ["t::a"], [], ["t::b", "t::flaky"], [], "resolved") for k in (1, 2)]
    assert judge(inst, good, False)["valid"]
    flaky = good[:3] + [_result("gold-2", ["t::a"], [], ["t::b"], ["t::flaky"])]
    v = judge(inst, flaky, False)
    assert not v["valid"] and v["flaky"] == ["t::flaky"] and any("flaky" in r for r in v["reasons"])
    v = judge(inst, flaky, True)
    assert v["valid"] and v["PASS_TO_PASS"] == ["t::b"]
    never_fails = [_result("base-1", ["t::a"], [], ["t::b", "t::flaky"], []), *good[2:]]
    assert judge(inst, never_fails, False)["f2p_pass_without_fix"] == ["t::a"]
    broken = [*good[:2], _result("gold-1", ["t::a"], [], ["t::flaky"], ["t::b"]),
              _result("gold-2", ["t::a"], [], ["t::flaky"], ["t::b"])]
    assert judge(inst, broken, False)["p2p_fail_with_gold"] == ["t::b"]
    infra = [*good[:2], EvalResult("o__r-1", "m", "gold-1", "infra_error", error="env image failed: x (log: /l)")]
    v = judge(inst, infra, False)
    assert not v["valid"] and "env image failed" in v["reasons"][0]


@pytest.fixture(scope="module")
def env_tasks(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("env-tasks")
    subprocess.run([sys.executable, str(ROOT / "examples" / "build_tasks.py"), "--tasks-dir", str(ENV_TASKS),
                    "--out", str(out)], check=True, capture_output=True)
    return out


def _rows(tasks: Path) -> list[dict]:
    return [json.loads(ln) for ln in (tasks / "instances.jsonl").read_text().splitlines()]


def _write(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_planning_shares_images_and_checks_input(env_tasks: Path, tmp_path: Path) -> None:
    rows = {r["instance_id"]: r for r in _rows(env_tasks)}
    specs = load_spec_file(ENV_TASKS / "env_specs.json")
    conf = Instance.from_dict(rows["acme__confkit-77"])
    t = plan_instance(conf, env_tasks / "repos", specs)
    assert t.plan is not None and t.image == t.plan.ref and t.image.startswith("gagar-env-acme-confkit:")
    twin = Instance.from_dict({**rows["acme__confkit-77"], "instance_id": "acme__confkit-78"})
    assert plan_instance(twin, env_tasks / "repos", specs).image == t.image  # one image per spec
    changed = Instance.from_dict({**rows["acme__confkit-77"], "env": {"python": "3.11", "pip_packages": ["six"]}})
    assert plan_instance(changed, env_tasks / "repos", specs).image != t.image
    assert plan_instance(Instance.from_dict(rows["acme__verpin-12"]), env_tasks / "repos", specs).plan.spec.install
    assert plan_instance(Instance.from_dict(rows["acme__retrykit-5"]), env_tasks / "repos", specs).plan is None
    bad = Instance.from_dict({**rows["acme__confkit-77"], "env": {"packages": "requirements-nope.txt"}})
    with pytest.raises(EnvInputError, match="requirements-nope.txt.*does not exist"):
        plan_instance(bad, env_tasks / "repos", specs)
    with pytest.raises(EnvInputError, match="python 3.10 is not offered"):
        plan_instance(Instance.from_dict({**rows["acme__confkit-77"], "env": {"python": "3.10"}}),
                      env_tasks / "repos", specs)


def test_go_toolchain_from_go_mod(tmp_path: Path) -> None:
    repo = tmp_path / "repos" / "o__g"
    repo.mkdir(parents=True)

    def commit(files: dict[str, str]) -> str:
        from sandbox_fixtures import commit_tree
        return commit_tree(repo, files)

    def plan(c: str, **kw):
        return plan_instance(Instance.from_dict({"instance_id": "g-1", "repo": "o/g", "base_commit": c,
                                                 "test_framework": "go", **kw}), tmp_path / "repos")

    old = commit({"go.mod": "module o/g\n\ngo 1.18\n"})
    assert plan(old).image == "gagar-go:latest" and plan(old).plan is None
    new = commit({"go.mod": "module o/g\n\ngo 1.21.0\n"})
    t = plan(new)
    assert t.image == "gagar-go-trixie:latest" and t.base == "gagar-go-trixie" and t.plan is None
    assert plan(new, env={"go": "1.19"}).image == "gagar-go:latest"  # env.go beats go.mod; nothing to install
    deps = commit({"go.mod": "module o/g\n\ngo 1.22\n\nrequire github.com/a/b v1.0.0\n"})
    t = plan(deps)
    assert t.plan is not None and t.plan.go_download and t.plan.base == "gagar-go-trixie"
    vend = commit({"vendor/modules.txt": "# github.com/a/b v1.0.0\n"})
    t = plan(vend)
    assert t.plan is None and t.test_env == {"GOFLAGS": "-mod=vendor"}
    with pytest.raises(EnvInputError, match="go 1.99 is newer than any base image offers.*asked by go.mod"):
        plan(commit({"go.mod": "module o/g\n\ngo 1.99\n"}))


def test_bad_env_input_exits_2(env_tasks: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    rows = _rows(env_tasks)
    preds = _write(tmp_path / "p.jsonl", [{"instance_id": rows[0]["instance_id"], "model_patch": "x"}])
    base = ["--predictions", str(preds), "--repos-dir", str(env_tasks / "repos"), "--run-id", "r",
            "--report-dir", str(tmp_path / "out")]
    unknown = _write(tmp_path / "i1.jsonl", [{**rows[0], "env": {"python": "3.11", "pip": ["x"]}}])
    assert eval_main(["--instances", str(unknown), *base]) == 2
    assert "unknown env spec key(s) 'pip'" in capsys.readouterr().err
    shape = tmp_path / "specs.json"
    shape.write_text(json.dumps({"acme/verpin": {"python": "3.11"}}))
    assert eval_main(["--instances", str(env_tasks / "instances.jsonl"), "--env-specs", str(shape), *base]) == 2
    assert "documented shape" in capsys.readouterr().err
    ib = ["--repos-dir", str(env_tasks / "repos")]
    missing = _write(tmp_path / "i2.jsonl", [{**rows[0], "env": {"packages": "nope.txt"}}])
    assert image_main(["build", "--instances", str(missing), *ib]) == 2
    assert "'nope.txt' does not exist" in capsys.readouterr().err
    py = _write(tmp_path / "i3.jsonl", [{**rows[0], "env": {"python": "3.12"}}])
    assert image_main(["build", "--instances", str(py), *ib]) == 2
    assert "python 3.12 is not offered by any base image; offered: 3.9 (bullseye), 3.11 (bookworm), 3.13 (trixie)" in \
        capsys.readouterr().err
