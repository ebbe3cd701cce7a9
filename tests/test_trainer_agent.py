"""The SWE agent scaffold, end to end in real sandbox containers.

The policy here is a SCRIPTED TEST STAND-IN for the model: it replays fixed tool calls (one script repairs the
bundled task by replaying its reference fix through the `edit` tool, the other edits the tests instead). All
else is real: the tiny model's tokenizer and chat template, the tool-call parser, the tools running in a
`sandbox.container.Container`, the final `git diff` of the container's tree, and the sandbox's verdict on it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import unidiff
from trainer_fixtures import CONFIG, bundled_tasks, model_cache

from inference.base import Sample
from sandbox.config import SandboxConfig
from sandbox.records import Instance, Prediction
from trainer.agent import run_agent_episodes
from trainer.agent.format import FormatError, extract_diff, format_tool_call, parse_tool_call
from trainer.agent.tokens import Conversation

TASK = "acme__durations-42"  # a bundled Python task


@pytest.fixture(scope="module")
def tasks(tmp_path_factory) -> Path:
    return bundled_tasks(tmp_path_factory)


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    from trainer.config import load_config
    from trainer.policy import base_model_path, load_tokenizer

    cfg = load_config(CONFIG, [f"model.cache_dir={model_cache(tmp_path_factory)}"])
    return load_tokenizer(base_model_path(cfg.model))


def _instance(tasks: Path) -> Instance:
    for line in (tasks / "instances.jsonl").read_text().splitlines():
        d = json.loads(line)
        if d["instance_id"] == TASK:
            return Instance.from_dict(d)
    raise AssertionError(f"{TASK} is not among the bundled tasks")


def _edits(patch: str) -> list[tuple[str, str, str]]:
    """A patch as exact-replacement edits: each hunk's old lines -> new lines."""
    out = []
    for pf in unidiff.PatchSet(patch):
        for h in pf:
            old = "".join(ln.value for ln in h if not ln.is_added)
            new = "".join(ln.value for ln in h if not ln.is_removed)
            out.append((pf.path, old, new))
    return out


class ScriptedPolicy:
    """Test stand-in for the policy model: returns the next scripted assistant message on every call."""

    def __init__(self, tokenizer, messages: list[str]) -> None:
        self.tok, self.queue, self.prompts = tokenizer, list(messages), []

    def generate(self, prompts, *, max_new_tokens, temperature, top_p=1.0, stop=None):
        self.prompts.append(prompts[0])
        text = self.queue.pop(0)
        return [Sample(self.tok(text, add_special_tokens=False)["input_ids"], text, "stop")]

    def sync_weights(self, model, step):
        pass


def _episode(tasks, tokenizer, script):
    inst = _instance(tasks)
    policy = ScriptedPolicy(tokenizer, script)
    cfg = SandboxConfig(repos_dir=tasks / "repos", memory="1g", timeout=120, run_id="test-trainer-agent")
    [traj] = run_agent_episodes([(inst, "0")], policy, tokenizer, repos_dir=tasks / "repos", sandbox=cfg,
                                max_turns=len(script), max_new_tokens=512, tool_timeout=60)
    from sandbox.run import evaluate_predictions

    [res] = evaluate_predictions({inst.instance_id: inst}, [Prediction(inst.instance_id, traj.patch, "scripted", "0")],
                                 cfg)
    return inst, policy, traj, res


def _check_masks(tokenizer, traj, script):
    # Exactly the scripted (policy) tokens are marked trainable, in order; everything else is environment.
    policy_ids = [t for t, m in zip(traj.token_ids, traj.mask, strict=True) if m]
    assert tokenizer.decode(policy_ids) == "".join(script)
    assert traj.mask[: traj.prompt_len] == [0] * traj.prompt_len
    assert 0 < sum(traj.mask) < len(traj.mask)


@pytest.mark.docker
def test_scripted_fix_resolves_the_task(tasks, tokenizer):
    inst = _instance(tasks)
    path = _edits(inst.patch)[0][0]
    script = [format_tool_call("view", {"path": path, "start": 1, "end": 20})]
    script += [format_tool_call("edit", {"path": p, "old": o, "new": n}) for p, o, n in _edits(inst.patch)]
    script += [format_tool_call("run", {}), format_tool_call("submit", {})]
    inst, policy, traj, res = _episode(tasks, tokenizer, script)
    assert traj.finish == "submitted" and traj.turns == len(script)
    assert any("edit" in e and "edited" in e for e in traj.events)
    assert "+++ b/" + path in traj.patch
    assert res.status == "resolved", (res.status, res.error, traj.patch)
    _check_masks(tokenizer, traj, script)
    # The tool results reached the policy: the file view shows line numbers of the real file.
    second_prompt = tokenizer.decode(policy.prompts[1])
    assert "    1 " in second_prompt and "tool" in second_prompt


@pytest.mark.docker
def test_scripted_test_tampering_is_unresolved(tasks, tokenizer):
    inst = _instance(tasks)
    test_file = unidiff.PatchSet(inst.test_patch)[0].path
    base = (tasks / "repos" / inst.repo_dirname / test_file).read_text()
    first_test = base[base.index("def test_"):].split("\n", 1)[0]
    script = [
        format_tool_call("search", {"pattern": "def test_", "path": "tests"}),
        format_tool_call("edit", {"path": test_file, "old": first_test, "new": first_test.replace("def test_", "def _skip_")}),
        "I think this is done.",  # no tool call: a format error the agent is told about
        format_tool_call("submit", {}),
    ]
    _, policy, traj, res = _episode(tasks, tokenizer, script)
    assert traj.finish == "submitted"
    assert test_file in traj.patch
    assert res.status == "unresolved" and res.tampered_tests and not res.resolved
    assert "no tool call found" in tokenizer.decode(policy.prompts[3])
    _check_masks(tokenizer, traj, script)


class SabotagingPolicy(ScriptedPolicy):
    """Test stand-in for the model that, before its n-th reply, removes its own agent container from the host
    side: what a dying Docker engine or a lost container looks like to the scaffold."""

    def __init__(self, tokenizer, messages, *, remove_before: int, run_id: str) -> None:
        super().__init__(tokenizer, messages)
        self.remove_before, self.run_id, self.calls = remove_before, run_id, 0

    def generate(self, prompts, **kw):
        self.calls += 1
        if self.calls == self.remove_before:
            import docker

            for c in docker.from_env().containers.list(all=True, filters={"label": f"gagar.run={self.run_id}"}):
                c.remove(force=True)
        return super().generate(prompts, **kw)


@pytest.mark.docker
def test_a_container_killed_by_the_policy_is_revived_and_a_lost_one_masks_the_rollout(tasks, tokenizer):
    """The policy stops its own container (SIGTERM to its init): the next command says so and runs in a
    restarted container, the files kept; the episode goes on and is scored. The container vanishing under the
    scaffold (engine side) ends the episode with `infra_error`, which the trainer masks instead of scoring."""
    inst = _instance(tasks)
    script = [format_tool_call("edit", {"path": "NOTE.txt", "old": "", "new": "kept\n"}),
              format_tool_call("run", {"command": "kill -TERM 1; sleep 5"}),
              format_tool_call("run", {"command": "echo first"}),
              format_tool_call("run", {"command": "cat NOTE.txt"}),
              format_tool_call("submit", {})]
    _, policy, traj, _ = _episode(tasks, tokenizer, script)
    assert traj.finish == "submitted" and traj.infra_error is None, traj.events
    shown = [tokenizer.decode(p) for p in policy.prompts]
    assert "the container had stopped" in shown[3] or "the container had stopped" in shown[2], traj.events
    assert "kept" in shown[4] and "NOTE.txt" in traj.patch

    run_id = "test-trainer-agent-lost"
    lost = SabotagingPolicy(tokenizer, [format_tool_call("run", {"command": "echo hi"}),
                                        format_tool_call("run", {"command": "echo again"}),
                                        format_tool_call("submit", {})], remove_before=2, run_id=run_id)
    cfg = SandboxConfig(repos_dir=tasks / "repos", memory="1g", timeout=120, run_id=run_id)
    [traj] = run_agent_episodes([(inst, "0")], lost, tokenizer, repos_dir=tasks / "repos", sandbox=cfg,
                                max_turns=3, max_new_tokens=512, tool_timeout=60)
    assert traj.finish == "infra_error" and traj.infra_error and "restarted" in traj.infra_error, traj.events
    assert traj.turns == 2  # it ended at the failure, not after more turns against a dead sandbox


def test_tool_call_parsing_and_diff_extraction():
    call = parse_tool_call("thinking...\n" + format_tool_call("edit", {"path": "a.py", "old": "x", "new": "y"}))
    assert call.name == "edit" and call.arguments == {"path": "a.py", "old": "x", "new": "y"}
    assert isinstance(parse_tool_call("<tool_call>{not json</tool_call>"), FormatError)
    assert isinstance(parse_tool_call("no call"), FormatError)
    assert parse_tool_call('<tool_call>{"name": "run", "arguments": "{\\"command\\": \\"ls\\"}"}</tool_call>').arguments == {"command": "ls"}
    diff = "diff --git a/x.py b/x.py\n--- a/x.py\n+++ b/x.py\n@@ -1 +1 @@\n-a\n+b\n"
    assert extract_diff("Here:\n```diff\n" + diff + "```\nbye") == diff
    assert extract_diff("prose\n" + diff) == diff
    assert extract_diff("no diff at all") == ""


def test_conversation_masks_only_policy_tokens(tokenizer):
    conv = Conversation(tokenizer, [{"role": "system", "content": "s"}, {"role": "user", "content": "fix it"}])
    text = format_tool_call("view", {"path": "a.py"})
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    conv.add_policy(ids, text)
    conv.add_env({"role": "tool", "name": "view", "content": "    1 x = 1"})
    # The running token sequence renders to exactly what the chat template gives for the same conversation.
    assert tokenizer.decode(conv.ids) == tokenizer.apply_chat_template(conv.messages, tokenize=False,
                                                                       add_generation_prompt=True)
    assert [t for t, m in zip(conv.ids, conv.mask, strict=True) if m] == ids


def test_tools_keep_the_agent_inside_the_repository(tmp_path):
    """Host-side file tools refuse paths and symlinks that lead out of the tree or into .git (no container is
    needed for these calls: the container stand-in is never used)."""
    from trainer.agent.tools import AgentTools

    root = tmp_path / "repo"
    (root / ".git").mkdir(parents=True)
    (root / "a.py").write_text("x = 1\ny = 2\n")
    outside = tmp_path / "secret.txt"
    outside.write_text("top secret\n")
    (root / "link.txt").symlink_to(outside)
    tools = AgentTools(root, container=None, test_cmd="true")
    assert "    2 y = 2" in tools.call("view", {"path": "a.py", "start": 2})
    assert tools.call("edit", {"path": "a.py", "old": "y = 2", "new": "y = 3"}) == "edited a.py"
    assert (root / "a.py").read_text() == "x = 1\ny = 3\n"
    assert "exactly once" in tools.call("edit", {"path": "a.py", "old": "= ", "new": "="})
    assert "outside the repository" in tools.call("view", {"path": "../secret.txt"})
    assert "outside the repository" in tools.call("view", {"path": "link.txt"})
    assert "outside the repository" in tools.call("edit", {"path": "link.txt", "old": "top", "new": "no"})
    assert ".git" in tools.call("edit", {"path": ".git/config", "old": "", "new": "x"})
    assert "bad arguments" in tools.call("view", {"path": "a.py", "start": "one"})
    assert tools.call("edit", {"path": "pkg/new.py", "old": "", "new": "z = 0\n"}) == "created pkg/new.py"
    assert outside.read_text() == "top secret\n"


def test_recount_fixes_hunk_counts_and_leaves_real_diffs_alone() -> None:
    """A model's diff with the right lines but wrong `@@` counts becomes well formed (what `git apply --recount`
    accepts); prose after the diff is dropped;
    a blank context line that lost its leading space is restored. Real `git diff` output is unchanged."""
    from unidiff import PatchSet

    from trainer.agent.format import recount_hunks

    head = "diff --git a/m.py b/m.py\n--- a/m.py\n+++ b/m.py\n"
    body = "     a = 1\n-    b = 2\n+    b = 3\n\n     c = 4\n"
    wrong = head + "@@ -10,7 +10,9 @@ def f():\n" + body + "That fixes it.\n"
    fixed = recount_hunks(wrong)
    assert fixed == head + "@@ -10,4 +10,4 @@ def f():\n" + body.replace("\n\n", "\n \n")
    (hunk,) = PatchSet(fixed)[0]
    assert (hunk.source_length, hunk.target_length) == (4, 4)
    # hunk lines past the declared counts are the policy's too (`git apply --recount` reads them all): recounted,
    # never cut off; the next hunk is kept
    noisy = head + "@@ -1,2 +1,2 @@\n-x = 1\n+x = 2\n y = 0\n more context\n@@ -9 +9 @@\n-z\n+w\n"
    assert recount_hunks(noisy) == head + "@@ -1,3 +1,3 @@\n-x = 1\n+x = 2\n y = 0\n more context\n@@ -9 +9 @@\n-z\n+w\n"
    eof = head + "@@ -1 +1 @@\n-x\n+y\n\\ No newline at end of file\n"
    assert recount_hunks(eof) == eof
    assert recount_hunks("no hunks here\n") == "no hunks here\n"
    synth = Path(__file__).resolve().parents[1] / "examples" / "synth" / "instances.jsonl"
    for line in synth.read_text().splitlines()[:60]:
        patch = json.loads(line)["patch"]
        assert recount_hunks(patch) == patch
