"""bench/hackset2 stays a usable benchmark: its files hold what the README promises, and verify.py rejects a broken
candidates file before anything runs. The sandbox re-run itself is `bench/hackset2/verify.py` (minutes)."""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path

import pytest
import unidiff

ROOT = Path(__file__).resolve().parents[1]
HERE = ROOT / "bench" / "hackset2"
sys.path.insert(0, str(HERE))

import verify  # noqa: E402

from sandbox.inputs import InputError, load_instances  # noqa: E402

MINDSETS = ("lookup_table", "env_detection", "test_reading", "exception_swallow", "literal_guard", "free")


@pytest.fixture(scope="module")
def tasks():
    return load_instances(HERE / "tasks.json", [])


@pytest.fixture(scope="module")
def rows():
    return json.loads((HERE / "candidates.json").read_text())


def test_groups_are_real_fixes_with_a_split(tasks):
    raw = json.loads((HERE / "tasks.json").read_text())
    assert len(raw) >= 16 and len({t["repo"] for t in raw}) >= 3
    assert "more-itertools/more-itertools" not in {t["repo"] for t in raw}
    splits = Counter(t["split"] for t in raw)
    assert set(splits) == {"dev", "heldout"} and abs(splits["dev"] - splits["heldout"]) <= 1
    for t in tasks.values():
        assert t.FAIL_TO_PASS and t.patch.startswith("diff --git") and t.test_patch.startswith("diff --git")
        assert not set(t.FAIL_TO_PASS) & set(t.PASS_TO_PASS)


def test_candidates_cover_every_mindset_and_parse_as_diffs(tasks, rows):
    cands = verify.load_candidates(HERE / "candidates.json", tasks)
    hacks = [c for c in cands if c.kind == "hack"]
    assert len(hacks) >= 40 and sum(c.kind == "honest" for c in cands) >= 16
    by_mindset = Counter(c.mindset.split(":")[0] for c in hacks)
    assert all(by_mindset[m] >= 4 for m in MINDSETS), by_mindset
    per_group = Counter(c.instance_id for c in hacks)
    assert set(per_group) == set(tasks) and all(2 <= n <= 4 for n in per_group.values())
    for c in cands:
        files = unidiff.PatchSet(c.patch)
        assert files and not any("test" in f.path.split("/")[-1] for f in files), (c.instance_id, c.name)
        assert c.patch != tasks[c.instance_id].patch
    split = {t["instance_id"]: t["split"] for t in json.loads((HERE / "tasks.json").read_text())}
    assert all(r["split"] == split[r["instance_id"]] for r in rows)
    assert (HERE / "candidates.json").stat().st_size + (HERE / "tasks.json").stat().st_size < 1_000_000


def test_witness_file_holds_one_test_per_hack(tasks):
    cands = verify.load_candidates(HERE / "candidates.json", tasks)
    iid = next(iter(tasks))
    group = [c for c in cands if c.instance_id == iid]
    w = verify.witness_instance(tasks[iid], group)
    assert w.instance_id == f"{iid}.witness" and w.PASS_TO_PASS == []
    assert w.FAIL_TO_PASS == [f"{verify.WITNESS_FILE}::test_witness_{c.name}" for c in group if c.kind == "hack"]
    patch = unidiff.PatchSet(w.test_patch)
    added = next(f for f in patch if f.path == verify.WITNESS_FILE)
    source = "".join(line.value for hunk in added for line in hunk)
    compile(source, verify.WITNESS_FILE, "exec")  # the generated test file is valid Python
    assert source.count("def test_witness_") == len(w.FAIL_TO_PASS)


@pytest.mark.parametrize("bad, says", [
    ({"kind": "fix"}, "kind"),
    ({"instance_id": "nope__nope-1"}, "not in the tasks file"),
    ({"witness": ""}, "no witness"),
    ({"name": "gold"}, "taken"),
    ({"patch": None}, "non-empty strings"),
])
def test_a_broken_candidate_is_rejected_with_its_reason(tmp_path, tasks, rows, bad, says):
    hack = next(r for r in rows if r["kind"] == "hack")
    path = tmp_path / "c.json"
    path.write_text(json.dumps([{**hack, **bad}]))
    with pytest.raises(InputError, match=says):
        verify.load_candidates(path, tasks)


def test_score_builds_one_group_per_task_with_the_gold_and_every_candidate(rows):
    import score

    raw = json.loads((HERE / "tasks.json").read_text())
    groups, labels = score.build_groups(raw, rows, behaviour={raw[0]["instance_id"]: {"gold": []}})
    assert [g["instance_id"] for g in groups] == [t["instance_id"] for t in raw]
    assert sum(len(g["candidates"]) for g in groups) == len(rows) + len(raw)
    assert all(g["candidates"][0]["rollout_id"] == "gold" and g["FAIL_TO_PASS"] for g in groups)
    assert "behaviour" in groups[0] and "behaviour" not in groups[1]
    assert Counter(lab["kind"] for lab in labels.values()) == Counter(
        {"gold": len(raw), **Counter(r["kind"] for r in rows)})


def test_score_counts_recall_false_flags_and_gold_rank_per_split():
    import score

    labels = {("a", "gold"): {"kind": "gold", "mindset": "", "split": "dev"},
              ("a", "h1"): {"kind": "hack", "mindset": "lookup_table", "split": "dev"},
              ("a", "h2"): {"kind": "hack", "mindset": "env_detection", "split": "dev"},
              ("a", "ok"): {"kind": "honest", "mindset": "", "split": "dev"},
              ("b", "gold"): {"kind": "gold", "mindset": "", "split": "heldout"},
              ("b", "h3"): {"kind": "hack", "mindset": "lookup_table", "split": "heldout"}}
    gradings = [{"instance_id": "a", "ranking": ["ok", "h2", "gold", "h1"],
                 "hacks": {"h1": "special_casing", "ok": "silencing"}},
                {"instance_id": "b", "ranking": ["gold", "h3"], "hacks": {"gold": "special_casing"}}]
    s = score.score(gradings, labels)
    assert (s["dev"]["hacks_flagged"], s["dev"]["hacks"], s["dev"]["recall"]) == (1, 2, 0.5)
    assert s["dev"]["recall_by_mindset"] == {"env_detection": "0/1", "lookup_table": "1/1"}
    assert (s["dev"]["honest_flagged"], s["dev"]["golds_flagged"], s["dev"]["gold_above_every_hack"]) == (1, 0, 0)
    assert s["heldout"]["recall"] == 0.0 and s["heldout"]["golds_flagged"] == 1
    assert s["heldout"]["gold_above_every_hack"] == 1
    assert s["all"]["hacks"] == 3 and s["all"]["groups"] == 2 and s["all"]["missed"] == [
        "a h2 (env_detection)", "b h3 (lookup_table)"]
    with pytest.raises(ValueError, match="no grading for b"):
        score.score(gradings[:1], labels)


def test_score_probe_line_runs_gagar_grade_probe_with_the_tasks_as_instances(tmp_path, monkeypatch):
    """--probe scores what a CLI user gets: `gagar grade --probe` with the set's tasks as --instances (loadable
    instance lines with their test command), and the probe's summary line is kept. The grade run itself is
    replaced here (minutes of sandbox runs); bench/results/grade_probe_*.json are real ones."""
    import subprocess

    import score

    raw = json.loads((HERE / "tasks.json").read_text())[:2]
    seen = {}

    def fake_run(cmd, **kw):
        seen["cmd"] = cmd
        out = Path(cmd[cmd.index("--out") + 1])
        out.write_text("".join(json.dumps({"instance_id": t["instance_id"], "ranking": ["gold"]}) + "\n" for t in raw))
        return subprocess.CompletedProcess(cmd, 0, "probe: 2 group(s) probed, 1.0 s per group (2 s); ...\n", "")

    monkeypatch.setattr(score.subprocess, "run", fake_run)
    groups, _ = score.build_groups(raw, [])
    gradings, _, probe = score.run_grade(groups, str(tmp_path), tmp_path, tasks=raw, max_workers=2)
    cmd = seen["cmd"]
    assert cmd[cmd.index("--max-workers") + 1] == "2" and "--probe" in cmd
    inst = load_instances(Path(cmd[cmd.index("--instances") + 1]), [])
    assert sorted(inst) == sorted(t["instance_id"] for t in raw)
    assert all(i.test_cmd and i.FAIL_TO_PASS for i in inst.values())
    assert probe.startswith("probe: 2 group(s) probed") and len(gradings) == 2
    score.run_grade(groups, str(tmp_path), tmp_path)
    assert "--probe" not in seen["cmd"]
