"""`gagar grade` and `gagar grade eval`: input validation, output format, resume, and the metrics report."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from test_grader_util import ROOT, bundled_tasks

from grader.cli import main
from grader.records import read_jsonl


@pytest.fixture(scope="module")
def tasks(tmp_path_factory) -> Path:
    """The bundled tasks, cut to three groups: the CLI's behaviour does not depend on how many there are."""
    full = bundled_tasks(tmp_path_factory.getbasetemp())
    sub = tmp_path_factory.mktemp("cli-tasks")
    (sub / "repos").symlink_to(full / "repos")
    for name in ("groups.jsonl", "labels.jsonl"):
        (sub / name).write_text("".join((full / name).read_text().splitlines(keepends=True)[:3]))
    return sub


def _grade(tasks: Path, out: Path, *extra: str) -> int:
    return main(["--groups", str(tasks / "groups.jsonl"), "--repos-dir", str(tasks / "repos"), "--out", str(out),
                 "--no-progress", *extra])


def test_grade_writes_the_design_fields_and_resumes(tasks, tmp_path, capsys):
    out = tmp_path / "res" / "gradings.jsonl"
    assert _grade(tasks, out) == 0
    rows = read_jsonl(out)
    groups = read_jsonl(tasks / "groups.jsonl")
    assert [r["instance_id"] for r in rows] == [g["instance_id"] for g in groups]
    for r in rows:
        assert {"instance_id", "ranking", "tiers", "weights", "evidence", "judge", "fallback"} <= set(r)
        assert r["ranking"][0] == "minimal" and r["judge"] == "heuristic" and r["fallback"] is False
        assert set(r["tiers"]) == set(r["weights"]) == set(r["ranking"])
        assert all(t in (1, 2, 3) for t in r["tiers"].values())
        assert all(0 < w <= 1 for w in r["weights"].values())
    assert not list(out.parent.glob(".*.tmp"))  # atomic write leaves no temp file
    # Resume: a finished group is not graded again; a marker in the file survives.
    rows[0]["judge"] = "marker"
    out.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert _grade(tasks, out) == 0
    assert "0 group(s)" in capsys.readouterr().out
    assert read_jsonl(out)[0]["judge"] == "marker"
    # Drop the last line: only that group is graded.
    out.write_text("".join(json.dumps(r) + "\n" for r in rows[:-1]))
    assert _grade(tasks, out) == 0
    assert "graded 1 group(s)" in capsys.readouterr().out
    assert len(read_jsonl(out)) == len(rows)
    assert _grade(tasks, out, "--redo") == 0
    assert read_jsonl(out)[0]["judge"] == "heuristic"


def test_bad_input_exits_2_with_a_clear_message(tasks, tmp_path, capsys):
    out = tmp_path / "o.jsonl"
    assert main(["--groups", str(tmp_path / "missing.jsonl"), "--repos-dir", str(tasks / "repos"), "--out", str(out)]) == 2
    assert "cannot read" in capsys.readouterr().err
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"instance_id": "x", "repo": "a/b", "base_commit": "abc", "candidates": []}\nnot json\n')
    assert main(["--groups", str(bad), "--repos-dir", str(tasks / "repos"), "--out", str(out)]) == 2
    assert "bad.jsonl:2" in capsys.readouterr().err
    nocand = tmp_path / "nocand.jsonl"
    nocand.write_text('{"instance_id": "x", "repo": "a/b", "base_commit": "abc", "candidates": [{"patch": "x"}]}\n')
    assert main(["--groups", str(nocand), "--repos-dir", str(tasks / "repos"), "--out", str(out)]) == 2
    assert "missing rollout_id" in capsys.readouterr().err
    g = read_jsonl(tasks / "groups.jsonl")[0]
    wrong = tmp_path / "wrong.jsonl"
    wrong.write_text(json.dumps({**g, "base_commit": "0" * 40}) + "\n" + json.dumps({**g, "instance_id": "y", "repo": "no/where"}) + "\n")
    assert main(["--groups", str(wrong), "--repos-dir", str(tasks / "repos"), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "is not in" in err and "no repository at" in err
    assert _grade(tasks, out, "--judge", "llm") == 2
    assert "--model" in capsys.readouterr().err
    assert _grade(tasks, out, "--judge", "llm", "--model", "m", "--backend", "openai") == 2
    assert "--base-url" in capsys.readouterr().err
    assert _grade(tasks, out, "--permutations", "0") == 2
    assert not out.exists()


def test_grade_eval_prints_the_metrics(tasks, tmp_path, capsys):
    args = ["eval", "--groups", str(tasks / "groups.jsonl"), "--labels", str(tasks / "labels.jsonl")]
    metrics = tmp_path / "m.json"
    assert main([*args, "--repos-dir", str(tasks / "repos"), "--no-progress", "--json", str(metrics)]) == 0
    out = capsys.readouterr().out
    assert "top-1 accuracy:     1.000" in out and "pairwise accuracy:" in out and "Kendall tau:" in out
    assert json.loads(metrics.read_text())["top1"] == 1.0
    # Evaluating a given gradings file: reversed rankings score tau = -1.
    rev = tmp_path / "rev.jsonl"
    rev.write_text("".join(json.dumps({"instance_id": r["instance_id"], "ranking": r["order"][::-1]}) + "\n"
                           for r in read_jsonl(tasks / "labels.jsonl")))
    assert main([*args, "--gradings", str(rev)]) == 0
    assert "Kendall tau:        -1.000" in capsys.readouterr().out
    assert main([*args]) == 2  # neither --repos-dir nor --gradings


def test_console_script_dispatch(tasks, tmp_path):
    out = tmp_path / "cli.jsonl"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-m", "gagar.cli", "grade", "--groups", str(tasks / "groups.jsonl"),
                           "--repos-dir", str(tasks / "repos"), "--out", str(out)],
                          capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert len(read_jsonl(out)) == len(read_jsonl(tasks / "groups.jsonl"))
    proc = subprocess.run([sys.executable, "-m", "gagar.cli", "grade", "--bogus"], capture_output=True, text=True,
                          env=env, cwd=ROOT)
    assert proc.returncode == 2 and "required: --repos-dir" in proc.stderr
