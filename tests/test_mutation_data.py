"""Mutation pairs for the warm start (`trainer.mutation_data`): made from the training split's projects only — no
pair from a held-out project, checked in code — never a training task's own bug, each answer turning back into
exactly the fix, and deterministic for a seed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from sandbox_fixtures import commit_tree

from sandbox.records import Instance
from synth.mutate import find_mutations
from trainer.agent.edits import changed_line, find_region, make_diff, patched, to_patch
from trainer.mutation_data import mutation_pairs, training_projects

LIB_A = '''def clamp(value, low, high):
    if value < low:
        return low
    if value > high:
        return high
    return value


def total(items):
    out = 0
    for x in items:
        out += x
    return out
'''
TEST_A = '''from liba import clamp, total


def test_clamp():
    assert clamp(5, 0, 3) == 3


def test_total():
    assert total([1, 2]) == 3
'''
LIB_B = '''def heldout_secret(word):
    if word.endswith("s"):
        return word[:-1]
    return word
'''


def _project(root: Path, repo: str, files: dict[str, str], broken: dict[str, str]) -> tuple[Path, str]:
    """A task repository: the clean source, and one task commit on top (the broken code); its base commit."""
    path = root / repo.replace("/", "__")
    path.mkdir(parents=True)
    commit_tree(path, files, "clean")
    return path, commit_tree(path, broken, "task")


@pytest.fixture
def task_set(tmp_path: Path) -> tuple[Path, dict[str, Instance]]:
    repos = tmp_path / "repos"
    _, a = _project(repos, "acme/a", {"liba.py": LIB_A, "tests/test_a.py": TEST_A},
                    {"liba.py": LIB_A.replace("value < low", "value <= low")})
    _, b = _project(repos, "acme/b", {"libb.py": LIB_B}, {"libb.py": LIB_B.replace('"s"', '"x"')})
    rows = [{"instance_id": "acme__a-synth-0", "repo": "acme/a", "base_commit": a, "patch": "",
             "FAIL_TO_PASS": ["tests/test_a.py::test_clamp"], "PASS_TO_PASS": [], "test_cmd": "pytest"},
            {"instance_id": "acme__b-synth-0", "repo": "acme/b", "base_commit": b, "patch": "",
             "FAIL_TO_PASS": ["t.py::t"], "PASS_TO_PASS": [], "test_cmd": "pytest"}]
    sets = tmp_path / "set"
    sets.mkdir()
    (sets / "instances.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (sets / "splits.json").write_text(json.dumps({"repos": {"train": ["acme/a"], "heldout": ["acme/b"]},
                                                  "train": ["acme__a-synth-0"], "heldout": ["acme__b-synth-0"]}))
    return sets / "instances.jsonl", {r["instance_id"]: Instance.from_dict(r) for r in rows}


@pytest.mark.parametrize("fmt", ["function", "search_replace", "diff"])
def test_pairs_come_from_training_projects_only_and_undo_their_bug(task_set, fmt: str) -> None:
    inst_path, instances = task_set
    projects = training_projects(inst_path, inst_path.parent.parent / "repos", "train", instances)
    assert [p.repo for p in projects] == ["acme/a"]
    pairs = mutation_pairs(projects, count=12, seed=0, edit_format=fmt, max_region_lines=30, max_chars=2000,
                           per_function=6)
    assert 6 <= len(pairs) <= 12 and {p["repo"] for p in pairs} == {"acme/a"}
    assert not any("heldout_secret" in m["content"] for p in pairs for m in p["messages"])
    assert len({p["kind"] for p in pairs}) >= 4  # round robin over the bug kinds
    by_key = {m.key: m for m in find_mutations("liba.py", LIB_A)}
    for p in pairs:
        _system, user, answer = (m["content"] for m in p["messages"])
        assert user.startswith("Repository: acme/a\nIssue:\n") and "make them pass without changing the tests" in user
        # the answer, parsed as the policy's would be, restores the clean file exactly
        broken = by_key[p["key"]].apply(LIB_A)
        region = find_region("liba.py", broken, changed_line(make_diff("liba.py", broken, LIB_A), "liba.py"),
                             max_lines=30, max_chars=2000)
        assert patched(broken, to_patch(fmt, answer, region), "liba.py") == LIB_A
    # a pair's issue names the project's tests that use the broken function (read, not run)
    assert any("tests/test_a.py::test_clamp" in p["messages"][1]["content"] for p in pairs if p["function"] == "clamp")
    again = mutation_pairs(projects, count=12, seed=0, edit_format=fmt, max_region_lines=30, max_chars=2000,
                           per_function=6)
    assert again == pairs


def test_a_training_task_bug_is_never_a_pair(task_set) -> None:
    inst_path, instances = task_set
    repos = inst_path.parent.parent / "repos"
    [project] = training_projects(inst_path, repos, "train", instances)
    pairs = mutation_pairs([project], count=200, seed=0, edit_format="function", max_region_lines=30,
                           max_chars=2000, per_function=50)
    key = next(p["key"] for p in pairs if p["function"] == "clamp" and p["kind"] == "compare_flip")
    (inst_path.parent / "tasks_meta.jsonl").write_text(json.dumps({"instance_id": "acme__a-synth-0", "key": key})
                                                       + "\n")
    [project] = training_projects(inst_path, repos, "train", instances)
    assert project.task_keys == {key}
    again = mutation_pairs([project], count=200, seed=0, edit_format="function", max_region_lines=30,
                           max_chars=2000, per_function=50)
    assert key not in {p["key"] for p in again} and len(again) == len(pairs) - 1


def test_held_out_projects_are_refused(task_set) -> None:
    inst_path, instances = task_set
    splits_path = inst_path.parent / "splits.json"
    repos = inst_path.parent.parent / "repos"
    splits = json.loads(splits_path.read_text())
    splits_path.write_text(json.dumps({**splits, "repos": {"train": ["acme/a", "acme/b"], "heldout": ["acme/b"]}}))
    with pytest.raises(ValueError, match="acme/b is listed in split 'train' and in another split"):
        training_projects(inst_path, repos, "train", instances)
    # a training project one of whose tasks is held out
    splits_path.write_text(json.dumps({**splits, "repos": {"train": ["acme/a", "acme/b"], "heldout": []}}))
    with pytest.raises(ValueError, match="acme/b is a train project but its task acme__b-synth-0 is not in that split"):
        training_projects(inst_path, repos, "train", instances)
    splits_path.write_text(json.dumps({"train": ["acme__a-synth-0"]}))
    with pytest.raises(ValueError, match="repositories of split 'train'"):
        training_projects(inst_path, repos, "train", instances)


def test_the_committed_set_makes_pairs_only_from_its_train_projects() -> None:
    """On the committed synthesized set's splits: the train split's projects are exactly its train repositories,
    none of the held-out ones (boltons, inflection, isodate) — without building any repository."""
    root = Path(__file__).resolve().parents[1] / "examples" / "synth"
    splits = json.loads((root / "splits.json").read_text())
    assert not set(splits["repos"]["train"]) & set(splits["repos"]["heldout"])
    assert {"pypi/boltons", "pypi/inflection", "pypi/isodate"} == set(splits["repos"]["heldout"])


def test_mutation_warm_start_trains_once_and_is_cached_by_its_inputs(task_set, tmp_path: Path, monkeypatch) -> None:
    """The warm start on mutation pairs (TRL + PEFT LoRA, merged), cached by data + settings + base model: the
    same inputs reuse it without training, another edit format is another warm start. The tiny random model
    stands in for the policy's base: this checks the plumbing, not what it learns."""
    import sft.train
    from trainer.config import load_config
    from trainer.policy import base_model_path
    from trainer.warmstart import ensure_warmstart

    inst_path, _ = task_set
    root = Path(__file__).resolve().parents[1]
    cfg = load_config(root / "configs" / "loop_real.yaml", [
        "model.name_or_path=tiny", f"model.cache_dir={tmp_path / 'models'}", f"tasks.instances={inst_path}",
        f"tasks.repos_dir={inst_path.parent.parent / 'repos'}", "tasks.split=train", "rollout.edit_format=function",
        "warmstart.source=mutations", "warmstart.mutations=3", "warmstart.epochs=1", "warmstart.batch_size=1"])
    base = base_model_path(cfg.model)
    path = Path(ensure_warmstart(cfg, base, {}, None, log=lambda m: None))
    marker = json.loads((path / "gagar_warmstart.json").read_text())
    assert marker["source"] == "mutations" and marker["pairs"] == 3 and marker["projects"] == ["acme/a"]
    assert (path / "model.safetensors").is_file() and not (path / "adapter_config.json").exists()  # merged
    meta = [json.loads(x) for x in (path / "pairs_meta.jsonl").read_text().splitlines()]
    assert {m["repo"] for m in meta} == {"acme/a"}

    def no_training(*a, **k):
        raise AssertionError("a cached warm start was trained again")

    def no_pairs(*a, **k):
        raise AssertionError("the pairs were made again")

    import trainer.mutation_data

    monkeypatch.setattr(sft.train, "train", no_training)
    monkeypatch.setattr(trainer.mutation_data, "mutation_pairs", no_pairs)
    assert Path(ensure_warmstart(cfg, base, {}, None, log=lambda m: None)) == path  # pairs and model reused
    other = cfg.model_copy(update={"rollout": cfg.rollout.model_copy(update={"edit_format": "search_replace"})})
    with pytest.raises(AssertionError, match="made again"):  # other pairs, so another warm start
        ensure_warmstart(other, base, {}, None, log=lambda m: None)
