"""The loop experiment on a real policy: its pieces (task splits, the windowed single-turn context, the scope of a
patch against the reference fix, held-out pass@k) and, slow, `gagar experiment loop --quick` on
configs/loop_real.yaml with the pretrained SmolLM2 policy on a two-project cut of the synthesized tasks."""

from __future__ import annotations

import json
from math import comb
from pathlib import Path

import pytest
from sandbox_fixtures import commit_tree, git

from sandbox.records import Instance
from trainer.agent.prompts import _window, context_files
from trainer.config import TasksConfig
from trainer.experiments.heldout import heldout_ids, pass_at_k
from trainer.experiments.scope import task_scope
from trainer.tasks import load_instances

ROOT = Path(__file__).resolve().parents[1]
SYNTH = ROOT / "examples" / "synth"




def _repo_with_fix(root: Path, base: str, fixed: str) -> tuple[Path, str, str]:
    """A repository acme/demo whose base commit holds `base` as mod.py; returns (repo, base commit, the diff to
    `fixed`)."""
    repo = root / "acme__demo"
    repo.mkdir(parents=True)
    commit = commit_tree(repo, {"mod.py": base})
    (repo / "mod.py").write_text(fixed)
    patch = git(repo, "diff")
    git(repo, "checkout", "-q", "--", "mod.py")
    return repo, commit, patch


def _instance(commit: str, patch: str) -> Instance:
    return Instance.from_dict({"instance_id": "acme__demo-1", "repo": "acme/demo", "base_commit": commit,
                               "patch": patch, "FAIL_TO_PASS": ["t.py::t"], "PASS_TO_PASS": []})


def _diff(base: str, changed: str, tmp: Path) -> str:
    return _repo_with_fix(tmp, base, changed)[2]


def test_pass_at_k_is_the_unbiased_estimator() -> None:
    for n in range(1, 11):
        for c in range(n + 1):
            for k in range(1, n + 1):
                want = 1.0 - comb(n - c, k) / comb(n, k)
                assert pass_at_k(n, c, k) == pytest.approx(want, abs=1e-12), (n, c, k)


def test_heldout_subset_is_fixed_and_independent_of_order() -> None:
    ids = [f"t-{i}" for i in range(40)]
    a, b = heldout_ids(ids, 7), heldout_ids(list(reversed(ids)), 7)
    assert a == b and len(a) == 7 and set(a) <= set(ids)
    assert heldout_ids(ids, 0) == sorted(ids) and heldout_ids(ids, 99) == sorted(ids)


def test_tasks_split_keeps_one_split_and_names_what_is_wrong(tmp_path: Path) -> None:
    rows = [json.loads(ln) for ln in (SYNTH / "instances.jsonl").read_text().splitlines()[:6]]
    (tmp_path / "instances.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    ids = [r["instance_id"] for r in rows]
    tasks = TasksConfig(dir=str(tmp_path), split="train")
    with pytest.raises(ValueError, match="splits.json"):
        load_instances(tasks)
    (tmp_path / "splits.json").write_text(json.dumps({"seed": 0, "train": ids[:4], "heldout": ids[4:]}))
    assert sorted(load_instances(tasks)) == sorted(ids[:4])
    assert sorted(load_instances(TasksConfig(dir=str(tmp_path), split="heldout"))) == sorted(ids[4:])
    assert len(load_instances(TasksConfig(dir=str(tmp_path)))) == 6
    with pytest.raises(ValueError, match="has no split 'dev'.*train, heldout"):
        load_instances(TasksConfig(dir=str(tmp_path), split="dev"))


def test_a_large_oracle_file_is_shown_around_the_fix(tmp_path: Path) -> None:
    base = "".join(f"def f{i}(x):\n    return x + {i}\n\n" for i in range(200))
    fixed = base.replace("return x + 150\n", "return x - 150\n")
    repo, commit, patch = _repo_with_fix(tmp_path / "repos", base, fixed)
    (path, text), = context_files(_instance(commit, patch), repo, 400)
    assert "return x + 150" in text and len(text) <= 400
    lo, hi = (int(x) for x in path.split("(lines ")[1].split(" of")[0].split("-"))
    assert path.startswith("mod.py (lines ") and path.endswith(f" of {base.count(chr(10)) + 1})")
    assert lo <= 452 <= hi  # `return x + 150` is line 452
    assert text == "".join(base.splitlines(keepends=True)[lo - 1 : hi])
    # a file that fits is shown whole, without a line range
    (whole_path, whole), = context_files(_instance(commit, patch), repo, 10**6)
    assert whole_path == "mod.py" and whole == base


@pytest.mark.parametrize("centre", [1, 2, 50, 99, 100])
def test_window_holds_whole_lines_around_the_centre(centre: int) -> None:
    text = "".join(f"line {i:03d} {'x' * (i % 7)}\n" for i in range(1, 101))
    shown, lo, hi = _window(text, centre, 120)
    assert lo <= centre <= hi and len(shown) <= 120
    assert shown == "".join(text.splitlines(keepends=True)[lo - 1 : hi])
    assert abs((centre - lo) - (hi - centre)) <= 2 or lo == 1 or hi == 100  # centred unless at an edge


def test_scope_counts_changes_outside_the_functions_the_fix_changes(tmp_path: Path) -> None:
    base = ("import os\n\n\ndef f(x):\n    y = x + 1\n    return y\n\n\n"
            "def g(x):\n    return x * 2\n\n\nclass C:\n    def m(self):\n        return 1\n")
    fix = base.replace("    y = x + 1\n", "    y = x - 1\n")
    repo, commit, gold = _repo_with_fix(tmp_path / "repos", base, fix)
    scope = task_scope(_instance(commit, gold), repo)
    assert scope.outside(gold) == 0
    in_scope = _diff(base, base.replace("    return y\n", "    return y  # fixed\n").replace("x + 1", "x - 1"),
                     tmp_path / "a")
    assert scope.outside(in_scope) == 0
    creep = _diff(base, fix.replace("return x * 2", "return x * 3").replace("import os\n", "import os\nimport re\n"),
                  tmp_path / "b")
    assert scope.outside(creep) == 3  # g's line removed and added, and the new module-level import
    method = _diff(base, fix.replace("        return 1\n", "        return 2\n"), tmp_path / "c")
    assert scope.outside(method) == 2
    assert scope.outside("not a diff") == 0


@pytest.mark.docker
@pytest.mark.slow
def test_quick_loop_experiment_on_the_real_policy(bundled_tasks: Path, tmp_path: Path) -> None:
    """Two projects of the synthesized set (one train, one held out), the pretrained policy with LoRA (warm-started
    on 2 mutation pairs of the train project), two arms: the output's shape, held-out figures for every arm, and a
    control arm whose adapter is still PEFT's zero initialisation after its RL steps."""
    from model_fixtures import models_cache
    from safetensors.torch import load_file

    from trainer.experiments.cli import main

    keep = {"train": "pypi/cachetools", "heldout": "pypi/inflection"}
    mini = tmp_path / "set"
    mini.mkdir()
    rows = [json.loads(ln) for ln in (SYNTH / "instances.jsonl").read_text().splitlines() if ln.strip()]
    rows = [r for r in rows if r["repo"] in keep.values()]
    ids = {r["instance_id"] for r in rows}
    (mini / "instances.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    meta = [ln for ln in (SYNTH / "tasks_meta.jsonl").read_text().splitlines() if json.loads(ln)["instance_id"] in ids]
    (mini / "tasks_meta.jsonl").write_text("\n".join(meta) + "\n")
    manifest = json.loads((SYNTH / "manifest.json").read_text())
    manifest["sources"] = [s for s in manifest["sources"] if s["repo"] in keep.values()]
    (mini / "manifest.json").write_text(json.dumps(manifest))
    splits = {name: sorted(r["instance_id"] for r in rows if r["repo"] == repo) for name, repo in keep.items()}
    (mini / "splits.json").write_text(json.dumps({**splits, "repos": {k: [v] for k, v in keep.items()}}))

    out, work = tmp_path / "out", tmp_path / "work"
    rc = main(["loop", "--config", str(ROOT / "configs" / "loop_real.yaml"), "--quick", "--arms",
               "grpo+gagar,control", "--out", str(out), "--work", str(work),
               "--set", f"model.cache_dir={json.dumps(str(models_cache()))}",
               "--set", f"tasks.instances={json.dumps(str(mini / 'instances.jsonl'))}",
               "--set", f"tasks.repos_dir={json.dumps(str(tmp_path / 'synth' / 'repos'))}",
               "--set", "warmstart.mutations=2", "--set", "warmstart.epochs=1", "--set", "warmstart.batch_size=1",
               "--set", "tasks.frontier_k=0", "--set", "rollout.max_new_tokens=48"])
    assert rc == 0
    result = json.loads((out / "loop-quick.json").read_text())
    assert (out / "loop-quick.png").stat().st_size > 10_000
    assert result["heldout"] == {"split": "heldout", "tasks": 1, "k": 2}
    for arm in ("grpo+gagar", "control"):
        seed = result["per_seed"][arm][0]
        assert [r["step"] for r in seed["steps"]] == [1, 2]
        held = seed["heldout"]
        assert held["tasks"] and set(held["tasks"]) <= set(splits["heldout"])
        assert 0.0 <= held["pass1_greedy"] <= 1.0 and 0.0 <= held["pass2"] <= 1.0
        assert result["results"][arm]["heldout"]["pass1_greedy"]["n"] == 1
    ckpts = sorted((work / "loop-quick" / "control-seed0" / "checkpoints").glob("step_*"))
    weights = load_file(str(ckpts[-1] / "weights" / "adapter_model.safetensors"))
    lora_b = [v for k, v in weights.items() if "lora_B" in k]
    assert lora_b and all(int((v != 0).sum()) == 0 for v in lora_b)


def test_a_task_set_without_rollouts_warm_starts_on_its_reference_fixes(tmp_path: Path) -> None:
    from trainer.config import load_config
    from trainer.warmstart import warmstart_examples

    rows = [json.loads(ln) for ln in (SYNTH / "instances.jsonl").read_text().splitlines()[:10]]
    (tmp_path / "instances.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = load_config(ROOT / "configs" / "loop_real.yaml", [f"tasks.instances={tmp_path / 'instances.jsonl'}",
                                                            "tasks.split=\"\"", "warmstart.max_examples=4"])
    instances = load_instances(cfg)
    got = warmstart_examples(cfg, instances)
    assert len(got) == 4 and {k for _, k, _ in got} == {"gold"}
    assert all(p == "".join(ln for ln in instances[i].patch.splitlines(keepends=True) if not ln.startswith("index "))
               for i, _, p in got)
    seeds = {tuple(i for i, _, _ in warmstart_examples(cfg.model_copy(update={"seed": s}), instances)) for s in (0, 1)}
    assert len(seeds) == 1  # the same subset for every seed: seeds differ in sampling, not in what is imitated
    cfg_all = cfg.model_copy(update={"warmstart": cfg.warmstart.model_copy(update={"max_examples": 0})})
    assert len(warmstart_examples(cfg_all, instances)) == 10


def test_an_unknown_split_is_refused_before_anything_runs(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from trainer.experiments.cli import main

    for flags in (["--set", "tasks.split=dev"], ["--heldout-split", "dev"]):
        rc = main(["loop", "--config", str(ROOT / "configs" / "loop_real.yaml"), "--out", str(tmp_path),
                   "--set", f"tasks.repos_dir={tmp_path / 'no' / 'repos'}", *flags])
        assert rc == 2
        assert "has no split 'dev'" in capsys.readouterr().err


def test_heldout_hands_the_trained_adapter_to_a_separate_engine(tmp_path: Path, monkeypatch) -> None:
    """Regression: with a separate sampling engine (`rollout.backend: vllm` or `vllm-server`) the held-out
    evaluation never handed it the checkpoint's adapter, so it sampled the base model and every arm scored the
    untrained policy. STAND-INS for the policy, the engine and the sandbox: this checks the order of the calls
    (tests/test_vllm_engine.py shows a synced adapter moving the real engine's samples)."""
    import types

    from sandbox.records import EvalResult
    from trainer.agent import Trajectory
    from trainer.config import TrainConfig
    from trainer.experiments import heldout

    calls: list[tuple] = []
    model = types.SimpleNamespace(eval=lambda: None)

    class Engine:
        def sync_weights(self, m: object, step: int) -> None:
            calls.append(("sync", m is model, step))

        def close(self) -> None:
            calls.append(("close",))

    def generate(rc, backend, tok, instances, ids, tag, **kw):
        calls.append(("generate", tag))
        return [[Trajectory(i, f"{tag}-{i}-{k}", [1, 2], [0, 1], 1, "") for k in range(rc.n)] for i in ids]

    class Pool:
        def config(self) -> None:
            return None

        def evaluate_masked(self, instances, preds, run_dir, log):
            return [EvalResult(p.instance_id, "m", p.rollout_id, "unresolved") for p in preds]

    inst = _instance("0" * 40, "")
    monkeypatch.setattr("trainer.tasks.load_instances", lambda cfg: {inst.instance_id: inst})
    monkeypatch.setattr("trainer.policy.build_policy", lambda *a, **k: types.SimpleNamespace(
        model=model, tokenizer=None, base_path="/warm"))
    monkeypatch.setattr("trainer.rollout.make_backend", lambda *a, **k: Engine())
    monkeypatch.setattr("trainer.generation.generate", generate)
    monkeypatch.setattr("trainer.sandbox_pool.SandboxPool", lambda *a, **k: Pool())
    monkeypatch.setattr(heldout, "task_scope", lambda *a: types.SimpleNamespace(outside=lambda p: 0))
    run = tmp_path / "run"
    (run / "checkpoints" / "step_000003").mkdir(parents=True)
    (run / "checkpoints" / "step_000003" / "state.json").write_text('{"step": 3}')
    cfg = TrainConfig()
    cfg.rollout.backend = "vllm"
    cfg.tasks.dir = str(tmp_path / "tasks")
    got = heldout.evaluate_heldout(cfg, run, max_tasks=1, k=2, log=lambda m: None)
    assert calls[0] == ("sync", True, 3)  # the trained adapter first, before any sample
    assert [c[0] for c in calls[1:]] == ["generate", "generate", "close"]
    assert got["pass1_greedy"] == 0.0 and got["checkpoint"] == "step_000003"
