"""`gagar train` configuration: one YAML file, a declarative schema (pydantic) with one model per section.

Everything is checked when the file is loaded — before any model is built, warm-started or sampled from: unknown
keys (a typo in `lerning_rate` must not silently train with the default), wrong types, out-of-range values
(`advantage.cap < 1`, `advantage.eps <= 0`, `rollout.n < 2`, ...) and rules across keys. Every message names the
section and key. `--set section.key=value` overrides use the same path.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import AfterValidator, BeforeValidator, Field, model_validator

from gagar.schema import ConfigError, Section, read_yaml, validate

BASE_ESTIMATORS = ("grpo", "dr_grpo", "rloo", "gapo")
REDISTRIBUTIONS = ("gagar", "downweight")
ADVANTAGE_MODES = BASE_ESTIMATORS + tuple(f"{b}+{r}" for b in BASE_ESTIMATORS for r in REDISTRIBUTIONS)
LOSS_AGGS = ("token_mean", "seq_mean_token_mean", "seq_mean_token_sum", "seq_mean_token_sum_norm")


def _loss_agg(value: Any) -> Any:
    """verl's spelling (`seq-mean-token-sum-norm`) is accepted, and the former `seq_mean` (= seq_mean_token_mean)."""
    if isinstance(value, str):
        value = value.replace("-", "_")
        return "seq_mean_token_mean" if value == "seq_mean" else value
    return value


def _comma_list(value: Any) -> Any:
    """`--set tasks.languages=python,go` gives a string: split it."""
    return [v for v in (s.strip() for s in value.split(",")) if v] if isinstance(value, str) else value


Str = Annotated[str, AfterValidator(os.path.expandvars)]  # $VARS in paths and names are expanded
StrList = Annotated[list[Str], BeforeValidator(_comma_list)]


_Section = Section  # the shared schema machinery (gagar.schema), also behind `gagar sft train`'s config
__all__ = ["ConfigError", "TrainConfig", "apply_overrides", "load_config"]


class ModelConfig(_Section):
    # A hub id, a local path, or "tiny" (a random tiny Qwen2 built on the spot by sft.tiny, cached).
    name_or_path: Str = "tiny"
    tiny_hidden_size: int = Field(64, ge=8)
    tiny_num_layers: int = Field(2, ge=1)
    # Pulled registry models (ROOT/base/NAME), tiny models and warm starts; null: the per-user cache
    # (inference.models.models_root: $GAGAR_MODELS_DIR, $GAGAR_HOME/models, $XDG_CACHE_HOME/gagar/models, ~/.cache/...)
    cache_dir: Str | None = None
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    device: Str = "auto"  # auto | cpu | cuda | cuda:N
    gradient_checkpointing: bool = False
    seed: int = 0


class LoraConfig(_Section):
    enabled: bool = True
    r: int = Field(8, ge=1)
    alpha: int = Field(16, ge=1)
    dropout: float = Field(0.0, ge=0, lt=1)
    target_modules: StrList = Field(default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"])


class TasksConfig(_Section):
    # A directory written by examples/build_tasks.py (instances.jsonl + repos/), or explicit files.
    dir: Str = ".gagar/tasks"
    instances: Str = ""  # default: <dir>/instances.jsonl
    repos_dir: Str = ""  # default: <dir>/repos
    languages: StrList = Field(default_factory=list)  # empty = all
    instance_ids: StrList = Field(default_factory=list)  # empty = all
    # One split of the `splits.json` beside the instances file (`gagar tasks synth` writes one: train, heldout):
    # only its tasks. Empty = every task.
    split: Str = ""
    shuffle: bool = True
    # Frontier tasks (DAPO-style pre-filter; trainer.frontier): before RL, this many answers per training task from
    # the starting policy estimate its pass rate p, and only tasks with 0 < p < 1 are trained on (recorded in
    # OUT/frontier.json). 0 = every task. Held-out tasks are never filtered.
    frontier_k: int = Field(0, ge=0)

    @model_validator(mode="after")
    def _frontier_k(self) -> TasksConfig:
        if self.frontier_k == 1:
            raise ValueError("frontier_k=1 cannot tell 0 < p < 1 from p in {0, 1}; use 0 (off) or at least 2")
        return self

    def instances_path(self) -> Path:
        return Path(self.instances or Path(self.dir) / "instances.jsonl")

    def repos_path(self) -> Path:
        return Path(self.repos_dir or Path(self.dir) / "repos")


class RolloutConfig(_Section):
    # transformers: the training model itself | vllm: an in-process vLLM engine on the policy's base | vllm-server:
    # a `vllm serve` the trainer starts, watches and stops | openai: a server you run (base_url)
    backend: Literal["transformers", "openai", "vllm", "vllm-server"] = "transformers"
    # single_turn (ask for a unified diff) | agent (multi-turn tools in a container)
    mode: Literal["single_turn", "agent"] = "single_turn"
    tasks_per_step: int = Field(2, ge=1)
    n: int = Field(4, ge=2)  # rollouts per task (the group size): advantages compare rollouts of one task
    max_refill: int = Field(2, ge=0)  # extra task batches drawn when dynamic sampling drops groups
    max_new_tokens: int = Field(256, ge=1)  # per turn
    max_prompt_tokens: int = Field(2048, ge=1)
    max_context_chars: int = Field(4000, ge=0)  # source shown in the single-turn prompt
    # single_turn: what the answer is (trainer.agent.edits): a unified diff, the code shown rewritten whole
    # (`function`: the function around the fix, or a window of it), or SEARCH/REPLACE blocks. Whatever the
    # format, the reward is the sandbox's verdict on the unified diff it stands for.
    edit_format: Literal["diff", "function", "search_replace"] = "diff"
    max_region_lines: int = Field(30, ge=1)  # function / search_replace: at most this many lines shown
    # RL samples: > 0. The log-probs of the importance ratio are scored under the same temperature and top-p.
    temperature: float = Field(1.0, gt=0)
    top_p: float = Field(1.0, gt=0, le=1)
    max_turns: int = Field(8, ge=1)  # agent mode
    tool_timeout_s: float = Field(30.0, gt=0)
    tool_output_chars: int = Field(2000, ge=1)
    base_url: Str = ""  # openai backend (e.g. a `vllm serve --enable-lora` endpoint)
    served_model: Str = ""  # openai backend: model name; LoRA updates are loaded under this name
    kv_cache_gib: float = Field(1.0, gt=0)  # vllm, vllm-server: the engine's KV-cache memory
    server_port: int = Field(0, ge=0, le=65535)  # vllm-server: its port on 127.0.0.1 (0: a free one)
    overlap: bool = False  # evaluate/grade step t while generating step t+1 (one-step-stale rollouts)
    # agent mode: an episode that ends on max_turns or on the context budget is dropped — out of the group's
    # baseline and the loss, like an infra_error (it never finished; its diff says little about the policy)
    drop_unfinished: bool = False


class SandboxSection(_Section):
    image: Str | None = None
    memory: Str = "2g"
    cpus: float = Field(1.0, gt=0)
    timeout: int = Field(300, ge=1)
    max_workers: int = Field(2, ge=1)  # per node with the ray executor
    runtime: Str = ""  # OCI runtime (e.g. crun); empty: the engine's default
    executor: Literal["local", "ray"] = "local"  # docs/scaling.md
    ray_address: Str = ""  # ray: the cluster (HEAD:6379, auto); empty: a local Ray for the run

    @model_validator(mode="after")
    def _ray_address_needs_ray(self) -> SandboxSection:
        if self.ray_address and self.executor != "ray":
            raise ValueError("ray_address needs sandbox.executor: ray")
        return self


class GraderSection(_Section):
    # heuristic | llm (generative, agentic) | score (the learned pairwise scorer) | combined (the scorer where it is
    # confident, the heuristic elsewhere): grader.grade.JUDGES
    judge: Literal["heuristic", "llm", "score", "combined"] = "heuristic"
    model: Str = ""
    adapter: Str = ""
    backend: Literal["transformers", "openai", "vllm", "vllm-server"] = "transformers"  # for the model judges
    # combined: use a learned verdict where |P - 0.5| >= this; None: the value `gagar sft calibrate` wrote beside
    # the adapter
    confidence: float | None = Field(None, ge=0, le=0.5)
    base_url: Str = ""
    permutations: int = Field(1, ge=1)
    # The behavioural hack probe (grader.probe.runner): perturbed re-runs of the failing tests in the sandbox, per
    # group with a passing rollout, before dynamic sampling; its verdicts join the static ones.
    probe: bool = False
    probe_budget_s: float = Field(120.0, gt=0)


class AdvantageConfig(_Section):
    # Binary pass/fail rewards (this trainer's): a GRPO-family base + GAGAR — every passing rollout of a mixed
    # group gets A > 0, so the judge's ranking has something to redistribute. GAPO's centre is 1 as soon as
    # half a group passes, which zeroes the passing advantages; use `gapo+gagar` for partial-credit rewards.
    # base[+redistribution]: base in grpo, dr_grpo, rloo, gapo; redistribution gagar or downweight (ablation)
    mode: Literal[ADVANTAGE_MODES] = "grpo+gagar"
    coverage: float = Field(0.5, gt=0, le=1)
    center: Literal["median", "mean"] = "median"
    norm: bool = True
    eps: float = Field(1e-6, gt=0)
    cap: float = Field(3.0, ge=1)  # GAGAR: the top tier's largest multiplier (form paper), λ's bound (scale)
    gagar_form: Literal["paper", "scale"] = "paper"  # docs/advantage.md
    dynamic_sampling: bool = True

    @property
    def estimator(self) -> str:
        return self.mode.split("+")[0]

    @property
    def redistribution(self) -> str:
        return self.mode.split("+")[1] if "+" in self.mode else "none"


class OptimConfig(_Section):
    # 0 is allowed: a no-learning control run (`gagar experiment loop`'s control arm) keeps everything else.
    lr: float = Field(1e-4, ge=0)
    weight_decay: float = Field(0.0, ge=0)
    clip_low: float = Field(0.2, ge=0, lt=1)
    clip_high: float = Field(0.28, ge=0)  # DAPO's clip-higher
    kl_coef: float = Field(0.0, ge=0)
    epochs: int = Field(1, ge=1)  # passes over a step's rollouts
    minibatch_size: int = Field(4, ge=1)  # sequences per forward/backward (a micro-batch)
    grad_accum: int = Field(1, ge=1)  # micro-batches per optimiser step (gradient accumulation)
    max_grad_norm: float = Field(1.0, gt=0)
    # token_mean (DAPO) | seq_mean_token_mean (GRPO) | seq_mean_token_sum | seq_mean_token_sum_norm (Dr. GRPO's
    # constant normaliser `loss_scale`); verl's hyphenated names are accepted
    loss_agg: Annotated[Literal[LOSS_AGGS], BeforeValidator(_loss_agg)] = "token_mean"
    loss_scale: int | None = Field(None, ge=1)  # Dr. GRPO's constant; default: a rollout's policy-token budget
    lr_schedule: Literal["constant", "cosine"] = "constant"  # per RL step, after a linear warm-up
    warmup_steps: int = Field(0, ge=0)
    min_lr_ratio: float = Field(0.0, ge=0, le=1)  # cosine: the last step's lr / lr
    # truncated importance sampling against the sampling engine's own log-probs (vllm, openai backends):
    # weight min(exp(log π_old − log π_sampler), tis_cap) per token; null turns it off
    tis_cap: float | None = Field(2.0, ge=1)
    # DAPO's overlong filtering: rollouts cut by the token limit (single-turn `length`, agent `context`) keep
    # their verdict in the group's baseline but leave the loss
    overlong_filter: bool = False


class WarmstartConfig(_Section):
    enabled: bool = False
    # What the warm start imitates: `tasks` — the rollout patches (or reference fixes) of a task set (below);
    # `mutations` — pairs made by the task factory's mutation engine from the training split's projects only
    # (trainer.mutation_data): a broken function's prompt → the answer that restores it, in rollout.edit_format,
    # trained with TRL + PEFT LoRA (trainer.mutation_sft), cached by data + settings + base model.
    source: Literal["tasks", "mutations"] = "tasks"
    mutations: int = Field(2000, ge=1)  # source=mutations: how many pairs
    per_function: int = Field(2, ge=1)  # source=mutations: at most this many bugs per function
    seed: int = 0  # source=mutations: seeds the pairs and the SFT (one warm start for every run seed)
    max_minutes: float | None = Field(None, gt=0)  # source=mutations: a time budget; the schedule is fitted to it
    layers: Str = ""  # source=mutations: LoRA on these decoder layers only ("A-B"); empty = all
    bf16: bool = False  # source=mutations: train in bfloat16
    # The tasks whose rollout patches to imitate: a tasks directory (instances.jsonl, repos/, predictions.jsonl,
    # expected.jsonl); empty = the training tasks themselves. Another set teaches the answer format without
    # showing the policy its RL tasks' fixes.
    tasks_dir: Str = ""
    # Rollout patches to imitate: <tasks dir>/predictions.jsonl, with their kinds from <tasks dir>/expected.jsonl.
    predictions: Str = ""
    expected: Str = ""
    kinds: StrList = Field(default_factory=lambda: ["gold", "minimal", "bloated", "wrong"])
    max_examples: int = Field(0, ge=0)  # a fixed subset of the examples (0 = all)
    epochs: int = Field(30, ge=1)
    lr: float = Field(3e-3, gt=0)
    batch_size: int = Field(8, ge=1)
    lora: bool = False  # a pretrained model: train a LoRA adapter (the `lora` section's shape), merged when saved


class TrainConfig(_Section):
    steps: int = Field(10, ge=0)
    out: Str = "runs/gagar"
    save_every: int = Field(1, ge=1)
    seed: int = 0
    tensorboard: bool = True
    model: ModelConfig = Field(default_factory=ModelConfig)
    lora: LoraConfig = Field(default_factory=LoraConfig)
    tasks: TasksConfig = Field(default_factory=TasksConfig)
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    sandbox: SandboxSection = Field(default_factory=SandboxSection)
    grader: GraderSection = Field(default_factory=GraderSection)
    advantage: AdvantageConfig = Field(default_factory=AdvantageConfig)
    optim: OptimConfig = Field(default_factory=OptimConfig)
    warmstart: WarmstartConfig = Field(default_factory=WarmstartConfig)

    @model_validator(mode="after")
    def _across_sections(self) -> TrainConfig:
        """Rules that involve more than one key (each message names the keys)."""
        r, g = self.rollout, self.grader
        checks = [
            (r.backend != "openai" or bool(r.base_url), "rollout.backend=openai needs rollout.base_url"),
            (g.judge != "llm" or bool(g.model or g.base_url),
             "grader.judge=llm needs grader.model (path or hub id) or grader.base_url"),
            (g.judge not in ("score", "combined") or (bool(g.model) and g.backend != "openai"),
             f"grader.judge={g.judge} needs grader.model and grader.backend transformers or vllm (it reads prompt "
             "log-probabilities in-process)"),
            (g.judge != "combined" or g.confidence is not None or bool(g.adapter),
             "grader.judge=combined needs grader.confidence or grader.adapter (with its score_calibration.json)"),
            (not (self.warmstart.enabled and r.mode == "agent"),
             "warmstart imitates single-turn diff answers; set rollout.mode: single_turn or warmstart.enabled: false"),
            (r.backend == "transformers" or self.lora.enabled,
             f"rollout.backend={r.backend} receives LoRA adapters only; set lora.enabled: true"),
            (r.edit_format == "diff" or r.mode == "single_turn",
             f"rollout.edit_format={r.edit_format} is a single-turn answer; set rollout.mode: single_turn"),
            (not r.drop_unfinished or r.mode == "agent",
             "rollout.drop_unfinished applies to agent episodes; set rollout.mode: agent or drop_unfinished: false"),
            (self.optim.lr_schedule != "cosine" or self.optim.warmup_steps < max(self.steps, 1),
             f"optim.warmup_steps={self.optim.warmup_steps} leaves no step for the cosine decay (steps={self.steps})"),
        ]
        for ok, msg in checks:
            if not ok:
                raise ValueError(msg)
        return self

    def policy_token_budget(self) -> int:
        """The most policy tokens one rollout can have: Dr. GRPO's constant normaliser by default."""
        r = self.rollout
        return r.max_new_tokens * (r.max_turns if r.mode == "agent" else 1)

    def to_dict(self) -> dict[str, Any]:
        return self.model_dump()


RETIRED = {"sandbox.docker_hosts": "spread the sandbox over several machines with `sandbox.executor: ray` "
           "(one sandbox actor per Ray node; docs/scaling.md)"}


def _build(data: dict[str, Any]) -> TrainConfig:
    for key, why in RETIRED.items():
        section, name = key.split(".")
        if isinstance(data.get(section), dict) and name in data[section]:
            raise ConfigError(f"{key} was retired: {why}")
    return validate(TrainConfig, data)


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """`section.key=value` (value parsed as YAML, so `true`, `3`, `[a, b]` work)."""
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"--set {item!r}: expected section.key=value")
        path, raw = item.split("=", 1)
        node = data
        keys = path.strip().split(".")
        for k in keys[:-1]:
            node = node.setdefault(k, {})
            if not isinstance(node, dict):
                raise ConfigError(f"--set {item!r}: {k} is not a section")
        node[keys[-1]] = yaml.safe_load(raw)
    return data


def load_config(path: str | os.PathLike[str], overrides: list[str] | None = None) -> TrainConfig:
    p = Path(path)
    data = apply_overrides(read_yaml(p), overrides or [])
    try:
        return _build(data)
    except ConfigError as exc:
        raise ConfigError(f"{p}: {exc}") from exc
