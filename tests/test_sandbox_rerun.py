"""Re-running `gagar eval` under one run id: a finished result is reused only for the same patch and the same
instance (its `verdict_key`); a prediction whose patch or instance changed is evaluated again and its old line
is never reported."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from sandbox_fixtures import require_docker, results_by_rollout

from sandbox.cli import eval_main
from sandbox.records import EvalResult, Instance

IID = "acme__iniconf-9"
INST = Instance.from_dict({"instance_id": "o__r-1", "repo": "o/r", "base_commit": "abc", "test_patch": "tp",
                           "FAIL_TO_PASS": ["t::a"], "PASS_TO_PASS": ["t::b"], "test_cmd": "pytest"})


def test_the_key_covers_the_patch_every_verdict_field_and_the_image_override() -> None:
    from sandbox.report import VERDICT_FIELDS, verdict_key

    base = verdict_key(INST, "diff")
    assert base == verdict_key(Instance.from_dict(INST.to_dict()), "diff")  # stable across loads
    assert verdict_key(INST, "diff2") != base
    assert verdict_key(INST, "diff", image="img:1") != base
    changed = {"repo": "o/s", "base_commit": "abd", "test_patch": "tp2", "FAIL_TO_PASS": ["t::c"],
               "PASS_TO_PASS": [], "test_cmd": "pytest -x", "test_framework": "unittest", "image": "x",
               "language": "go", "version": "1.0", "environment_setup_commit": "def", "env": {"python": "3.12"}}
    assert set(changed) == set(VERDICT_FIELDS)
    for field, value in changed.items():
        assert verdict_key(replace(INST, **{field: value}), "diff") != base, field
    # Fields that cannot change a verdict do not force a re-run.
    assert verdict_key(replace(INST, problem_statement="reworded", patch="gold"), "diff") == base
    # A patch read from non-UTF-8 bytes (surrogateescape, as the sandbox reads predictions) has a key of its own.
    latin1 = b"+caf\xe9\n".decode("utf-8", "surrogateescape")
    assert verdict_key(INST, latin1) not in (base, verdict_key(INST, "+caf\xe9\n"))


def test_resume_reuses_only_matching_keys(tmp_path: Path) -> None:
    from sandbox.report import ResultWriter, resume_done

    w = ResultWriter(tmp_path / "results.jsonl")
    rows = {"same": ("resolved", "k-same"), "changed": ("resolved", "k-old"), "old": ("unresolved", None),
            "infra": ("infra_error", "k-infra"), "elsewhere": ("resolved", "k-x")}
    for rid, (status, key) in rows.items():
        w.write(EvalResult("i", "m", rid, status, resolved=status == "resolved", verdict_key=key))
    res = resume_done(w, {("i", "same"): "k-same", ("i", "changed"): "k-new", ("i", "old"): "k-old",
                          ("i", "infra"): "k-infra", ("i", "new"): "k-new"}, redo=False)
    # "elsewhere" is no longer among the predictions: its line goes, so the file describes this run only.
    assert set(res.done) == {("i", "same")} and res.gone == [("i", "elsewhere")]
    assert (res.skipped, res.changed, res.unkeyed, res.retried) == (1, [("i", "changed")], [("i", "old")], 1)
    left = [json.loads(ln)["rollout_id"] for ln in (tmp_path / "results.jsonl").read_text().splitlines()]
    assert left == ["same"]
    words = " ".join(res.messages())
    assert "1 prediction(s) already evaluated" in words and "i::changed" in words and "older gagar" in words
    assert "1 result line(s) of predictions no longer in the input were removed" in words and "i::elsewhere" in words


def test_results_hold_one_line_per_current_prediction(tmp_path: Path) -> None:
    """Duplicate and unreadable lines (an older gagar, a hand edit) go too; the last line of a key is the kept one,
    as `read_results` reads it, and a file that already holds exactly the run is not rewritten."""
    from sandbox.report import ResultWriter, read_results, resume_done

    path = tmp_path / "results.jsonl"
    w = ResultWriter(path)
    w.write(EvalResult("i", "m", "a", "unresolved", verdict_key="k1"))
    with open(path, "a") as fh:
        fh.write("not json\n")
    w.write(EvalResult("i", "m", "a", "resolved", resolved=True, verdict_key="k1"))
    w.write(EvalResult("i", "m", "b", "resolved", resolved=True, verdict_key="k2"))
    res = resume_done(w, {("i", "a"): "k1"}, redo=False)
    assert set(res.done) == {("i", "a")} and res.done["i", "a"].status == "resolved"
    assert [json.loads(ln)["status"] for ln in path.read_text().splitlines()] == ["resolved"]
    assert read_results(path)["i", "a"].resolved
    mtime = path.stat().st_mtime_ns
    resume_done(w, {("i", "a"): "k1"}, redo=False)
    assert path.stat().st_mtime_ns == mtime
    # A caller that evaluates a growing set into one file (the task factory) keeps the other lines for later.
    w.write(EvalResult("i", "m", "b", "resolved", resolved=True, verdict_key="k2"))
    res = resume_done(w, {("i", "a"): "k1"}, redo=False, prune=False)
    assert set(res.done) == {("i", "a"), ("i", "b")} and not res.gone
    assert len(path.read_text().splitlines()) == 2


@pytest.mark.docker
def test_rerun_with_changed_patches_gives_fresh_verdicts(bundled_tasks: Path, tmp_path: Path,
                                                         capsys: pytest.CaptureFixture) -> None:
    require_docker()
    rows = [json.loads(ln) for ln in (bundled_tasks / "predictions.jsonl").read_text().splitlines()]
    patch = {r["rollout_id"]: r["model_patch"] for r in rows if r["instance_id"] == IID}

    def run(assign: dict[str, str]) -> dict[str, dict]:
        preds = tmp_path / "preds.jsonl"
        preds.write_text("".join(json.dumps({"instance_id": IID, "model_name_or_path": "m", "rollout_id": rid,
                                             "model_patch": patch[kind]}) + "\n" for rid, kind in assign.items()))
        rc = eval_main(["--instances", str(bundled_tasks / "instances.jsonl"), "--predictions", str(preds),
                        "--repos-dir", str(bundled_tasks / "repos"), "--run-id", "same-id", "--report-dir",
                        str(tmp_path / "out"), "--no-progress"])
        assert rc == 0
        return results_by_rollout(tmp_path / "out" / "same-id")

    first = run({"a": "gold", "b": "wrong-last-part", "c": "minimal"})
    assert {k: r["status"] for k, r in first.items()} == {"a": "resolved", "b": "unresolved", "c": "resolved"}
    capsys.readouterr()
    # The same run id and rollout ids, a and b's patches swapped, c unchanged.
    second = run({"a": "wrong-last-part", "b": "gold", "c": "minimal"})
    err = capsys.readouterr().err
    assert {k: r["status"] for k, r in second.items()} == {"a": "unresolved", "b": "resolved", "c": "resolved"}
    assert second["c"] == first["c"]  # reused as it was
    assert second["a"]["verdict_key"] != first["a"]["verdict_key"]
    assert "1 prediction(s) already evaluated with the same patch and instance" in err
    assert "2 prediction(s) re-evaluated: their patch or instance changed" in err
    lines = (tmp_path / "out" / "same-id" / "results.jsonl").read_text().splitlines()
    assert len(lines) == 3  # the stale lines are gone, not shadowed
    rep = json.loads((tmp_path / "out" / "same-id" / "report.json").read_text())
    assert rep["resolved_ids"] == [f"{IID}::b", f"{IID}::c"] and rep["unresolved_ids"] == [f"{IID}::a"]
    assert Path(second["a"]["log_path"], "patch.diff").read_text() == patch["wrong-last-part"]
    # A prediction removed from the input: its line leaves results.jsonl; report.json counts the same run.
    third = run({"a": "wrong-last-part", "b": "gold"})
    assert sorted(third) == ["a", "b"] and third["b"] == second["b"]
    assert len((tmp_path / "out" / "same-id" / "results.jsonl").read_text().splitlines()) == 2
    rep = json.loads((tmp_path / "out" / "same-id" / "report.json").read_text())
    assert rep["submitted_ids"] == [f"{IID}::a", f"{IID}::b"] and rep["resolved_ids"] == [f"{IID}::b"]
    assert "result line(s) of predictions no longer in the input were removed" in capsys.readouterr().err


def test_an_incremental_caller_keeps_its_other_runs_and_gets_no_redo_notes(tmp_path: Path, capsys) -> None:
    """The task factory evaluates a growing set into one run dir and resumes itself: gagar eval's notes (which
    name `--redo`, an option `gagar tasks synth` does not have) stay off stderr, and earlier runs stay."""
    from sandbox.config import SandboxConfig
    from sandbox.records import Prediction
    from sandbox.report import ResultWriter, verdict_key
    from sandbox.run import evaluate_predictions

    run = tmp_path / "run"
    w = ResultWriter(run / "results.jsonl")
    for rid in ("a", "b"):
        w.write(EvalResult(INST.instance_id, "m", rid, "resolved", resolved=True, verdict_key=verdict_key(INST, "d")))
    cfg = SandboxConfig(repos_dir=tmp_path, run_id="incremental")
    got = evaluate_predictions([INST], [Prediction(INST.instance_id, "d", "m", "a")], cfg, run_dir=run,
                               incremental=True)
    assert [r.rollout_id for r in got] == ["a"] and "--redo" not in capsys.readouterr().err
    assert len((run / "results.jsonl").read_text().splitlines()) == 2
    evaluate_predictions([INST], [Prediction(INST.instance_id, "d", "m", "a")], cfg, run_dir=run)
    assert "--redo" in capsys.readouterr().err  # gagar eval's own run says how to redo
    assert len((run / "results.jsonl").read_text().splitlines()) == 1
