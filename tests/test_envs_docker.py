"""Environment images end to end on the bundled env tasks (examples/env_tasks): built from their specs with pip
packages from the registry, gold resolves there and fails in the plain base image, a missing dependency is an
infra_error naming it, the build is cached and locked, validate flags the planted flaky tests.

The two env images (≈40 s each on a quiet machine, a few minutes under load) are built once per machine: their
tags are content hashes, so later runs find them. The trixie toolchain images are exercised with GAGAR_FULL=1.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from sandbox_fixtures import require_docker

from sandbox.cli import eval_main, image_main
from sandbox.env.images import RECIPES
from sandbox.env.spec import load_spec_file
from sandbox.env.validate import main as validate_main
from sandbox.records import Instance

pytestmark = pytest.mark.docker
ROOT = Path(__file__).resolve().parents[1]
ENV_TASKS = ROOT / "examples" / "env_tasks"
SPECS = str(ENV_TASKS / "env_specs.json")
MAIN = ("acme__confkit-77", "acme__verpin-12")


@pytest.fixture(scope="module")
def tasks(tmp_path_factory: pytest.TempPathFactory) -> Path:
    require_docker()
    out = tmp_path_factory.mktemp("env-tasks")
    subprocess.run([sys.executable, str(ROOT / "examples" / "build_tasks.py"), "--tasks-dir", str(ENV_TASKS),
                    "--out", str(out)], check=True, capture_output=True)
    return out


def _jsonl(p: Path) -> list[dict]:
    return [json.loads(ln) for ln in p.read_text().splitlines() if ln.strip()]


def _write(p: Path, rows: list[dict]) -> Path:
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return p


def _eval(tasks: Path, out: Path, run: str, instances: Path, preds: list[dict], *extra: str) -> dict:
    pp = _write(out / f"{run}-preds.jsonl", preds)
    rc = eval_main(["--instances", str(instances), "--predictions", str(pp), "--repos-dir", str(tasks / "repos"),
                    "--run-id", run, "--report-dir", str(out), "--env-specs", SPECS, "--no-progress", *extra])
    assert rc == 0
    return {(r["instance_id"], r["rollout_id"]): r for r in _jsonl(out / run / "results.jsonl")}


@pytest.fixture(scope="module")
def built(tasks: Path) -> Path:
    """`gagar image build --instances` once (a cache hit on a machine that built these specs before)."""
    rc = image_main(["build", "--instances", str(tasks / "instances.jsonl"), "--repos-dir", str(tasks / "repos"),
                     "--env-specs", SPECS, "--max-workers", "2"])
    assert rc == 0
    return tasks


def test_env_images_resolve_gold_and_base_image_fails(built: Path, tmp_path: Path, capsys) -> None:
    tasks = built
    preds = [p for p in _jsonl(tasks / "predictions.jsonl") if p["instance_id"] in MAIN]
    expected = {(e["instance_id"], e["rollout_id"]): e for e in _jsonl(tasks / "expected.jsonl")}
    res = _eval(tasks, tmp_path, "env", tasks / "instances.jsonl", preds)
    assert {k: r["status"] for k, r in res.items()} == {k: expected[k]["status"] for k in res}
    assert sum(r["resolved"] for r in res.values()) == 4  # gold + minimal of both tasks
    # The same gold patches in the plain base image: cattrs / tomlkit / the installed package are missing.
    gold = [p for p in preds if p["rollout_id"] == "gold"]
    base = _eval(tasks, tmp_path, "base", tasks / "instances.jsonl", gold, "--image", "gagar-python:latest")
    assert [r["status"] for r in base.values()] == ["unresolved", "unresolved"]
    # A second build is a cache hit: nothing rebuilt.
    capsys.readouterr()
    assert image_main(["build", "--instances", str(tasks / "instances.jsonl"), "--repos-dir",
                       str(tasks / "repos"), "--env-specs", SPECS]) == 0
    assert capsys.readouterr().out.count("up to date") == 2
    # `image ls` names the users of each env image.
    assert image_main(["ls", "--instances", str(tasks / "instances.jsonl"), "--repos-dir", str(tasks / "repos"),
                       "--env-specs", SPECS, "--json"]) == 0
    rows = {r["image"]: r for r in map(json.loads, capsys.readouterr().out.splitlines())}
    used = {i for r in rows.values() if r["kind"] == "env" for i in r["used_by"]}
    assert used == set(MAIN) and rows[f"gagar-python:{RECIPES['gagar-python'].tag}"]["used_by"] == ["acme__retrykit-5"]


def test_missing_dependency_is_an_infra_error_naming_it(built: Path, tmp_path: Path) -> None:
    tasks = built
    row = next(r for r in _jsonl(tasks / "instances.jsonl") if r["instance_id"] == "acme__confkit-77")
    row["env"] = {"python": "3.11", "pip_packages": ["attrs==23.2.0", "gagar-no-such-package-4711==1.0"]}
    inst = _write(tmp_path / "i.jsonl", [row])
    preds = [{"instance_id": row["instance_id"], "rollout_id": r, "model_patch": row["patch"]} for r in ("a", "b")]
    res = _eval(tasks, tmp_path, "missing", inst, preds)
    errors = {r["error"] for r in res.values()}
    assert {r["status"] for r in res.values()} == {"infra_error"} and len(errors) == 1  # built (tried) once
    err = errors.pop()
    assert "pip cannot find gagar-no-such-package-4711==1.0" in err
    log = Path(err.rsplit("(log: ", 1)[1].rstrip(")"))
    assert log.is_file() and "No matching distribution" in log.read_text()
    assert log.parent == tmp_path / "missing" / "env-builds"


def test_concurrent_builds_of_one_image_build_it_once(built: Path) -> None:
    import docker

    from sandbox.env.image import build_env_image
    from sandbox.env.plan import plan_instance

    tasks = built
    row = next(r for r in _jsonl(tasks / "instances.jsonl") if r["instance_id"] == "acme__retrykit-5")
    # A spec no other test uses (a venv and nothing else), so this test really builds it.
    inst = Instance.from_dict({**row, "env": {"python": "3.11", "pre_install": [f"echo {os.getpid()}"]}})
    plan = plan_instance(inst, tasks / "repos", None).plan
    client = docker.from_env(timeout=900)
    outcomes: list[bool] = []
    msgs: list[str] = []

    def one() -> None:
        outcomes.append(build_env_image(plan, client=docker.from_env(timeout=900), say=msgs.append)[1])

    threads = [threading.Thread(target=one) for _ in range(2)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert sorted(outcomes) == [False, True], msgs
        assert any("built meanwhile by another run" in m for m in msgs)
    finally:
        try:
            client.images.remove(plan.ref)
        except docker.errors.DockerException:
            pass


def test_validate_flags_planted_flaky_tests(built: Path, tmp_path: Path) -> None:
    tasks = built
    args = ["--instances", str(tasks / "instances.jsonl"), "--repos-dir", str(tasks / "repos"), "--env-specs",
            SPECS, "--out", str(tmp_path / "v")]
    assert validate_main(args) == 0
    rep = json.loads((tmp_path / "v" / "validate_report.json").read_text())
    assert sorted(r["instance_id"] for r in _jsonl(tmp_path / "v" / "validated.jsonl")) == sorted(MAIN)
    flaky = rep["per_instance"]["acme__retrykit-5"]["flaky"]
    # 8 planted tests, each passing half the time: a miss needs 6 equal outcomes (p = 1/32) for all 8 at once.
    assert flaky and all("test_jitter_stays_small" in t for t in flaky)
    assert rep["invalid_ids"] == ["acme__retrykit-5"] and rep["per_instance"]["acme__confkit-77"]["runs"] == {
        "base": ["unresolved"] * 3, "gold": ["resolved"] * 3}
    # --drop-flaky reuses the same runs (nothing re-evaluated) and removes the flagged tests from the lists.
    assert validate_main([*args, "--drop-flaky"]) == 0
    rows = {r["instance_id"]: r for r in _jsonl(tmp_path / "v" / "validated.jsonl")}
    if "acme__retrykit-5" in rows:
        assert not set(flaky) & set(rows["acme__retrykit-5"]["PASS_TO_PASS"])
    assert set(MAIN) <= set(rows)


def test_prune_keeps_what_instance_files_need(built: Path, tmp_path: Path, capsys) -> None:
    tasks = built
    only_conf = _write(tmp_path / "i.jsonl", [r for r in _jsonl(tasks / "instances.jsonl")
                                             if r["instance_id"] == "acme__confkit-77"])
    capsys.readouterr()
    assert image_main(["prune", "--instances", str(only_conf), "--repos-dir", str(tasks / "repos"),
                       "--env-specs", SPECS, "--dry-run"]) == 0
    out = capsys.readouterr().out
    # Exactly the image confkit needs is kept; verpin's goes. (The engine may hold other env images — older
    # confkit builds among them — which are rightly prunable too, so names alone prove nothing.)
    assert "would remove" in out and "gagar-env-acme-verpin:" in out and "kept 1" in out
    assert load_spec_file(SPECS)  # the spec file is untouched by all this


@pytest.mark.slow
@pytest.mark.skipif(not os.environ.get("GAGAR_FULL"), reason="builds the trixie toolchain image (GAGAR_FULL=1)")
def test_python_313_env_on_trixie(built: Path, tmp_path: Path) -> None:
    tasks = built
    row = next(r for r in _jsonl(tasks / "instances.jsonl") if r["instance_id"] == "acme__confkit-77")
    row["env"] = {**row["env"], "python": "3.13"}
    res = _eval(tasks, tmp_path, "py313", _write(tmp_path / "i.jsonl", [row]),
                [{"instance_id": row["instance_id"], "rollout_id": "gold", "model_patch": row["patch"]}])
    assert [r["status"] for r in res.values()] == ["resolved"]


GO_MOD = "module example.com/sorted\n\ngo 1.21.0\n"
GO_SRC = ('package sorted\n\nimport "slices"\n\n// Top returns the n largest values, largest first.\n'
          'func Top(xs []int, n int) []int {\n\tys := slices.Clone(xs)\n\tslices.Sort(ys)\n'
          '\tslices.Reverse(ys)\n\treturn ys[:n]\n}\n')
GO_TEST = ('package sorted\n\nimport "testing"\n\nfunc TestTop(t *testing.T) {\n'
           '\tif got := Top([]int{3, 1, 2}, 2); got[0] != 3 || got[1] != 2 {\n\t\tt.Fatal(got)\n\t}\n}\n')
GO_NEW_TEST = GO_TEST + ('\nfunc TestTopMoreThanLen(t *testing.T) {\n'
                         '\tif got := Top([]int{1}, 3); len(got) != 1 {\n\t\tt.Fatal(got)\n\t}\n}\n')


@pytest.mark.slow
@pytest.mark.skipif(not os.environ.get("GAGAR_FULL"), reason="builds the trixie Go image (GAGAR_FULL=1)")
def test_go_toolchain_from_go_mod_and_too_old_is_infra_error(tmp_path: Path) -> None:
    """go.mod says 1.21 and the code imports `slices`: Go 1.24 (trixie) is chosen and gold resolves; forcing
    env.go 1.19 gives infra_error naming the toolchain, never a silent unresolved."""
    require_docker()
    from sandbox_fixtures import git

    repo = tmp_path / "repos" / "ex__sorted"
    repo.mkdir(parents=True)
    (repo / "go.mod").write_text(GO_MOD)
    (repo / "top.go").write_text(GO_SRC)
    (repo / "top_test.go").write_text(GO_TEST)
    git(repo, "init", "-q")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "base")
    base = git(repo, "rev-parse", "HEAD").strip()
    (repo / "top_test.go").write_text(GO_NEW_TEST)
    test_patch = git(repo, "diff")
    git(repo, "checkout", "-q", "--", ".")
    (repo / "top.go").write_text(GO_SRC.replace("return ys[:n]", "return ys[:min(n, len(ys))]"))
    gold = git(repo, "diff")
    git(repo, "checkout", "-q", "--", ".")
    row = {"instance_id": "ex__sorted-1", "repo": "ex/sorted", "base_commit": base, "patch": gold,
           "test_patch": test_patch, "FAIL_TO_PASS": ["TestTopMoreThanLen"], "PASS_TO_PASS": ["TestTop"],
           "test_cmd": "go test -json ./...", "test_framework": "go", "language": "go"}
    out = tmp_path / "out"
    preds = [{"instance_id": "ex__sorted-1", "rollout_id": "gold", "model_patch": gold}]
    for run, inst, want in (("new", row, "resolved"), ("old", {**row, "env": {"go": "1.19"}}, "infra_error")):
        ii, pp = _write(tmp_path / f"{run}-i.jsonl", [inst]), _write(tmp_path / f"{run}-p.jsonl", preds)
        assert eval_main(["--instances", str(ii), "--predictions", str(pp), "--repos-dir", str(tmp_path / "repos"),
                          "--run-id", run, "--report-dir", str(out), "--no-progress"]) == 0
        [r] = _jsonl(out / run / "results.jsonl")
        assert r["status"] == want, r
        if want == "infra_error":
            assert "toolchain too old" in r["error"], r["error"]


def test_a_legacy_editable_install_is_importable_under_swebench_s_pytest_command(tmp_path: Path) -> None:
    """A `setup.py develop` install (egg-link + easy-install.pth → /testbed/src, pip 23.0.1 and setuptools 70 as
    SWE-bench's older Python specs have them) with pytest only in the base image: SWE-bench's command `pytest -rA`
    must run under the environment's interpreter, or conftest.py cannot import the package (exit 4)."""
    from sandbox_fixtures import commit_tree

    from sandbox.config import SandboxConfig
    from sandbox.env.plan import plan_instance
    from sandbox.records import Prediction
    from sandbox.run import evaluate_predictions

    require_docker()
    repo = tmp_path / "repos" / "acme__legacy"
    base = commit_tree(repo, {
        "setup.py": "from setuptools import find_packages, setup\n\nsetup(name='legacypkg', version='0.1', "
                    "package_dir={'': 'src'}, packages=find_packages('src'))\n",
        "src/legacypkg/__init__.py": "def add(a, b):\n    return a - b\n",
        "tests/conftest.py": "import legacypkg  # noqa: F401 (as flask's tests/conftest.py imports flask)\n",
        "tests/test_add.py": "from legacypkg import add\n\n\ndef test_add():\n    assert add(1, 2) == 3\n\n\n"
                             "def test_zero():\n    assert add(0, 0) == 0\n"})
    patch = ("diff --git a/src/legacypkg/__init__.py b/src/legacypkg/__init__.py\n--- a/src/legacypkg/__init__.py\n"
             "+++ b/src/legacypkg/__init__.py\n@@ -1,2 +1,2 @@\n def add(a, b):\n-    return a - b\n+    return a + b\n")
    rows = [Instance.from_dict({
        "instance_id": f"acme__legacy-{k}", "repo": "acme/legacy", "base_commit": base, "patch": patch,
        "test_patch": "", "FAIL_TO_PASS": ["tests/test_add.py::test_add"], "PASS_TO_PASS": ["tests/test_add.py::test_zero"],
        "test_cmd": cmd, "test_framework": "pytest", "language": "python", "version": "0.1",
        "env": {"python": "3.11", "pip_packages": ["setuptools==70.0.0"], "install": ["python -m pip install -e ."]}})
        for k, cmd in (("script", "pytest -rA tests/test_add.py"), ("module", "python -m pytest -rA tests/test_add.py"))]
    cfg = SandboxConfig(repos_dir=repo.parent, max_workers=2, timeout=300, run_id="legacy-editable")
    got = evaluate_predictions(rows, [Prediction(r.instance_id, patch, "gold", "gold") for r in rows], cfg)
    assert {r.instance_id: r.status for r in got} == {"acme__legacy-script": "resolved", "acme__legacy-module": "resolved"}, \
        [(r.instance_id, r.status, r.error, r.exit_code) for r in got]
    # The image really holds the legacy install, and pip 23.0.1 made it.
    import docker

    image = plan_instance(rows[0], repo.parent, None, None).image
    out = docker.from_env().containers.run(image, ["bash", "-lc", "pip --version; ls /opt/venv/lib/python3.11/"
                                                   "site-packages; cat /opt/venv/lib/python3.11/site-packages/"
                                                   "easy-install.pth"], remove=True, network_mode="none").decode()
    assert "pip 23.0.1" in out and "legacypkg.egg-link" in out and "/testbed/src" in out, out
