"""The held-out measurement and the splits around it (issue 38, part 5). Each test here failed on the code before
its fix: a cached `heldout.json` reused for another checkpoint or other tasks; grader-flagged hacks counted as
passing; a pass@k computed from fewer than k samples; a held-out split equal to (or overlapping) the training
split accepted; `warmstart.tasks_dir` ignoring `tasks.split`; unseeded held-out sampling; quality labels read
from `.gagar/tasks` when the tasks come from `tasks.instances`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from grader.records import Grading
from sandbox.records import EvalResult, Instance
from trainer.agent import Trajectory
from trainer.config import load_config
from trainer.experiments import heldout
from trainer.groups import RolloutGroup

ROOT = Path(__file__).resolve().parents[1]
SYNTH = ROOT / "examples" / "synth"
REAL = ROOT / "configs" / "loop_real.yaml"


def _mini_set(tmp: Path, n: int = 6) -> tuple[Path, list[str]]:
    """The first `n` synthesized tasks, the first half `train` and the rest `heldout`."""
    rows = [json.loads(x) for x in (SYNTH / "instances.jsonl").read_text().splitlines()[:n]]
    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / "instances.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    ids = [r["instance_id"] for r in rows]
    (tmp / "splits.json").write_text(json.dumps({"train": ids[: n // 2], "heldout": ids[n // 2 :]}))
    return tmp / "instances.jsonl", ids


def _checkpoint(run: Path, step: int, weights: bytes) -> None:
    ckpt = run / "checkpoints" / f"step_{step:06d}"
    (ckpt / "weights").mkdir(parents=True)
    (ckpt / "weights" / "adapter_model.safetensors").write_bytes(weights)
    (ckpt / "state.json").write_text(json.dumps({"step": step}))


def test_heldout_cache_follows_the_checkpoint_and_the_tasks(tmp_path: Path, monkeypatch) -> None:
    """A rerun with more steps (a new checkpoint), a retrained checkpoint of the same step, or changed tasks
    measure again; the same checkpoint and tasks reuse `heldout.json`."""
    inst, _ = _mini_set(tmp_path / "set")
    cfg = load_config(REAL, [f"tasks.instances={inst}", "tasks.split=heldout"])
    run = tmp_path / "run"
    _checkpoint(run, 1, b"one")
    calls = []
    monkeypatch.setattr(heldout, "measure",
                        lambda c, r, ck, i, k, log, **kw: calls.append(ck.name) or {"pass1_greedy": 0.5},
                        raising=False)
    first = heldout.evaluate_heldout(cfg, run, max_tasks=0, k=2, log=lambda m: None)
    assert first["pass1_greedy"] == 0.5 and calls == ["step_000001"]
    heldout.evaluate_heldout(cfg, run, max_tasks=0, k=2, log=lambda m: None)
    assert calls == ["step_000001"]  # reused
    _checkpoint(run, 2, b"two")
    assert heldout.evaluate_heldout(cfg, run, max_tasks=0, k=2, log=lambda m: None)["checkpoint"] == "step_000002"
    assert calls == ["step_000001", "step_000002"]
    (run / "checkpoints" / "step_000002" / "weights" / "adapter_model.safetensors").write_bytes(b"retrained")
    heldout.evaluate_heldout(cfg, run, max_tasks=0, k=2, log=lambda m: None)
    assert len(calls) == 3
    rows = [json.loads(x) for x in inst.read_text().splitlines()]
    rows[-1]["problem_statement"] += "\nOne more line.\n"
    inst.write_text("".join(json.dumps(r) + "\n" for r in rows))
    heldout.evaluate_heldout(cfg, run, max_tasks=0, k=2, log=lambda m: None)
    assert len(calls) == 4


def _group(iid: str, outcomes: list[str], hacks: dict[str, str] | None = None) -> RolloutGroup:
    """outcomes: pass | fail | infra per rollout; `hacks`: rollout ids the grader flagged."""
    inst = Instance.from_dict(json.loads((SYNTH / "instances.jsonl").read_text().splitlines()[0]) | {"instance_id": iid})
    status = {"pass": "resolved", "fail": "unresolved", "infra": "infra_error"}
    trajs = [Trajectory(iid, f"{iid}-{k}", [1, 2], [0, 1], 1, "") for k in range(len(outcomes))]
    results = [EvalResult(iid, "m", f"{iid}-{k}", status[o], resolved=o == "pass") for k, o in enumerate(outcomes)]
    g = RolloutGroup(inst, trajs, results)
    if hacks:
        g.hack_check = Grading(iid, [], {}, {}, {}, "heuristic", hacks=hacks)
    return g


class _NoScope:
    def outside(self, patch: str) -> int:
        return 0


def test_heldout_pass_counts_no_grader_flagged_hack() -> None:
    """A rollout the sandbox resolved but the grader's hack check flagged fails, as it does in training."""
    greedy = [_group("a", ["pass"], {"a-0": "special_casing"}), _group("b", ["pass"])]
    sampled = [_group("a", ["pass", "pass"], {"a-0": "silencing", "a-1": "silencing"}), _group("b", ["fail", "pass"])]
    out = heldout.summarize(heldout.judged(greedy), heldout.judged(sampled), {"a": _NoScope(), "b": _NoScope()}, 2)
    assert out["pass1_greedy"] == 0.5 and out["pass2"] == 0.5 and out["pass1_sampled"] == 0.25
    assert out["hacks_grader"] == 3 and out["passing_patches"] == 2


def test_pass_at_k_leaves_out_tasks_with_fewer_than_k_samples() -> None:
    """A task with 2 judged samples (one infra_error) has no pass@3; it is not reported as one."""
    sampled = [_group("a", ["pass", "fail", "infra"]), _group("b", ["fail", "fail", "pass"])]
    greedy = heldout.judged([_group("a", ["pass"]), _group("b", ["fail"])])
    out = heldout.summarize(greedy, heldout.judged(sampled), {"a": _NoScope(), "b": _NoScope()}, 3)
    assert out["pass3_tasks"] == 1 and out["pass3"] == 1.0 and out["infra_errors"] == 1
    only_short = heldout.summarize([], heldout.judged([_group("a", ["pass", "infra", "infra"])]), {"a": _NoScope()}, 3)
    assert only_short["pass3"] is None and only_short["pass3_tasks"] == 0


@pytest.mark.parametrize("flags, why", [
    (["--heldout-split", "train"], "is the training split"),
    (["--heldout-split", "overlap"], "share 1 task"),
    (["--set", 'tasks.split=""', "--heldout-split", "heldout"], "trains on every task"),
])
def test_a_heldout_split_that_is_trained_on_is_refused(tmp_path: Path, capsys, flags, why) -> None:
    from trainer.experiments.cli import main

    inst, ids = _mini_set(tmp_path / "set")
    splits = json.loads((inst.parent / "splits.json").read_text())
    (inst.parent / "splits.json").write_text(json.dumps({**splits, "overlap": [ids[0], ids[-1]]}))
    rc = main(["loop", "--config", str(REAL), "--out", str(tmp_path / "out"), "--set", f"tasks.instances={inst}",
               "--set", f"tasks.repos_dir={tmp_path / 'no' / 'repos'}", *flags])
    assert rc == 2 and why in capsys.readouterr().err


def test_warmstart_tasks_dir_keeps_the_training_split(tmp_path: Path) -> None:
    """Pointed at the training set itself, the warm start imitates the training split only; a set that holds
    held-out tasks without splits of its own is refused."""
    from trainer.warmstart import warmstart_tasks

    inst, ids = _mini_set(tmp_path / "set")
    cfg = load_config(REAL, [f"tasks.instances={inst}", f"warmstart.tasks_dir={inst.parent}"])
    got, _ = warmstart_tasks(cfg, {})
    assert sorted(got) == sorted(ids[:3])
    other = tmp_path / "other"
    other.mkdir()
    (other / "instances.jsonl").write_text(inst.read_text())
    with pytest.raises(ValueError, match="3 task\\(s\\) of a split the run does not train on"):
        warmstart_tasks(load_config(REAL, [f"tasks.instances={inst}", f"warmstart.tasks_dir={other}"]), {})


def test_quality_labels_come_from_the_tasks_trained_on(tmp_path: Path) -> None:
    """With `tasks.instances` set, the rollouts' quality labels are those beside that file, not `tasks.dir`'s."""
    from trainer.experiments.loop import Quality

    inst, ids = _mini_set(tmp_path / "set")
    other = tmp_path / "other"
    other.mkdir()
    for where, kind in ((inst.parent, "minimal"), (other, "bloated")):
        (where / "predictions.jsonl").write_text(json.dumps({"instance_id": ids[0], "rollout_id": "r1",
                                                             "model_patch": "diff --git a/x b/x\n"}) + "\n")
        (where / "expected.jsonl").write_text(json.dumps({"instance_id": ids[0], "rollout_id": "r1",
                                                          "kind": kind}) + "\n")
    cfg = load_config(REAL, [f"tasks.instances={inst}", f"tasks.dir={other}"])
    assert set(Quality(cfg).labels.values()) == {"minimal"}


def test_heldout_draws_are_seeded(tmp_path_factory) -> None:
    """The held-out samples of one policy are the same on every call (the sampler is seeded by the run's seed),
    and another seed draws others. The tiny random model stands in for the policy: this checks the plumbing."""
    from trainer_fixtures import CONFIG, bundled_tasks, model_cache

    from inference.hf import TransformersBackend
    from trainer.policy import base_model_path, load_policy, load_tokenizer
    from trainer.tasks import load_instances

    tasks = bundled_tasks(tmp_path_factory)
    cfg = load_config(CONFIG, [f"model.cache_dir={model_cache(tmp_path_factory)}", f"tasks.dir={tasks}",
                               "rollout.max_new_tokens=12", "rollout.temperature=1.0"])
    path = base_model_path(cfg.model)
    tok, model = load_tokenizer(path), load_policy(cfg, path).eval()
    backend = TransformersBackend(model, tokenizer=tok)
    every = load_instances(cfg)
    instances = {i: every[i] for i in sorted(every)[:2]}

    def tokens(c) -> list[list[int]]:
        return [t.token_ids for g in heldout.draw(c, backend, tok, instances, 3, sandbox=None)["sampled"] for t in g]

    first = tokens(cfg)
    assert tokens(cfg) == first
    assert tokens(cfg.model_copy(update={"seed": 1})) != first


def test_outcomes_say_what_the_answers_got_wrong() -> None:
    """Held-out figures count each answer once: a format error by its reason (without its specifics), an unchanged
    answer, the sandbox's status of a well-formed wrong fix, a pass."""
    from trainer.experiments.heldout import outcomes

    rows = [{"passed": False, "format_error": "the code does not parse (invalid syntax, line 3)", "patch": ""},
            {"passed": False, "format_error": "the code does not parse (unexpected indent, line 9)", "patch": ""},
            {"passed": False, "format_error": "the answer must be the whole function `f`, and only it", "patch": ""},
            {"passed": False, "format_error": None, "patch": "", "status": "empty_patch"},
            {"passed": False, "format_error": None, "patch": "--- a/x\n", "status": "unresolved"},
            {"passed": True, "format_error": None, "patch": "--- a/x\n", "status": "resolved"}]
    assert outcomes(rows) == {"format: the code does not parse": 2,
                              "format: the answer must be the whole function, and only it": 1,
                              "no change": 1, "unresolved": 1, "passed": 1}
