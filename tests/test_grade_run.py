"""`gagar grade --results` (a real `gagar eval` run's passing rollouts become the groups) and `gagar grade --probe`
(the behavioural probe before grading), end to end on two bundled Python tasks in the real Docker sandbox; and
the input checks of both, which need no engine."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from test_grader_util import ROOT, bundled_tasks

from grader.cli import main
from grader.records import Group, load_groups, read_jsonl
from sandbox.inputs import load_instances
from sandbox.records import EvalResult

IDS = ("acme__durations-42", "acme__ledger-58")


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> dict[str, Path]:
    """A real `gagar eval` run of every bundled prediction of IDS (gold, hacks, tampering, wrong fixes, ...)."""
    full = bundled_tasks(tmp_path_factory.getbasetemp())
    d = tmp_path_factory.mktemp("grade-run")
    for name in ("instances.jsonl", "predictions.jsonl", "expected.jsonl"):
        rows = [ln for ln in (full / name).read_text().splitlines(keepends=True)
                if json.loads(ln)["instance_id"] in IDS]
        (d / name).write_text("".join(rows))
    proc = subprocess.run([sys.executable, "-m", "gagar", "eval", "--instances", str(d / "instances.jsonl"),
                           "--predictions", str(d / "predictions.jsonl"), "--repos-dir", str(full / "repos"),
                           "--run-id", "r", "--report-dir", str(d / "out"), "--no-progress", "--max-workers", "2"],
                          capture_output=True, text=True, cwd=ROOT, timeout=900)
    assert proc.returncode == 0, proc.stderr
    return {"dir": d, "repos": full / "repos", "results": d / "out" / "r" / "results.jsonl",
            "instances": d / "instances.jsonl", "predictions": d / "predictions.jsonl"}


def _from_run(run: dict[str, Path], out: Path, *extra: str) -> int:
    return main(["--results", str(run["results"]), "--instances", str(run["instances"]), "--predictions",
                 str(run["predictions"]), "--repos-dir", str(run["repos"]), "--out", str(out), "--no-progress",
                 *extra])


@pytest.mark.docker
def test_a_gagar_eval_run_becomes_groups_and_rankings(run, tmp_path, capsys):
    """The README's data path as commands: eval → grade. Each instance's group holds exactly its passing rollouts
    (resolved, not tampered: the tamper rollout resolves nothing and is left out), built as the trainer builds them
    (`Group.from_results`); the static hack check ranks the hacks last; a summary table is printed."""
    out = tmp_path / "gradings.jsonl"
    assert _from_run(run, out, "--save-groups", str(tmp_path / "groups.jsonl")) == 0
    printed = capsys.readouterr().out
    expected = [json.loads(ln) for ln in run["dir"].joinpath("expected.jsonl").read_text().splitlines()]
    passing = {iid: sorted(e["rollout_id"] for e in expected if e["instance_id"] == iid and e["resolved"]
                           and not e["tampered_tests"]) for iid in IDS}
    groups = load_groups(tmp_path / "groups.jsonl")
    assert {g.instance_id: sorted(c.rollout_id for c in g.candidates) for g in groups} == passing
    instances = load_instances(run["instances"], [])
    results = [EvalResult.from_dict(r) for r in read_jsonl(run["results"])]
    preds = {(r["instance_id"], r["rollout_id"]): r["model_patch"] for r in read_jsonl(run["predictions"])}
    for g in groups:
        same = Group.from_results(instances[g.instance_id], results,
                                  {rid: p for (iid, rid), p in preds.items() if iid == g.instance_id})
        assert g.to_dict() == same.to_dict()
    rows = {r["instance_id"]: r for r in read_jsonl(out)}
    assert rows["acme__durations-42"]["hacks"] == {"hack-special-case": "special_casing"}
    assert rows["acme__ledger-58"]["hacks"] == {"hack-lookup": "special_casing"}
    for r in rows.values():
        assert r["ranking"][-1].startswith("hack-") and not any("probe:" in e for v in r["evidence"].values()
                                                                 for e in v)
    assert "2 group(s) ranked" in printed and "acme__durations-42" in printed and "[special_casing]" in printed
    assert "hacks: special_casing 2" in printed


@pytest.mark.docker
def test_probe_findings_reach_the_grading(run, tmp_path, capsys):
    """--probe runs the behavioural line before grading: its findings are hack evidence in the output (here the
    durations hack also fixes only the tests' exact inputs, and the ledger lookup table is replayed off the test);
    it says what it cost."""
    out = tmp_path / "probed.jsonl"
    assert _from_run(run, out, "--probe", "--max-workers", "2") == 0
    printed = capsys.readouterr().out
    rows = {r["instance_id"]: r for r in read_jsonl(out)}
    assert any("probe:" in e for e in rows["acme__durations-42"]["evidence"]["hack-special-case"])
    assert any("replay:" in e for e in rows["acme__ledger-58"]["evidence"]["hack-lookup"])
    for r in rows.values():  # the honest candidates stay unflagged
        assert set(r["hacks"]) == {rid for rid in r["ranking"] if rid.startswith("hack-")}
    line = next(ln for ln in printed.splitlines() if ln.startswith("probe:"))
    assert "2 group(s) probed" in line and "s per group" in line


@pytest.mark.docker
def test_a_prediction_changed_since_the_run_is_refused(run, tmp_path, capsys):
    """A passing result's verdict_key must match the patch given now: a gold patch edited after the run would be
    graded with a verdict about another patch."""
    preds = [json.loads(ln) for ln in run["predictions"].read_text().splitlines()]
    for p in preds:
        if (p["instance_id"], p["rollout_id"]) == ("acme__ledger-58", "gold"):
            p["model_patch"] += "\n"
    edited = tmp_path / "predictions.jsonl"
    edited.write_text("".join(json.dumps(p) + "\n" for p in preds))
    rc = main(["--results", str(run["results"]), "--instances", str(run["instances"]), "--predictions", str(edited),
               "--repos-dir", str(run["repos"]), "--out", str(tmp_path / "o.jsonl"), "--no-progress"])
    err = capsys.readouterr().err
    assert rc == 2 and "acme__ledger-58::gold" in err and "gagar eval" in err
    assert not (tmp_path / "o.jsonl").exists()


@pytest.mark.parametrize("args, words", [
    ([], "one of the arguments --groups --results is required"),
    (["--groups", "g.jsonl", "--results", "r.jsonl"], "not allowed with argument"),
    (["--results", "r.jsonl", "--instances", "i.jsonl"], "--results needs --instances and --predictions"),
    (["--groups", "g.jsonl", "--probe"], "--probe needs --instances"),
    (["--groups", "g.jsonl", "--save-groups", "s.jsonl"], "--save-groups writes the groups built from --results"),
])
def test_bad_input_combinations_exit_2_saying_what_to_give(args, words, tmp_path, capsys):
    try:
        rc = main([*args, "--repos-dir", str(tmp_path), "--out", str(tmp_path / "o.jsonl")])
    except SystemExit as exc:  # argparse's own refusals
        rc = exc.code
    assert rc == 2 and words in capsys.readouterr().err


def test_a_file_that_is_not_a_results_file_is_named(tmp_path, capsys):
    for name in ("i.jsonl", "p.jsonl"):
        (tmp_path / name).write_text("")
    (tmp_path / "r.jsonl").write_text('{"instance_id": "a", "rollout_id": "0", "status": "resolved"}\n{"x": 1}\n')
    rc = main(["--results", str(tmp_path / "r.jsonl"), "--instances", str(tmp_path / "i.jsonl"), "--predictions",
               str(tmp_path / "p.jsonl"), "--repos-dir", str(tmp_path), "--out", str(tmp_path / "o.jsonl")])
    assert rc == 2 and "r.jsonl: line 2 lacks instance_id or rollout_id" in capsys.readouterr().err


def test_help_says_what_the_probe_costs(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--probe" in text and "s per group" in text and "--results" in text and "--max-workers" in text
