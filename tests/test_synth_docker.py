"""`gagar tasks synth` end to end in the Docker sandbox, on one small local repository (a bundled task's code):
interrupted and resumed, bad inputs reported and skipped, the output read by `gagar validate` / `gagar eval`."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from sandbox_fixtures import commit_tree

from synth.statement import leaks

pytestmark = pytest.mark.docker

ROOT = Path(__file__).resolve().parents[1]
GAGAR = [sys.executable, "-m", "gagar"]


def _git_repo(root: Path, files: dict[str, str] | None = None, copy: Path | None = None) -> Path:
    if copy is not None:
        shutil.copytree(copy, root)
    commit_tree(root, files)
    return root


def _results(out: Path, repo: str) -> list[dict]:
    path = out / "work" / repo / "runs" / "results.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def test_synth_resumes_after_an_interrupt_skips_bad_inputs_and_validates(tmp_path: Path) -> None:
    good = _git_repo(tmp_path / "src" / "acme__lru", copy=ROOT / "examples" / "tasks" / "py-lru" / "repo")
    notests = _git_repo(tmp_path / "src" / "acme__notests", {"lib/core.py": "def f(x):\n    return x + 1\n"})
    badenv = _git_repo(tmp_path / "src" / "acme__badenv", {"lib/core.py": "def f(x):\n    return x + 1\n",
                                                           "tests/test_core.py": "def test_f():\n    pass\n"})
    sources = {"seed": 3, "max_tasks": 3, "repeats": 2, "sources": [
        {"path": str(good), "env": {"python": "3.11"}, "tests": ["tests"]},
        {"path": str(notests)},
        {"path": str(badenv), "env": {"python": "3.11", "pip_packages": ["gagar-no-such-package==1.0"]}},
    ]}
    (tmp_path / "sources.json").write_text(json.dumps(sources))
    out = tmp_path / "out"
    cmd = [*GAGAR, "tasks", "synth", "--sources", str(tmp_path / "sources.json"), "--out", str(out),
           "--max-workers", "2", "--quiet"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}

    # 1. Interrupted once the screening has started (baseline, suite repeat and some candidates are recorded).
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 600
    while len(_results(out, "acme__lru")) < 4 and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    assert proc.poll() is None, f"finished before it could be interrupted:\n{proc.stdout.read().decode()[-3000:]}"
    proc.send_signal(signal.SIGINT)
    output = proc.communicate(timeout=300)[0].decode()
    assert proc.returncode == 130, output[-3000:]
    before = {(r["instance_id"], r["rollout_id"]) for r in _results(out, "acme__lru") if r["status"] != "infra_error"}
    assert not (out / "instances.jsonl").exists()

    # 2. The re-run resumes: nothing finished is run again, every run is recorded once.
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "--redo" not in done.stderr, done.stderr[-3000:]  # gagar eval's resume notes name an option synth lacks
    manifest = json.loads((out / "manifest.json").read_text())
    by_repo = {s["repo"]: s for s in manifest["sources"]}
    lru = by_repo["acme/lru"]
    assert lru["status"] == "ok" and lru["stats"]["tasks"] == 3, lru
    keys = [(r["instance_id"], r["rollout_id"]) for r in _results(out, "acme__lru")]
    assert len(keys) == len(set(keys)) and before <= set(keys)
    assert lru["stats"]["runs"] == len(set(keys) - before)
    # Bad inputs: reported with the reason, the run went on.
    assert by_repo["acme/notests"]["status"] == "skipped" and "ships no tests" in by_repo["acme/notests"]["reason"]
    assert by_repo["acme/badenv"]["status"] == "skipped"
    assert "environment does not build" in by_repo["acme/badenv"]["reason"]
    assert "gagar-no-such-package" in by_repo["acme/badenv"]["reason"]

    # 3. The instances: SWE-bench shape, the statement never quotes the fix, ids and splits as documented.
    rows = [json.loads(line) for line in (out / "instances.jsonl").read_text().splitlines()]
    assert len(rows) == 3
    for row in rows:
        assert row["instance_id"].startswith("acme__lru-synth-") and row["repo"] == "acme/lru"
        assert row["test_patch"] == "" and row["patch"].startswith("diff --git a/cachetools_lite/")
        assert 1 <= len(row["FAIL_TO_PASS"]) <= 50 and not set(row["FAIL_TO_PASS"]) & set(row["PASS_TO_PASS"])
        assert row["environment_setup_commit"] != row["base_commit"]
        assert leaks(row["problem_statement"], row["patch"]) == []
        assert all(t in row["problem_statement"] for t in row["FAIL_TO_PASS"][:5])
        # The bundled task's own failing tests fail at the base: never listed.
        assert "tests/test_lru.py::test_capacity_is_respected" not in row["FAIL_TO_PASS"] + row["PASS_TO_PASS"]
    splits = json.loads((out / "splits.json").read_text())
    assert splits["repos"] == {"train": ["acme/lru"], "heldout": []}
    assert sorted(splits["train"]) == sorted(r["instance_id"] for r in rows)

    # 4. A third run has nothing left to run and writes the same set.
    first = (out / "instances.jsonl").read_bytes()
    again = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr[-3000:]
    assert json.loads((out / "manifest.json").read_text())["sources"][0]["stats"]["runs"] == 0
    assert (out / "instances.jsonl").read_bytes() == first

    # 5. The repositories rebuilt from the set alone (no test run): the same commits, the same patches; a set
    # whose patch was edited is refused.
    rebuilt = subprocess.run([*GAGAR, "tasks", "repos", str(out), "--out", str(tmp_path / "rebuilt")], cwd=ROOT,
                             env=env, capture_output=True, text=True, timeout=300)
    assert rebuilt.returncode == 0 and "all as in the set" in rebuilt.stderr, rebuilt.stderr[-3000:]
    for row in rows:
        ref = f"refs/heads/{row['instance_id']}"  # its branch
        shas = [subprocess.run(["git", "-C", str(d / "repos" / "acme__lru"), "rev-parse", ref], capture_output=True,
                               text=True, check=True).stdout.strip() for d in (out, tmp_path / "rebuilt")]
        assert shas == [row["base_commit"]] * 2
    tampered = tmp_path / "tampered"
    shutil.copytree(out, tampered, ignore=shutil.ignore_patterns("repos", "work"))
    rows[0]["patch"] = rows[0]["patch"].replace("\n-", "\n-#", 1)
    (tampered / "instances.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    bad = subprocess.run([*GAGAR, "tasks", "repos", str(tampered), "--out", str(tmp_path / "rebuilt")], cwd=ROOT,
                         env=env, capture_output=True, text=True, timeout=300)
    assert bad.returncode == 1 and f"{rows[0]['instance_id']}: the revert differs" in bad.stderr, bad.stderr[-2000:]

    # 6. `gagar validate` (the evaluation path of `gagar eval`, repos read from DIR/repos): every task holds.
    val = subprocess.run([*GAGAR, "validate", "--instances", str(out / "instances.jsonl"), "--repos-dir",
                          str(out / "repos"), "--out", str(tmp_path / "val"), "--repeats", "1", "--max-workers", "2"],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert val.returncode == 0, val.stderr[-3000:]
    report = json.loads((tmp_path / "val" / "validate_report.json").read_text())
    assert report["valid"] == 3, json.dumps(report["per_instance"], indent=1)[-3000:]


def test_group_runs_stop_an_endless_loop_by_cpu_time_and_drop_a_bug_that_makes_a_test_wait(tmp_path: Path) -> None:
    """The two load-independent screening rules, through the real sandbox: an endless loop is stopped at the
    command's CPU limit (`ulimit -t`) and dropped as `cpu limit`, not at a wall-clock limit that depends on the
    load; a bug that makes a test wait (no CPU used, so no CPU limit stops it) is dropped as `slow`; an ordinary
    bug is kept."""
    from sandbox.env.validate import NOOP_PATCH
    from sandbox.records import Instance, Prediction
    from sandbox.run import evaluate_predictions
    from synth import validate as val

    base_src = "import time\n\n\ndef add(a, b):\n    return a + b\n\n\ndef echo(x):\n    return x\n"
    repo = _git_repo(tmp_path / "repos" / "acme__lru", {
        "lib/__init__.py": "", "lib/core.py": base_src,
        "tests/test_core.py": "from lib.core import add, echo\n\n\ndef test_add():\n    assert add(1, 2) == 3\n\n\n"
                              "def test_echo():\n    assert echo(1) == 1\n"})
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True, check=True).stdout

    def patch(new_src: str) -> str:
        (repo / "lib" / "core.py").write_text(new_src)
        diff = subprocess.run(["git", "diff"], cwd=repo, capture_output=True, text=True, check=True).stdout
        (repo / "lib" / "core.py").write_text(base_src)
        return diff

    bugs = {"spin": patch(base_src.replace("return a + b", "while True:\n        a += b")),
            "wait": patch(base_src.replace("return x\n", "time.sleep(6)\n    return x + 1\n")),
            "plain": patch(base_src.replace("a + b", "a - b"))}
    env = {"python": "3.11", "pip_packages": [*val.COVERAGE_PINS, *val.SEED_PINS]}  # the image of the test above
    cmd = val.pytest_cmd([], ["tests/test_core.py"], cpu_limit=3)
    assert cmd.startswith("ulimit -c 0 -S -t 3 && ulimit -H -t 8 && PYTHONHASHSEED=0 python -m pytest")
    tests = ["tests/test_core.py::test_add", "tests/test_core.py::test_echo"]
    inst = Instance(instance_id="acme__lru-cpu", repo="acme/lru", base_commit=head.strip(), patch="", test_patch="",
                    FAIL_TO_PASS=[], PASS_TO_PASS=tests, test_cmd=cmd, test_framework="pytest", language="python",
                    environment_setup_commit=head.strip(), env=env)
    preds = [Prediction(inst.instance_id, NOOP_PATCH, "t", "clean")]
    preds += [Prediction(inst.instance_id, p, "t", name) for name, p in bugs.items()]
    config = val.sandbox_config(tmp_path / "repos", timeout=120, max_workers=2, run_id="cpu-limit")
    t0 = time.monotonic()
    got = {r.rollout_id: r for r in evaluate_predictions([inst], preds, config, run_dir=tmp_path / "run",
                                                         require_fail_to_pass=False)}
    assert time.monotonic() - t0 < 110, "the endless loop was not stopped by its CPU limit"
    assert got["clean"].status == "resolved", got["clean"]
    base_times = val.test_times(Path(got["clean"].log_path) / "report")
    assert set(base_times) == set(tests) and max(base_times.values()) < 1

    assert val.cpu_killed(got["spin"]) and not val.cpu_killed(got["plain"]), got["spin"]
    assert val.screen_verdict(got["spin"], 50, base_times)[1].startswith("cpu limit")
    fail, why = val.screen_verdict(got["wait"], 50, base_times)
    assert why is not None and why.startswith("slow: tests/test_core.py::test_echo took"), why
    assert val.screen_verdict(got["wait"], 50, None) == (["tests/test_core.py::test_echo"], None)  # no times: kept
    assert val.screen_verdict(got["plain"], 50, base_times) == (["tests/test_core.py::test_add"], None)


def test_tests_that_follow_the_clock_are_never_listed_nor_quoted(tmp_path: Path) -> None:
    """Found by behaviour, not by name: a test whose outcome follows the date (it passes for 300 days after the
    repository was made) is never a task's FAIL_TO_PASS or PASS_TO_PASS test, and a failure message that quotes
    today's date never reaches a statement — the last repeat of each bug and each group's clean run see the clock
    400 days later (libfaketime in a twin of the environment)."""
    import datetime

    now = int(time.time())
    repo = _git_repo(tmp_path / "src" / "acme__clock", {
        "lib/__init__.py": "",
        "lib/core.py": "def add(a, b):\n    return a + b\n\n\ndef scale(x, k):\n    if k < 0:\n"
                       "        raise ValueError(k)\n    return x * k\n",
        "tests/test_core.py": (
            "import datetime\nimport time\n\nfrom lib.core import add, scale\n\nMADE = " + str(now) + "\n\n\n"
            "def test_add():\n    assert add(2, 3) == 5, f'add is wrong on {datetime.date.today()}'\n\n\n"
            "def test_add_more():\n    assert add(1, 1) == 2\n\n\n"
            "def test_scale():\n    assert scale(2, 3) == 6 and scale(3, 2) == 6\n\n\n"
            "def test_scale_one():\n    assert scale(1, 1) == 1\n\n\n"
            "def test_recent():\n    assert scale(1, 1) == 1 and time.time() - MADE < 300 * 86400\n")})
    sources = {"seed": 0, "max_tasks": 20, "per_function": 10, "repeats": 3,
               "sources": [{"path": str(repo), "env": {"python": "3.11"}, "tests": ["tests"]}]}
    (tmp_path / "sources.json").write_text(json.dumps(sources))
    out = tmp_path / "out"
    done = subprocess.run([*GAGAR, "tasks", "synth", "--sources", str(tmp_path / "sources.json"), "--out", str(out),
                           "--max-workers", "2", "--quiet"], cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
                          capture_output=True, text=True, timeout=1800)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [json.loads(line) for line in (out / "instances.jsonl").read_text().splitlines()]
    assert rows, done.stderr[-3000:]
    today = datetime.date.today().isoformat()
    listed = {t for r in rows for t in r["FAIL_TO_PASS"] + r["PASS_TO_PASS"]}
    assert "tests/test_core.py::test_recent" not in listed, [(r["instance_id"], r["PASS_TO_PASS"]) for r in rows]
    assert "tests/test_core.py::test_scale_one" in listed  # the clock-free test of the same function is
    quoting = [r for r in rows if "tests/test_core.py::test_add`" in r["problem_statement"]]
    assert quoting, [r["problem_statement"] for r in rows]
    for r in rows:
        assert today not in r["problem_statement"] and str(datetime.date.today().year) not in r["problem_statement"], \
            r["problem_statement"]
    assert all(r["env"] == rows[0]["env"] and "apt_packages" not in r["env"] for r in rows)  # the task's own env
    assert all("FAKETIME" not in r["test_cmd"] for r in rows)
