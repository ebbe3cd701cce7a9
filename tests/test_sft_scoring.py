"""The scoring judge's data, objective and calibration (sft.pairs, sft.decision), and its scores in-process.

The tiny random model (sft.tiny) stands in where a test checks plumbing (the pipeline runs, the adapter loads, the
CLI reads the calibration) and says so; the tokenizer checks use the real SmolLM2 tokenizer.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gagar.cli import main as gagar
from grader.judge.scoring import ANSWERS, CALIBRATION_FILE, Verdicts, pair_messages, rollout_findings
from grader.records import Grading, load_groups, read_jsonl
from grader.workspace import SharedWorkspace
from sandbox.patchcheck import diff_size
from sft.decision import balance_by_size, choose, sweep, tokenize_decision
from sft.pairs import pair_records


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    from sft.tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.getbasetemp() / "tiny-scorer")


def test_one_token_answers_are_read_off_one_row_and_match_a_full_forward(tiny, bundled_tasks):
    """The fast path (one forward of the shared prompt for every one-token option) gives the model's own
    log-probabilities: the same as an unpadded forward over prompt + answer, batched with other lengths."""
    import torch

    from inference.hf import TransformersBackend

    backend = TransformersBackend(str(tiny), batch_size=2)
    group = load_groups(bundled_tasks / "groups.jsonl")[0]
    with SharedWorkspace(group, bundled_tasks / "repos") as ws:
        rids = list(ws.rollout_to_label)
        shown = rollout_findings(ws)
        prompts = [pair_messages(ws, a, b, shown) for a, b in ((rids[0], rids[1]), (rids[2], rids[0]))]
    short = [{"role": "user", "content": "A or B?"}]
    reqs = [(m, "", list(ANSWERS)) for m in (*prompts, short)]
    got = backend.score_continuations(reqs)
    tok, model = backend.tokenizer, backend.model
    for (m, _, options), scores in zip(reqs, got, strict=True):
        head = tok.apply_chat_template(m, add_generation_prompt=True, tokenize=False)
        ref = []
        for o in options:
            ids = tok(head + o, add_special_tokens=False)["input_ids"]
            with torch.no_grad():
                logp = torch.log_softmax(model(input_ids=torch.tensor([ids])).logits[0, -2].float(), -1)
            ref.append(float(logp[ids[-1]]))
        assert scores == pytest.approx(ref, abs=5e-3)  # padded vs unpadded kernels differ slightly
        assert sum(math.exp(s) for s in scores) < 1.0  # absolute log-probs, not renormalised ones


def test_pair_records_hold_both_orders_of_every_pair_with_the_judges_own_prompt(bundled_tasks):
    group = load_groups(bundled_tasks / "groups.jsonl")[1]
    order = ["gold", "minimal", "bloated", "unrelated"]
    size = {c.rollout_id: diff_size(c.patch)[0] for c in group.candidates}
    recs = pair_records(group, bundled_tasks / "repos", order)
    assert len(recs) == 2 * 6
    assert sum(r["answer"] == "A" for r in recs) == 6
    with SharedWorkspace(group, bundled_tasks / "repos") as ws:
        shown = rollout_findings(ws)
        for r in recs:
            second = r["worse"] if r["first"] == r["better"] else r["better"]
            assert r["messages"][:-1] == pair_messages(ws, r["first"], second, shown)
            assert r["answer"] == ("A" if r["first"] == r["better"] else "B")
            assert order.index(r["better"]) < order.index(r["worse"])
            want = None if size[r["better"]] == size[r["worse"]] else size[r["better"]] > size[r["worse"]]
            assert r["bigger_wins"] == want


def test_the_decision_objective_puts_the_loss_on_the_answer_token_only():
    from model_fixtures import smol_base
    from transformers import AutoTokenizer

    from inference.base import option_rows

    tok = AutoTokenizer.from_pretrained(str(smol_base()))
    prompt = [{"role": "system", "content": "Which is better?"}, {"role": "user", "content": "A: x\nB: y"}]
    for answer in ANSWERS:
        rec = {"instance_id": "i", "messages": [*prompt, {"role": "assistant", "content": answer}]}
        got = tokenize_decision(tok, rec)
        seqs, start = option_rows(tok, prompt, "", list(ANSWERS))
        assert got["input_ids"] == seqs[ANSWERS.index(answer)]  # exactly what the judge scores at inference
        assert got["completion_mask"] == [0] * (len(got["input_ids"]) - 1) + [1]
        assert tok.decode(got["input_ids"][-1:]) == answer
    with pytest.raises(ValueError, match="not a pair record"):
        tokenize_decision(tok, {"instance_id": "i", "messages": [*prompt, {"role": "assistant", "content": "C"}]})


def _records(sides: list[bool | None]) -> list[dict]:
    out = []
    for i, side in enumerate(sides):
        for first in ("b", "w"):
            out.append({"instance_id": f"g{i}", "better": "b", "worse": "w", "first": first, "bigger_wins": side})
    return out


@settings(max_examples=60, deadline=None)
@given(st.lists(st.sampled_from([True, False, None]), max_size=40), st.integers(0, 5))
def test_size_balance_keeps_as_many_bigger_wins_as_smaller_wins_pairs_with_both_orders(sides, seed):
    kept, info = balance_by_size(_records(sides), seed=seed)
    pairs: dict[str, list[dict]] = {}
    for r in kept:
        pairs.setdefault(r["instance_id"], []).append(r)
    assert all(sorted(r["first"] for r in rs) == ["b", "w"] for rs in pairs.values())  # orders kept together
    count = {s: sum(rs[0]["bigger_wins"] is s for rs in pairs.values()) for s in (True, False, None)}
    assert count[True] == count[False] == min(sides.count(True), sides.count(False)) == info["kept_per_side"]
    assert count[None] == sides.count(None)


def test_the_confidence_sweep_runs_from_the_scorer_alone_to_the_heuristic_alone():
    def verdicts(heuristic: list[str], learned: dict) -> Verdicts:
        return Verdicts(Grading("g" + "".join(heuristic), heuristic, {}, {}, {}, "h"), list(heuristic), learned)

    # the heuristic has a and b the wrong way round; the scorer is confidently right there and unsure and wrong
    # on (b, c), where the heuristic is right: the best rule takes the confident verdicts only.
    v = verdicts(["b", "a", "c"], {("a", "b"): 0.95, ("b", "c"): 0.45, ("a", "c"): 0.9})
    gold = {v.heuristic.instance_id: ["a", "b", "c"]}
    rows = sweep([v], gold)
    assert rows[0]["confidence"] == 0 and rows[-1]["confidence"] == 0.5
    assert rows[-1]["pairwise"] == pytest.approx(2 / 3, abs=1e-3) and rows[-1]["learned_share"] == 0
    assert rows[0]["pairwise"] == pytest.approx(2 / 3, abs=1e-3) and rows[0]["learned_share"] == 1
    best = choose(rows)
    assert best["pairwise"] == 1.0 and best["confidence"] == 0.45  # ties go to the larger threshold


def test_pairs_data_train_calibrate_and_grade_end_to_end(tiny, bundled_tasks, tmp_path, capsys):
    """Plumbing with the tiny random model: `gagar sft data --records pairs` → `sft train` (decision objective)
    → `sft calibrate` → `gagar grade --judge combined` reading the calibration beside the adapter."""
    data = tmp_path / "data"
    assert gagar(["sft", "data", "--instances", str(bundled_tasks / "instances.jsonl"), "--repos-dir",
                  str(bundled_tasks / "repos"), "--out", str(data), "--variants", "2", "--groups-per-instance", "1",
                  "--inverted", "--split", "repo", "--val-fraction", "0.2", "--calib-fraction", "0.25",
                  "--records", "pairs"]) == 0
    manifest = json.loads((data / "manifest.json").read_text())
    assert manifest["records_kind"] == "pairs" and manifest["instances"]["calib"]
    calib = {g.instance_id for g in load_groups(data / "calib_groups.jsonl")}
    trained = {r["instance_id"] for r in read_jsonl(data / "train.jsonl")}
    assert calib and not calib & trained and not read_jsonl(data / "val.jsonl")
    assert not set(manifest["repos"]["calib"]) & set(manifest["repos"]["train"])
    cfg = tmp_path / "score.yaml"
    cfg.write_text(
        f"objective: decision\nmodel: {tiny}\ndata:\n  train: {data / 'train.jsonl'}\n  balance_size: true\n"
        f"output_dir: {tmp_path / 'run'}\nlora: {{r: 4, alpha: 8, target_modules: all-linear}}\n"
        "training: {max_steps: 2, batch_size: 1, gradient_accumulation_steps: 2, logging_steps: 1, "
        "save_strategy: 'no', learning_rate: 1.0e-3}\neval: {ranking: false}\n")
    assert gagar(["sft", "train", "--config", str(cfg)]) == 0
    summary = json.loads((tmp_path / "run" / "sft_summary.json").read_text())
    assert summary["objective"] == "decision" and summary["global_step"] == 2
    assert summary["size_balance"]["kept_per_side"] >= 1
    adapter = tmp_path / "run" / "adapter"
    assert gagar(["sft", "calibrate", "--groups", str(data / "calib_groups.jsonl"), "--labels",
                  str(data / "calib_labels.jsonl"), "--repos-dir", str(manifest["repos_dir"]), "--model", str(tiny),
                  "--adapter", str(adapter)]) == 0
    cal = json.loads((adapter / CALIBRATION_FILE).read_text())
    assert 0 <= cal["confidence"] <= 0.5 and len(cal["sweep"]) == 21 and cal["groups"] == len(calib)
    out = tmp_path / "graded.jsonl"
    capsys.readouterr()
    assert gagar(["grade", "--groups", str(data / "calib_groups.jsonl"), "--repos-dir", str(manifest["repos_dir"]),
                  "--out", str(out), "--judge", "combined", "--model", str(tiny), "--adapter", str(adapter),
                  "--no-progress"]) == 0
    rows = read_jsonl(out)
    assert len(rows) == len(calib) and all(r["judge"].startswith("combined:") and not r["fallback"] for r in rows)
    assert all(r["judge"].endswith(f"@{cal['confidence']:g}") for r in rows)


def test_grade_refuses_what_the_scoring_judge_cannot_do(bundled_tasks, tmp_path, capsys):
    base = ["grade", "--groups", str(bundled_tasks / "groups.jsonl"), "--repos-dir", str(bundled_tasks / "repos"),
            "--out", str(tmp_path / "o.jsonl")]
    assert gagar([*base, "--judge", "combined", "--model", "m", "--adapter", str(tmp_path)]) == 2
    assert "sft calibrate" in capsys.readouterr().err
    assert gagar([*base, "--judge", "score", "--model", "m", "--backend", "openai", "--base-url", "http://x"]) == 2
    assert "prompt log-probabilities" in capsys.readouterr().err
    assert gagar([*base, "--judge", "combined", "--model", "m", "--confidence", "0.7"]) == 2
    assert "[0, 0.5]" in capsys.readouterr().err
    (tmp_path / CALIBRATION_FILE).write_text("{not json")
    assert gagar([*base, "--judge", "combined", "--model", "m", "--adapter", str(tmp_path)]) == 2
    assert "not a calibration" in capsys.readouterr().err


def test_size_balance_without_a_size_inverted_pair_is_a_clear_error(tiny, tmp_path, capsys):
    prompt = [{"role": "user", "content": "A or B?"}, {"role": "assistant", "content": "A"}]
    rows = [{**r, "messages": prompt} for r in _records([False, False])]
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"objective: decision\nmodel: {tiny}\ndata: {{train: {tmp_path / 'train.jsonl'}, balance_size: "
                   f"true}}\noutput_dir: {tmp_path / 'run'}\n")
    assert gagar(["sft", "train", "--config", str(cfg)]) == 2
    assert "--inverted" in capsys.readouterr().err
