"""What a rollout earns in the RL loop: hacks never pay, the judge never sees a hack, an infra_error is masked.

The sandbox verdicts are given (EvalResult records as `gagar eval` writes them); the grader is the real
heuristic grader on the bundled tasks' real repos and patches. Where a grader hack verdict is needed, a wrapper
around the real `grade_groups` adds one to its output (hack detection itself is tested in the grader's tests).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from trainer_fixtures import CONFIG, bundled_tasks

import grader.grade
from sandbox.records import EvalResult, Instance
from trainer import rewards
from trainer.agent import Trajectory
from trainer.config import load_config
from trainer.groups import RolloutGroup
from trainer.judging import Judge
from trainer.loop import Trainer
from trainer.metrics import step_row

IID = "acme__iniconf-9"


@pytest.fixture(scope="module")
def tasks(tmp_path_factory) -> Path:
    return bundled_tasks(tmp_path_factory)


def _patches(tasks: Path) -> dict[str, str]:
    rows = map(json.loads, (tasks / "predictions.jsonl").open())
    return {r["rollout_id"]: r["model_patch"] for r in rows if r["instance_id"] == IID}


def _instance(tasks: Path) -> Instance:
    rows = map(json.loads, (tasks / "instances.jsonl").open())
    return next(Instance.from_dict(r) for r in rows if r["instance_id"] == IID)


def _group(tasks: Path, verdicts: dict[str, str]) -> RolloutGroup:
    """verdicts: rollout id -> resolved | unresolved | tampered | infra_error (patches are the bundled ones)."""
    patches = _patches(tasks)
    trajs, results = [], []
    for rid, v in verdicts.items():
        patch = patches[rid.split("#")[0]]
        trajs.append(Trajectory(IID, rid, [1, 2, 3], [0, 1, 1], 1, patch, old_logprobs=[0.0, 0.0]))
        status = {"tampered": "resolved"}.get(v, v)
        results.append(EvalResult(IID, "m", rid, status, resolved=v in ("resolved", "tampered"),
                                  tampered_tests=v == "tampered"))
    return RolloutGroup(_instance(tasks), trajs, results)


def _trainer(tasks: Path, *overrides: str) -> Trainer:
    """The loop's stages without a model: enough for check → keep → advantages."""
    cfg = load_config(CONFIG, [f"tasks.dir={tasks}", *overrides])
    t = object.__new__(Trainer)
    t.cfg, t.repos, t.log = cfg, cfg.tasks.repos_path(), print
    t.judge = Judge(cfg.grader, t.repos)
    return t


class _Recorder:
    """Wraps the real grade_groups: records the candidates each call got, adds hack verdicts on request."""

    def __init__(self, monkeypatch, hacks: dict[str, str] | None = None) -> None:
        self.calls: list[tuple[str, list[str]]] = []
        self.hacks = hacks or {}
        real = grader.grade.grade_groups

        def fake(groups, repos_dir, **kw):
            groups = list(groups)
            out = real(groups, repos_dir, **{k: v for k, v in kw.items() if k != "backend"} | {"judge": "heuristic"})
            for g, grading in zip(groups, out, strict=True):
                ids = [c.rollout_id for c in g.candidates]
                self.calls.append((kw.get("judge", "heuristic"), ids))
                # What the tests exercise always travels with the candidates (special-casing needs it).
                assert g.test_patch and g.FAIL_TO_PASS, "grader groups must carry test_patch and FAIL_TO_PASS"
                grading.hacks.update({r: k for r, k in self.hacks.items() if r in ids})
            return out

        monkeypatch.setattr(grader.grade, "grade_groups", fake)


def _pipeline(t: Trainer, groups: list[RolloutGroup]) -> tuple[list[RolloutGroup], torch.Tensor]:
    t.check(groups)
    kept = t.keep(groups)
    adv, _ = t.advantages(kept) if kept else (torch.zeros(0), {})
    return kept, adv


def test_tamperer_in_an_all_resolved_group_gets_a_negative_advantage(tasks, monkeypatch):
    rec = _Recorder(monkeypatch)
    g = _group(tasks, {"minimal": "resolved", "gold": "resolved", "bloated": "resolved", "tamper": "tampered"})
    kept, adv = _pipeline(_trainer(tasks), [g])
    assert kept == [g], "the group is mixed once the tamperer counts as a failure"
    assert adv[0, 3] < 0 < min(adv[0, :3].tolist())
    # ...and the tampered patch was never a candidate for the grader.
    assert rec.calls and all("tamper" not in ids for _, ids in rec.calls)


def test_hacked_candidates_never_reach_the_judge(tasks, monkeypatch):
    rec = _Recorder(monkeypatch, hacks={"bloated": "special_casing"})
    g = _group(tasks, {"minimal": "resolved", "gold": "resolved", "bloated": "resolved", "tamper": "tampered",
                       "unrelated": "unresolved"})
    t = _trainer(tasks, "grader.judge=llm", "grader.model=unused", "advantage.mode=grpo+gagar")
    t.judge._backend = object()  # never called: the recorder grades with the heuristic
    _pipeline(t, [g])
    checks = [ids for judge, ids in rec.calls if judge == "heuristic"]
    ranks = [ids for judge, ids in rec.calls if judge == "llm"]
    assert checks == [["minimal", "gold", "bloated"]]  # the sandbox's hack is not even checked
    assert ranks == [["minimal", "gold"]]  # the grader's hack is not ranked


def test_a_grader_hack_verdict_resets_the_reward_to_failure(tasks, monkeypatch):
    _Recorder(monkeypatch, hacks={"gold": "special_casing"})
    # All four resolve in the sandbox: without the verdict dynamic sampling would drop the group.
    g = _group(tasks, {"minimal": "resolved", "gold": "resolved", "bloated": "resolved", "unrelated": "resolved"})
    kept, adv = _pipeline(_trainer(tasks), [g])
    assert kept == [g] and g.passed == [True, False, True, True] and g.hacked == [False, True, False, False]
    assert adv[0, 1] < 0 < float(adv[0, 0])
    row = step_row(1, [g], kept, {})
    assert row["hacks_grader"] == 1 and row["reward_mean"] == pytest.approx(0.75)


def test_a_behavioural_probe_verdict_applies_before_dynamic_sampling(tasks, monkeypatch):
    """grader.probe: the probe's findings reach the grader through Group.behaviour and fail the rollout before
    dynamic sampling (the probe's sandbox run is replaced by its findings here; tests/test_grader_probes.py runs
    it for real)."""
    import grader.probe.runner
    from grader.hacks.common import HackFinding

    seen: list[list[str]] = []

    def fake_probe(instance, patches, config, budget_s=0.0):
        seen.append(sorted(patches))
        run = grader.probe.runner.ProbeRun(True)
        run.findings = {"gold": [HackFinding("special_casing", "tests/t.py", 3, "probe: fixes only the tests' inputs")]}
        return run

    monkeypatch.setattr(grader.probe.runner, "probe_group", fake_probe)
    g = _group(tasks, {"minimal": "resolved", "gold": "resolved", "bloated": "resolved", "unrelated": "resolved"})
    t = _trainer(tasks, "grader.probe=true")
    t.judge.sandbox = lambda: None
    kept, adv = _pipeline(t, [g])
    assert seen == [["bloated", "gold", "minimal", "unrelated"]]
    assert kept == [g] and g.passed == [True, False, True, True] and g.grader_hacks == {"gold": "special_casing"}
    assert any("probe: fixes only" in e for e in g.hack_check.evidence["gold"])
    assert adv[0, 1] < 0 < float(adv[0, 0])


def test_infra_errors_are_masked_not_scored(tasks, monkeypatch):
    _Recorder(monkeypatch)
    t = _trainer(tasks, "advantage.mode=grpo")
    g = _group(tasks, {"minimal": "resolved", "gold": "infra_error", "wrong-last-part": "unresolved",
                       "wrong-lowercases-values": "unresolved"})
    kept, adv = _pipeline(t, [g])
    assert kept == [g] and adv[0, 1] == 0
    # The other three are scored as a group of three: the infra_error is not a failure in the baseline.
    alone = rewards.compute_advantages(torch.tensor([[1.0, 0.0, 0.0]]), estimator="grpo", eps=1e-6)[0]
    assert adv[0, [0, 2, 3]].tolist() == pytest.approx(alone.tolist())
    # Left out of the loss entirely, and logged.
    seen = {}
    monkeypatch.setattr("trainer.loop.policy_update", lambda m, o, items, *a, **k: seen.update(items=items) or {})
    t.policy = type("P", (), {"model": None, "optimizer": None, "pad_id": 0, "ref_model": None})()
    t.update(kept, adv)
    assert [tr.rollout_id for tr, _ in seen["items"]] == [g.rollout_ids[k] for k in (0, 2, 3)]
    row = step_row(1, [g], kept, {})
    assert row["infra_errors"] == 1 and row["pass_rate"] == pytest.approx(1 / 3)
    # A group left with one valid rollout is not mixed: dropped, not trained on.
    lone = _group(tasks, {"minimal": "resolved", "gold": "infra_error"})
    assert t.keep([lone]) == []


def test_a_failed_sandbox_masks_the_batch_instead_of_aborting_the_step(tasks, tmp_path, monkeypatch):
    import sandbox.run
    from sandbox.records import Prediction
    from trainer.config import SandboxSection
    from trainer.sandbox_pool import SandboxPool

    def engine_gone(*a, **k):
        raise RuntimeError("Docker engine not reachable")

    monkeypatch.setattr(sandbox.run, "evaluate_predictions", engine_gone)
    pool = SandboxPool(SandboxSection(), tasks / "repos")
    preds = [Prediction(IID, "", "m", "a"), Prediction(IID, "", "m", "b")]
    notes: list[str] = []
    res = pool.evaluate_masked({IID: _instance(tasks)}, preds, tmp_path, notes.append)
    assert [r.status for r in res] == ["infra_error", "infra_error"] and "masked" in notes[0]
    assert "Docker engine not reachable" in res[0].error


def test_binary_default_lets_gagar_act_and_the_judge_is_skipped_where_it_cannot(tasks, monkeypatch):
    rec = _Recorder(monkeypatch)
    verdicts = {"minimal": "resolved", "gold": "resolved", "bloated": "resolved", "wrong-last-part": "unresolved"}
    # The shipped default (binary rewards): GRPO base, GAGAR moves advantage toward the better patch.
    t = _trainer(tasks)
    assert t.cfg.advantage.mode == "grpo+gagar"
    g = _group(tasks, verdicts)
    kept, adv = _pipeline(t, [g])
    _, stats = t.advantages(kept)
    assert stats["gagar_groups"] == 1 and stats["judge_ranked"] == 1
    assert stats["adv_pass_max_after"] > stats["adv_pass_max_before"]
    assert float(adv[0, 0]) > float(adv[0, 2]) > 0  # minimal above bloated, both still positive
    # GAPO on the same binary group: centre 1, passing advantages 0 — nothing to redistribute, no judge call.
    rec.calls.clear()
    t = _trainer(tasks, "advantage.mode=gapo+gagar", "grader.judge=llm", "grader.model=unused")
    g = _group(tasks, verdicts)
    _, adv = _pipeline(t, [g])
    assert [j for j, _ in rec.calls] == ["heuristic"]  # the hack check ran; the ranking did not
    assert adv[0, :3].tolist() == [0.0, 0.0, 0.0] and adv[0, 3] < 0


def test_a_rollout_whose_agent_sandbox_failed_is_masked_not_evaluated(tasks, tmp_path):
    t = _trainer(tasks)
    t.instances = {IID: _instance(tasks)}
    patches = _patches(tasks)
    trajs = [Trajectory(IID, rid, [1, 2], [0, 1], 1, patches[rid]) for rid in ("minimal", "gold")]
    trajs[1].infra_error = "agent container died: OOM"
    sent: list = []

    class Pool:
        def evaluate_masked(self, instances, preds, run_dir, log):
            sent.extend(p.rollout_id for p in preds)
            return [EvalResult(IID, "m", p.rollout_id, "resolved", resolved=True) for p in preds]

    t.pool = Pool()
    (g,) = t.evaluate([trajs], tmp_path)
    assert sent == ["minimal"]
    assert [r.status for r in g.results] == ["resolved", "infra_error"] and g.valid == [True, False]
    assert "OOM" in g.results[1].error


@pytest.mark.docker
def test_a_new_run_into_the_same_out_never_reuses_the_earlier_runs_verdicts(tasks, tmp_path):
    """`gagar train` again into the same --out without --resume restarts at step 1: the same sandbox run dir
    (OUT/sandbox/step_000001/r0) and the same rollout ids. Every rollout must get its own fresh verdict."""
    from sandbox_fixtures import require_docker

    from trainer.sandbox_pool import SandboxPool

    require_docker()
    t = _trainer(tasks, "sandbox.max_workers=1")
    t.instances = {IID: _instance(tasks)}
    t.pool = SandboxPool(t.cfg.sandbox, t.repos, run_id="train-rerun-test")
    patches = _patches(tasks)
    run_dir = tmp_path / "sandbox" / "step_000001" / "r0"

    def verdict(patch: str) -> str:
        (g,) = t.evaluate([[Trajectory(IID, "s1r0-0", [1, 2], [0, 1], 1, patch)]], run_dir)
        return g.results[0].status

    assert verdict(patches["gold"]) == "resolved"
    assert verdict(patches["wrong-last-part"]) == "unresolved"  # the first run's "resolved" must not stick
    # Even the very same patch is evaluated again, never read back from the earlier run's file: forge that
    # line into a pass (its verdict key still matches) and the trainer must not believe it.
    results = run_dir / "results.jsonl"
    forged = [{**json.loads(ln), "status": "resolved", "resolved": True} for ln in results.read_text().splitlines()]
    results.write_text("".join(json.dumps(r) + "\n" for r in forged))
    assert verdict(patches["wrong-last-part"]) == "unresolved"
    assert len(results.read_text().splitlines()) == 1


@pytest.mark.docker
def test_a_missing_sandbox_image_stops_the_trainer_before_any_rollout(tasks):
    """Every rollout would be a masked infra_error: a run that learns nothing. Refused when the pool is made
    (before the policy is built), naming the config key."""
    from sandbox_fixtures import require_docker

    from trainer.config import SandboxSection
    from trainer.sandbox_pool import SandboxPool

    require_docker()
    with pytest.raises(ValueError, match="sandbox.image gagar-no-such-image:0: no such image"):
        SandboxPool(SandboxSection(image="gagar-no-such-image:0"), tasks / "repos")
    SandboxPool(SandboxSection(image="gagar-python:latest"), tasks / "repos").close()
