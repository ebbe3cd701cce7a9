"""Episodes: many at once, one batched generation call per turn across all live episodes."""

from __future__ import annotations

import contextlib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sandbox.config import SandboxConfig
from sandbox.container import Container
from sandbox.env.images import select_image
from sandbox.integrity import gitsafe
from sandbox.records import Instance
from sandbox.workspace import GroupWorkspace, hand_over
from trainer.agent.edits import to_patch
from trainer.agent.format import TOOL_CALL_CLOSE, FormatError, parse_tool_call
from trainer.agent.prompts import SingleTurnPrompt, agent_messages, read_blob, single_turn_prompt
from trainer.agent.tokens import Conversation
from trainer.agent.tools import AgentTools


@dataclass
class Trajectory:
    instance_id: str
    rollout_id: str
    token_ids: list[int]
    mask: list[int]  # 1 where the policy produced the token: the only tokens trained on
    prompt_len: int
    patch: str
    turns: int = 1
    finish: str = "stop"  # stop | length | submitted | max_turns | context | infra_error
    events: list[str] = field(default_factory=list)  # short trajectory log the grader may cite
    old_logprobs: list[float] | None = None  # filled by the trainer (behaviour policy, policy tokens only)
    # the sampling engine's own log-probs of the same tokens (vLLM, an OpenAI-compatible server), same alignment;
    # None when the engine is the trainer's model (transformers backend). For truncated importance sampling.
    sampler_logprobs: list[float] | None = None
    # Set when the rollout's own sandbox failed (its agent container died, ...): the trainer then masks the
    # rollout as `infra_error` — out of the advantages and the loss — instead of evaluating or scoring it.
    infra_error: str | None = None
    # Set by the trainer when `rollout.drop_unfinished` drops the episode (it ended on max_turns or context):
    # masked like an infra_error — out of the group's baseline and the loss — but still evaluated and logged.
    dropped: bool = False
    # Single-turn: why the answer is not a patch in the edit format asked for (then `patch` is '': reward 0).
    format_error: str | None = None

    @property
    def policy_tokens(self) -> int:
        return sum(self.mask)


def run_single_turn(
    jobs: list[tuple[Instance, str]],
    backend: Any,
    tokenizer: Any,
    *,
    repos_dir: Path,
    max_context_chars: int,
    max_new_tokens: int,
    temperature: float,
    top_p: float = 1.0,
    max_prompt_tokens: int = 4096,
    edit_format: str = "diff",
    max_region_lines: int = 30,
) -> list[Trajectory]:
    """One completion per job, asked for an edit in `edit_format`; the patch is the unified diff the answer
    stands for (`trainer.agent.edits.to_patch`), '' with the reason in `format_error` when it does not parse."""
    convs, prompts = [], {}
    for inst, _ in jobs:
        if inst.instance_id not in prompts:
            prompts[inst.instance_id] = single_turn_prompt(inst, repos_dir, max_context_chars, edit_format,
                                                           max_region_lines)
        conv = Conversation(tokenizer, prompts[inst.instance_id].messages)
        if len(conv) > max_prompt_tokens:
            raise ValueError(f"{inst.instance_id}: the prompt has {len(conv)} tokens > rollout.max_prompt_tokens="
                             f"{max_prompt_tokens}; lower rollout.max_context_chars")
        convs.append(conv)
    samples = backend.generate([c.ids for c in convs], max_new_tokens=max_new_tokens, temperature=temperature,
                               top_p=top_p)
    out = []
    for (inst, rid), conv, s in zip(jobs, convs, samples, strict=True):
        conv.add_policy(s.token_ids, s.text, s.logprobs)
        patch = answer_patch(edit_format, s.text, prompts[inst.instance_id], inst, repos_dir)
        error = patch.message if isinstance(patch, FormatError) else None
        out.append(Trajectory(inst.instance_id, rid, conv.ids, conv.mask, conv.prompt_len, "" if error else patch,
                              finish=s.finish_reason, sampler_logprobs=conv.sampler_logprobs(), format_error=error,
                              events=[f"format error: {error}"] if error else []))
    return out


def answer_patch(edit_format: str, text: str, prompt: SingleTurnPrompt, inst: Instance,
                 repos_dir: Path) -> str | FormatError:
    """The patch an answer to `prompt` stands for (files other than the one shown are read at the task's
    base commit, from its own clone)."""
    repo = Path(repos_dir) / inst.repo_dirname
    return to_patch(edit_format, text, prompt.region, lambda path: read_blob(repo, inst.base_commit, path))


def run_agent_episodes(
    jobs: list[tuple[Instance, str]],
    backend: Any,
    tokenizer: Any,
    *,
    repos_dir: Path,
    sandbox: SandboxConfig,
    max_turns: int = 8,
    max_new_tokens: int = 512,
    temperature: float = 1.0,
    top_p: float = 1.0,
    tool_timeout: float = 30.0,
    tool_output_chars: int = 2000,
    max_total_tokens: int = 8192,
) -> list[Trajectory]:
    """Multi-turn episodes, each in its own container on its own copy of the repo at `base_commit` (that
    commit only: no later history); the patch is the diff of that copy against the workspace's pristine git
    dir (`AgentTools.diff`) when the agent submits or runs out of turns or context."""
    with contextlib.ExitStack() as stack:
        workspaces: dict[str, GroupWorkspace] = {}
        states = []
        for inst, rid in jobs:
            if inst.instance_id not in workspaces:
                workspaces[inst.instance_id] = stack.enter_context(
                    GroupWorkspace(Path(repos_dir), inst.repo, inst.base_commit))
            ws = workspaces[inst.instance_id]
            tree = ws.copy()
            stack.enter_context(gitsafe.untrusted(tree))  # the agent gets a shell in it: no host git there
            hand_over(tree)
            image = select_image(inst.image, inst.language, inst.test_framework, sandbox.image)
            box = stack.enter_context(Container(image, tree, sandbox))
            tools = AgentTools(tree, box, test_cmd=inst.test_cmd or "python -m pytest -q", timeout=tool_timeout,
                               output_chars=tool_output_chars, pristine_git_dir=ws.git_dir,
                               base_commit=inst.base_commit)
            states.append({"inst": inst, "rid": rid, "conv": Conversation(tokenizer, agent_messages(inst)),
                           "tools": tools, "turns": 0, "finish": None, "events": []})
        with ThreadPoolExecutor(max_workers=max(1, min(8, len(states)))) as pool:
            for _turn in range(max_turns):
                live = [s for s in states if s["finish"] is None]
                if not live:
                    break
                samples = backend.generate([s["conv"].ids for s in live], max_new_tokens=max_new_tokens,
                                           temperature=temperature, top_p=top_p, stop=[TOOL_CALL_CLOSE])
                for s, sample in zip(live, samples, strict=True):
                    s["conv"].add_policy(sample.token_ids, sample.text, sample.logprobs)
                    s["turns"] += 1
                    s["call"] = parse_tool_call(sample.text)
                    if sample.finish_reason == "length" and isinstance(s["call"], FormatError):
                        s["call"] = FormatError(f"your message hit the {max_new_tokens}-token limit; be brief")
                results = list(pool.map(_act, live))
                for s, (name, text) in zip(live, results, strict=True):
                    s["events"].append(f"turn {s['turns']}: {name}: {text.splitlines()[0][:120] if text else ''}")
                    if s["tools"].infra_error:
                        s["finish"] = "infra_error"
                        continue
                    if s["tools"].submitted:
                        s["finish"] = "submitted"
                        continue
                    s["conv"].add_env({"role": "tool", "name": name, "content": text})
                    if len(s["conv"]) >= max_total_tokens:
                        s["finish"] = "context"
            out = []
            for s in states:
                patch = s["tools"].diff()
                if s["tools"].diff_error:
                    s["events"].append(f"no answer: {s['tools'].diff_error}")
                conv = s["conv"]
                out.append(Trajectory(s["inst"].instance_id, s["rid"], conv.ids, conv.mask, conv.prompt_len, patch,
                                      turns=s["turns"], finish=s["finish"] or "max_turns", events=s["events"],
                                      infra_error=s["tools"].infra_error,
                                      sampler_logprobs=conv.sampler_logprobs()))
            return out


def _act(state: dict) -> tuple[str, str]:
    call = state["call"]
    if isinstance(call, FormatError):
        return "error", f"error: {call.message}"
    try:
        return call.name, state["tools"].call(call.name, call.arguments)
    except Exception as exc:  # one episode's fault must not end the batch's other episodes
        state["tools"].infra_error = f"the {call.name} tool failed: {type(exc).__name__}: {exc}"
        return call.name, "error: the sandbox failed; this episode ends here"
