"""`gagar eval` end to end with real Docker and real git: every status, resume, --redo, input handling."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from sandbox_fixtures import CalcTask, leftover_containers, require_docker, results_by_rollout

from sandbox.cli import eval_main, load_predictions
from sandbox.records import STATUSES
from sandbox.report import ResultWriter, read_results

ROOT = Path(__file__).resolve().parent.parent


def _eval(task: CalcTask, preds: Path, out: Path, run_id: str, *extra: str, instances: Path | None = None) -> int:
    return eval_main([
        "--instances", str(instances or task.root / "instances.jsonl"), "--predictions", str(preds),
        "--repos-dir", str(task.repos_dir), "--run-id", run_id, "--report-dir", str(out), "--no-progress",
        *extra,
    ])


@pytest.fixture
def task(tmp_path: Path) -> CalcTask:
    return CalcTask(tmp_path)


# ---------------------------------------------------------------------------------------------- no Docker
def test_predictions_formats_and_broken_lines(tmp_path: Path) -> None:
    p = tmp_path / "p.jsonl"
    p.write_text('{"instance_id": "a", "model_patch": "x"}\n{"instance_id": "a", "model_pa\n'
                 '{"instance_id": "a", "model_patch": "y", "rollout_id": 7}\n[1]\n')
    notes: list[str] = []
    preds = load_predictions(p, notes)
    assert [(x.instance_id, x.rollout_id, x.model_patch) for x in preds] == [("a", "0", "x"), ("a", "7", "y")]
    assert any("p.jsonl:2:" in n and "not valid JSON" in n for n in notes), notes
    assert any("p.jsonl:4:" in n for n in notes), notes
    d = tmp_path / "d.json"
    d.write_text(json.dumps({"x__y-1": {"model_patch": "p", "model_name_or_path": "m"}}))
    (pred,) = load_predictions(d, [])
    assert (pred.instance_id, pred.model_name_or_path, pred.rollout_id) == ("x__y-1", "m", "0")
    lst = tmp_path / "l.json"
    lst.write_text(json.dumps([{"instance_id": "i", "model_patch": ""}, {"instance_id": "i", "model_patch": "z"}]))
    assert [x.rollout_id for x in load_predictions(lst, [])] == ["0", "1"]


def test_result_writer_trims_a_truncated_line(tmp_path: Path) -> None:
    path = tmp_path / "results.jsonl"
    good = {"instance_id": "i", "model_name_or_path": "m", "rollout_id": "0", "status": "resolved", "resolved": True}
    path.write_text(json.dumps(good) + "\n" + '{"instance_id": "i", "rollout_id": "1", "sta')
    assert list(read_results(path, warn=False)) == [("i", "0")]
    from sandbox.records import EvalResult

    ResultWriter(path).write(EvalResult(instance_id="i", model_name_or_path="m", rollout_id="1", status="unresolved"))
    lines = path.read_text().splitlines()
    assert len(lines) == 2 and all(json.loads(ln) for ln in lines)


def test_bad_usage_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    (tmp_path / "i.jsonl").write_text("")
    base = ["--instances", str(tmp_path / "i.jsonl"), "--predictions", str(tmp_path / "i.jsonl"),
            "--repos-dir", str(tmp_path), "--report-dir", str(tmp_path / "o")]
    assert eval_main([*base, "--run-id", "../x"]) == 2
    assert "--run-id" in capsys.readouterr().err
    assert eval_main([*base, "--run-id", "r", "--memory", "lots"]) == 2
    assert "not a size" in capsys.readouterr().err
    assert eval_main([*base[:3], str(tmp_path / "missing.jsonl"), *base[4:], "--run-id", "r"]) == 2
    assert "no such file" in capsys.readouterr().err
    assert eval_main([*base, "--run-id", "r", "--cpus", "999"]) == 2


def test_a_finished_group_never_reopens_its_repo(task: CalcTask) -> None:
    """The next group's repo is prepared ahead on a starter thread; if that thread runs only after the group's
    rollouts were all released (they were rejected before needing a repo), it must not create a workspace that
    nobody will close (it was a temp dir leaked per run)."""
    from concurrent.futures import ThreadPoolExecutor

    from sandbox.config import SandboxConfig
    from sandbox.group import RolloutGroup
    from sandbox.records import Instance
    from sandbox.workspace import WS_PREFIX, WorkspaceError

    inst = Instance.from_dict(task.instance)
    before = set(Path(tempfile.gettempdir()).glob(WS_PREFIX + "*"))
    with ThreadPoolExecutor(1) as starter:
        group = RolloutGroup(inst, 2, SandboxConfig(repos_dir=task.repos_dir), None, {}, starter)
        group.skip()
        group.release()
        group.skip()
        group.release()
        with pytest.raises(WorkspaceError, match="already closed"):
            group.open()
        other = RolloutGroup(inst, 1, SandboxConfig(repos_dir=task.repos_dir), None, {}, starter)
        ws = other.open()  # an open group still opens, and its last release closes it
        assert ws.base.is_dir()
        other.release()
    from sandbox.workspace import janitor

    janitor.drain()
    assert set(Path(tempfile.gettempdir()).glob(WS_PREFIX + "*")) == before


def test_sweep_removes_only_this_calls_workspaces(task: CalcTask, tmp_path: Path) -> None:
    """The last step of an interrupted run: workspaces tagged with its call id go, another call's stay."""
    from sandbox.records import Instance
    from sandbox.workspace import GroupWorkspace, sweep_workspaces

    inst = Instance.from_dict(task.instance)
    mine = GroupWorkspace(task.repos_dir, inst.repo, inst.base_commit, tmp_root=tmp_path, tag="call-a").__enter__()
    other = GroupWorkspace(task.repos_dir, inst.repo, inst.base_commit, tmp_root=tmp_path, tag="call-b").__enter__()
    assert sweep_workspaces("call-a", tmp_path) == [mine.root.name]
    assert not mine.root.exists() and other.base.is_dir()
    other.close()


def test_remove_tree_finishes_when_another_thread_removes_part_of_it(tmp_path: Path, monkeypatch) -> None:
    """The janitor removes a rollout's tree and, on its other thread, the group workspace around it: a directory
    vanishing between rmtree's listing and its open made the error handler raise (it retried `os.open` without
    flags), which skipped the `rm -rf` fallback and left the workspace behind (CI: "temp dirs left behind")."""
    from sandbox.workspace import remove_tree

    root = tmp_path / "gagar-ws-x"
    (root / "s1" / "sub").mkdir(parents=True)
    (root / "s1" / "sub" / "f.py").write_text("x = 1\n")
    (root / "s1" / "g.py").write_text("y = 2\n")
    real_open = os.open
    raced = []

    def open_after_the_other_thread(name, flags, mode=0o777, *, dir_fd=None):
        if name == "sub" and dir_fd is not None and not raced:  # the other janitor thread takes s1/sub now
            raced.append(name)
            shutil.rmtree(root / "s1" / "sub")
        return real_open(name, flags, mode, dir_fd=dir_fd)

    monkeypatch.setattr(os, "open", open_after_the_other_thread)
    remove_tree(root)
    monkeypatch.undo()
    assert raced and not root.exists()


# ------------------------------------------------------------------------------------------------ Docker
def _my_workspaces() -> dict[Path, str]:
    """This process's repo copies under the temp dir, each with the evaluation call that made it."""
    from sandbox.workspace import OWNER_FILE, TAG_FILE, WS_PREFIX

    out = {}
    for d in Path(tempfile.gettempdir()).glob(WS_PREFIX + "*"):
        try:
            if (d / OWNER_FILE).read_text() == str(os.getpid()):
                out[d] = (d / TAG_FILE).read_text() if (d / TAG_FILE).exists() else "(untagged)"
        except OSError:
            pass  # removed while we looked
    return out


@pytest.mark.docker
def test_every_status(task: CalcTask, tmp_path: Path) -> None:
    require_docker()
    from sandbox.workspace import janitor

    janitor.drain()
    before = _my_workspaces()  # an earlier test's leftovers are that test's to answer for
    tamper = task.diff({"tests/test_calc.py": TESTS_TAMPER, "calc.py": task_calc_wrong()})
    preds = [
        {"instance_id": "acme__calc-1", "rollout_id": "fix", "model_patch": task.instance["patch"]},
        {"instance_id": "acme__calc-1", "rollout_id": "wrong", "model_patch": task.calc_patch("return a * b")},
        {"instance_id": "acme__calc-1", "rollout_id": "empty", "model_patch": ""},
        {"instance_id": "acme__calc-1", "rollout_id": "stale", "model_patch": STALE},
        {"instance_id": "acme__calc-1", "rollout_id": "escape", "model_patch": ESCAPE},
        {"instance_id": "acme__calc-1", "rollout_id": "loop", "model_patch": task.calc_patch("while True:\n    pass")},
        {"instance_id": "acme__calc-1", "rollout_id": "tamper", "model_patch": tamper},
        {"instance_id": "acme__norepo-1", "rollout_id": "norepo", "model_patch": task.instance["patch"]},
        {"instance_id": "acme__ghost-9", "rollout_id": "ghost", "model_patch": task.instance["patch"]},
    ]
    inst, pp = task.write_inputs(preds)
    with open(inst, "a") as f:
        f.write(json.dumps({**task.instance, "instance_id": "acme__norepo-1", "repo": "acme/norepo"}) + "\n")
        f.write("{this line is broken\n")
    out = tmp_path / "out"
    assert _eval(task, pp, out, "statuses", "--timeout", "6", "--max-workers", "2") == 0
    res = results_by_rollout(out / "statuses")
    got = {rid: r["status"] for rid, r in res.items()}
    assert got == {"fix": "resolved", "wrong": "unresolved", "empty": "empty_patch", "stale": "patch_failed",
                   "escape": "rejected", "loop": "timeout", "tamper": "unresolved", "norepo": "infra_error"}
    assert res["tamper"]["tampered_tests"] and not res["fix"]["tampered_tests"]
    assert res["fix"]["resolved"] and res["fix"]["tests_status"]["FAIL_TO_PASS"]["success"] == [
        "tests/test_calc.py::test_add"]
    assert res["wrong"]["tests_status"]["FAIL_TO_PASS"]["failure"] == ["tests/test_calc.py::test_add"]
    assert ".." in res["escape"]["error"] or "outside" in res["escape"]["error"]
    assert "acme__norepo" in res["norepo"]["error"]
    for r in res.values():
        assert set(r) >= {"instance_id", "model_name_or_path", "rollout_id", "status", "resolved",
                          "patch_successfully_applied", "tampered_tests", "tests_status", "exit_code",
                          "duration_s", "error"}
    log_dir = Path(res["fix"]["log_path"])
    assert (log_dir / "patch.diff").read_text() == task.instance["patch"]
    assert "passed" in (log_dir / "test_output.txt").read_text()
    rep = json.loads((out / "statuses" / "report.json").read_text())
    assert rep["submitted_instances"] == 8 and rep["resolved_instances"] == 1
    assert rep["completed_instances"] == 3 and rep["empty_patch_instances"] == 1 and rep["error_instances"] == 4
    assert rep["unknown_instance_ids"] == ["acme__ghost-9"]
    assert rep["resolved_ids"] == ["acme__calc-1::fix"]
    assert set(rep["status_counts"]) == set(STATUSES) and rep["status_counts"]["timeout"] == 1
    assert any(".jsonl:3:" in s for s in rep["skipped_input_lines"])
    assert leftover_containers("statuses") == []
    janitor.drain()  # temp trees are removed in the background; none may outlive the run
    left = {d: tag for d, tag in _my_workspaces().items() if d not in before}
    assert left == {}, {str(d): (tag, sorted(p.name for p in d.iterdir())) for d, tag in left.items()}


@pytest.mark.docker
def test_missing_image_is_refused_up_front(task: CalcTask, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """--image naming an image the engine lacks: one clear error before anything runs, not one infra_error (with
    advice to "pass --image") per prediction."""
    require_docker()
    preds = [{"instance_id": "acme__calc-1", "rollout_id": i, "model_patch": task.instance["patch"]} for i in range(3)]
    _, pp = task.write_inputs(preds)
    assert _eval(task, pp, tmp_path / "o", "noimg", "--image", "gagar-no-such-image:0") == 2
    err = capsys.readouterr().err
    assert "--image gagar-no-such-image:0: no such image" in err and "gagar image build" in err
    assert not (tmp_path / "o" / "noimg" / "results.jsonl").exists()


@pytest.mark.docker
def test_resume_and_redo(task: CalcTask, tmp_path: Path) -> None:
    require_docker()
    preds = [{"instance_id": "acme__calc-1", "rollout_id": i, "model_patch": task.instance["patch"]} for i in range(3)]
    _, pp = task.write_inputs(preds)
    out = tmp_path / "o"
    assert _eval(task, pp, out, "r") == 0
    path = out / "r" / "results.jsonl"
    first = path.read_text().splitlines()
    assert len(first) == 3
    # A crash mid-write: the last line is cut short. Resume must redo exactly that one, and remove the repo copy
    # the dead process of this run left (not another run's, not a live process's).
    path.write_text("\n".join(first[:2]) + "\n" + first[2][:25])
    dead = subprocess.Popen(["true"])
    dead.wait()
    planted = {}
    for name, owner, run in (("dead", dead.pid, "r"), ("other_run", dead.pid, "r2"), ("live", os.getpid(), "r")):
        planted[name] = Path(tempfile.mkdtemp(prefix="gagar-ws-"))
        (planted[name] / "owner.pid").write_text(str(owner))
        (planted[name] / "run").write_text(run)
    try:
        assert _eval(task, pp, out, "r") == 0
        assert not planted["dead"].exists() and planted["other_run"].exists() and planted["live"].exists()
    finally:
        for d in planted.values():
            shutil.rmtree(d, ignore_errors=True)
    second = path.read_text().splitlines()
    assert second[:2] == first[:2] and len(second) == 3 and json.loads(second[2])["status"] == "resolved"
    assert _eval(task, pp, out, "r") == 0  # nothing left to do: nothing rewritten
    assert path.read_text().splitlines() == second
    logs = sorted((out / "r" / "logs").glob("*/*/run.log"))
    assert len(logs) == 3
    before = {p: p.stat().st_mtime_ns for p in logs}
    time.sleep(0.05)
    assert _eval(task, pp, out, "r", "--redo") == 0
    third = path.read_text().splitlines()
    assert len(third) == 3 and sorted(json.loads(x)["rollout_id"] for x in third) == ["0", "1", "2"]
    # --redo re-evaluates every prediction: each one's log is written again.
    assert all(p.stat().st_mtime_ns > before[p] for p in logs)
    assert json.loads((out / "r" / "report.json").read_text())["resolved_instances"] == 3


@pytest.mark.docker
def test_sigterm_removes_containers_and_keeps_resume_state(task: CalcTask, tmp_path: Path) -> None:
    require_docker()
    slow = task.calc_patch("import time\ntime.sleep(120)\nreturn a + b")
    preds = [{"instance_id": "acme__calc-1", "rollout_id": f"slow{i}", "model_patch": slow} for i in range(4)]
    inst, pp = task.write_inputs(preds)
    out = tmp_path / "o"
    proc = subprocess.Popen(
        [sys.executable, "-m", "gagar.cli", "eval", "--instances", str(inst), "--predictions", str(pp),
         "--repos-dir", str(task.repos_dir), "--run-id", "sig", "--report-dir", str(out), "--no-progress",
         "--max-workers", "2"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while not leftover_containers("sig", proc.pid) and time.monotonic() < deadline:
            time.sleep(0.3)
        assert leftover_containers("sig", proc.pid), "the run never started its container"
        time.sleep(1)  # let the started-ahead containers exist too
        proc.send_signal(signal.SIGTERM)
        time.sleep(0.2)
        proc.send_signal(signal.SIGINT)  # an impatient second signal must not cut the cleanup short
        output, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130 and "Traceback" not in output, output
    assert leftover_containers("sig") == []
    results = out / "sig" / "results.jsonl"
    assert not results.exists() or results.read_text().strip() == ""  # the interrupted run is redone on resume
    assert not list(Path(os.environ.get("TMPDIR", "/tmp")).glob("gagar-ws-*/r1"))


@pytest.mark.docker
@pytest.mark.slow
def test_bundled_tasks_give_expected_statuses(tmp_path: Path, bundled_tasks: Path) -> None:
    """A covering subset in CI (every expected status, every language); every rollout with GAGAR_FULL=1."""
    require_docker()
    tasks = bundled_tasks
    expected = [json.loads(ln) for ln in (tasks / "expected.jsonl").read_text().splitlines() if ln.strip()]
    lang = {json.loads(ln)["instance_id"]: json.loads(ln).get("language")
            for ln in (tasks / "instances.jsonl").read_text().splitlines() if ln.strip()}
    preds = [json.loads(ln) for ln in (tasks / "predictions.jsonl").read_text().splitlines() if ln.strip()]
    if not os.environ.get("GAGAR_FULL"):
        # CI: one rollout per (status, tampered) — Python first, the cheapest to run — plus one resolved
        # rollout per other language, so every image and parser is exercised.
        keep: dict[tuple, tuple[str, str]] = {}
        for e in sorted(expected, key=lambda e: lang[e["instance_id"]] != "python"):
            key = (e["instance_id"], str(e["rollout_id"]))
            keep.setdefault(("status", e["status"], e["tampered_tests"]), key)
            if e["status"] == "resolved":
                keep.setdefault(("language", lang[e["instance_id"]]), key)
        preds = [p for p in preds if (p["instance_id"], str(p["rollout_id"])) in set(keep.values())]
    pp = tmp_path / "preds.jsonl"
    pp.write_text("".join(json.dumps(p) + "\n" for p in preds))
    rc = eval_main(["--instances", str(tasks / "instances.jsonl"), "--predictions", str(pp), "--repos-dir",
                    str(tasks / "repos"), "--run-id", "bundled", "--report-dir", str(tmp_path / "o"),
                    "--max-workers", "2", "--timeout", "120", "--no-progress"])
    assert rc == 0
    got = {(r.instance_id, r.rollout_id): r for r in read_results(tmp_path / "o" / "bundled" / "results.jsonl").values()}
    wrong = []
    for e in expected:
        r = got.get((e["instance_id"], str(e["rollout_id"])))
        # An honest run is never flagged suspicious_report; the hacks the sandbox catches are.
        if r is not None and (r.status != e["status"] or r.tampered_tests != e["tampered_tests"]
                              or r.suspicious_report != e["suspicious_report"]):
            wrong.append(f"{e['instance_id']}/{e['rollout_id']} ({e['kind']}): expected {e['status']}, "
                         f"got {r.status} (suspicious={r.suspicious_report}) {r.error or ''}")
    assert len(got) == len(preds)
    assert not wrong, "\n".join(wrong)
    assert leftover_containers("bundled") == []


TESTS_TAMPER = "from calc import add, neg\n\n\ndef test_neg():\n    assert True\n\n\ndef test_add():\n    assert True\n"
STALE = ("diff --git a/calc.py b/calc.py\n--- a/calc.py\n+++ b/calc.py\n@@ -1,4 +1,4 @@\n"
         " def multiply(x, y):\n-    return x ** y\n+    return x * y\n \n \n")
ESCAPE = "diff --git a/../evil.py b/../evil.py\nnew file mode 100644\n--- /dev/null\n+++ b/../evil.py\n@@ -0,0 +1 @@\n+x = 1\n"


def task_calc_wrong() -> str:
    return "def add(a, b):\n    return a - b\n\n\ndef neg(a):\n    return -a\n"


@pytest.mark.docker
def test_gc_removes_leftovers_by_label(capsys: pytest.CaptureFixture) -> None:
    require_docker()
    import docker

    from sandbox.cli import sandbox_main

    c = docker.from_env()
    mine = c.containers.run("gagar-python:latest", ["sleep", "60"], detach=True, network_mode="none",
                            labels={"gagar.sandbox": "1", "gagar.run": "gc-test"})
    other = c.containers.run("gagar-python:latest", ["sleep", "60"], detach=True, network_mode="none",
                             labels={"gagar.sandbox": "1", "gagar.run": "gc-test-other"})
    dead = subprocess.Popen(["true"])
    dead.wait()
    ws = Path(tempfile.mkdtemp(prefix="gagar-ws-"))
    (ws / "owner.pid").write_text(str(dead.pid))
    live = Path(tempfile.mkdtemp(prefix="gagar-ws-"))
    (live / "owner.pid").write_text(str(os.getpid()))
    try:
        assert sandbox_main(["gc", "--run-id", "gc-test"]) == 0
        out = capsys.readouterr().out
        assert "removed 1 container" in out and ws.name in out
        assert not ws.exists() and live.exists()
        assert leftover_containers("gc-test") == [] and leftover_containers("gc-test-other") == [other.name]
    finally:
        for ctr in (mine, other):
            try:
                ctr.remove(force=True)
            except docker.errors.NotFound:
                pass
        shutil.rmtree(live, ignore_errors=True)
