"""`gagar train` configuration: one YAML file, one dataclass per section.

Unknown keys are errors (a typo in `lerning_rate` must not silently train with the default), and every error
names the section and key so the user can fix the file. `--set section.key=value` overrides use the same path.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

ADVANTAGE_MODES = ("grpo", "gapo", "gapo+gagar", "grpo+gagar", "gapo+downweight", "grpo+downweight")


class ConfigError(ValueError):
    """A configuration problem the user can fix; the message says where and how."""


@dataclass
class ModelConfig:
    # A hub id, a local path, or "tiny" (a random tiny Qwen2 built on the spot by sft.tiny, cached).
    name_or_path: str = "tiny"
    tiny_hidden_size: int = 64
    tiny_num_layers: int = 2
    cache_dir: str = ".gagar/models"
    dtype: str = "float32"  # float32 | bfloat16 | float16
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    gradient_checkpointing: bool = False
    seed: int = 0


@dataclass
class LoraConfig:
    enabled: bool = True
    r: int = 8
    alpha: int = 16
    dropout: float = 0.0
    target_modules: list[str] = field(default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"])


@dataclass
class TasksConfig:
    # A directory written by examples/build_tasks.py (instances.jsonl + repos/), or explicit files.
    dir: str = ".gagar/tasks"
    instances: str = ""  # default: <dir>/instances.jsonl
    repos_dir: str = ""  # default: <dir>/repos
    languages: list[str] = field(default_factory=list)  # empty = all
    instance_ids: list[str] = field(default_factory=list)  # empty = all
    shuffle: bool = True

    def instances_path(self) -> Path:
        return Path(self.instances or Path(self.dir) / "instances.jsonl")

    def repos_path(self) -> Path:
        return Path(self.repos_dir or Path(self.dir) / "repos")


@dataclass
class RolloutConfig:
    backend: str = "transformers"  # transformers | openai | vllm
    mode: str = "single_turn"  # single_turn (ask for a unified diff) | agent (multi-turn tools in a container)
    tasks_per_step: int = 2
    n: int = 4  # rollouts per task (the group size)
    max_refill: int = 2  # extra task batches drawn when dynamic sampling drops groups
    max_new_tokens: int = 256  # per turn
    max_prompt_tokens: int = 2048
    max_context_chars: int = 4000  # source shown in the single-turn prompt
    temperature: float = 1.0
    top_p: float = 1.0
    max_turns: int = 8  # agent mode
    tool_timeout_s: float = 30.0
    tool_output_chars: int = 2000
    base_url: str = ""  # openai backend (e.g. a `vllm serve --enable-lora` endpoint)
    served_model: str = ""  # openai backend: model name; LoRA updates are loaded under this name
    overlap: bool = False  # evaluate/grade step t while generating step t+1 (one-step-stale rollouts)


@dataclass
class SandboxSection:
    image: str | None = None
    memory: str = "2g"
    cpus: float = 1.0
    timeout: int = 300
    max_workers: int = 2  # per node with the ray executor
    runtime: str = ""  # OCI runtime (e.g. crun); empty: the engine's default
    executor: str = "local"  # local | ray (docs/scaling.md)
    ray_address: str = ""  # ray: the cluster (HEAD:6379, auto); empty: a local Ray for the run


@dataclass
class GraderSection:
    judge: str = "heuristic"  # heuristic | llm
    model: str = ""
    adapter: str = ""
    backend: str = "transformers"  # for the llm judge: transformers | openai | vllm
    base_url: str = ""
    permutations: int = 1


@dataclass
class AdvantageConfig:
    mode: str = "gapo+gagar"  # one of ADVANTAGE_MODES
    coverage: float = 0.5
    center: str = "median"
    norm: bool = True
    eps: float = 1e-6
    cap: float = 3.0
    dynamic_sampling: bool = True

    @property
    def estimator(self) -> str:
        return self.mode.split("+")[0]

    @property
    def redistribution(self) -> str:
        return self.mode.split("+")[1] if "+" in self.mode else "none"


@dataclass
class OptimConfig:
    lr: float = 1e-4
    weight_decay: float = 0.0
    clip_low: float = 0.2
    clip_high: float = 0.28  # DAPO's clip-higher
    kl_coef: float = 0.0
    epochs: int = 1  # passes over a step's rollouts
    minibatch_size: int = 4  # sequences per optimiser step
    max_grad_norm: float = 1.0
    loss_agg: str = "token_mean"  # token_mean (DAPO) | seq_mean


@dataclass
class WarmstartConfig:
    enabled: bool = False
    # Rollout patches to imitate: <tasks.dir>/predictions.jsonl, with their kinds from <tasks.dir>/expected.jsonl.
    predictions: str = ""
    expected: str = ""
    kinds: list[str] = field(default_factory=lambda: ["gold", "minimal", "bloated", "wrong"])
    epochs: int = 30
    lr: float = 3e-3
    batch_size: int = 8


@dataclass
class TrainConfig:
    steps: int = 10
    out: str = "runs/gagar"
    save_every: int = 1
    seed: int = 0
    tensorboard: bool = True
    model: ModelConfig = field(default_factory=ModelConfig)
    lora: LoraConfig = field(default_factory=LoraConfig)
    tasks: TasksConfig = field(default_factory=TasksConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    sandbox: SandboxSection = field(default_factory=SandboxSection)
    grader: GraderSection = field(default_factory=GraderSection)
    advantage: AdvantageConfig = field(default_factory=AdvantageConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    warmstart: WarmstartConfig = field(default_factory=WarmstartConfig)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _coerce(value: Any, typ: Any, where: str) -> Any:
    """Check/convert one YAML value against a dataclass field type (the simple types this config uses)."""
    t = typ if isinstance(typ, str) else getattr(typ, "__name__", str(typ))
    t = t.replace(" ", "")
    if t.endswith("|None") or t.startswith("None|"):
        if value is None:
            return None
        t = t.replace("|None", "").replace("None|", "")
    if t == "bool":
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in {"true", "false", "1", "0", "yes", "no"}:
            return value.lower() in {"true", "1", "yes"}
        raise ConfigError(f"{where}: expected true/false, got {value!r}")
    if t == "int":
        if isinstance(value, bool):
            raise ConfigError(f"{where}: expected an integer, got {value!r}")
        try:
            return int(value)
        except (TypeError, ValueError):
            raise ConfigError(f"{where}: expected an integer, got {value!r}") from None
    if t == "float":
        try:
            return float(value)
        except (TypeError, ValueError):
            raise ConfigError(f"{where}: expected a number, got {value!r}") from None
    if t == "str":
        if isinstance(value, (dict, list)):
            raise ConfigError(f"{where}: expected a string, got {type(value).__name__}")
        return os.path.expandvars(str(value))
    if t.startswith("list["):
        if isinstance(value, str):
            value = [v for v in (s.strip() for s in value.split(",")) if v]
        if not isinstance(value, list):
            raise ConfigError(f"{where}: expected a list, got {value!r}")
        return [os.path.expandvars(str(v)) for v in value]
    return value


RETIRED = {"sandbox.docker_hosts": "spread the sandbox over several machines with `sandbox.executor: ray` "
           "(one sandbox actor per Ray node; docs/scaling.md)"}


def _build(cls: type, data: dict[str, Any], where: str) -> Any:
    if not isinstance(data, dict):
        raise ConfigError(f"{where or 'config'}: expected a mapping, got {type(data).__name__}")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - set(fields))
    for key in unknown:
        if f"{where}.{key}" in RETIRED:
            raise ConfigError(f"{where}.{key} was retired: {RETIRED[f'{where}.{key}']}")
    if unknown:
        raise ConfigError(
            f"{where or 'config'}: unknown key(s) {', '.join(unknown)}; allowed: {', '.join(sorted(fields))}"
        )
    kwargs = {}
    for name, value in data.items():
        f = fields[name]
        sub = f"{where}.{name}" if where else name
        if dataclasses.is_dataclass(f.default_factory if f.default_factory is not dataclasses.MISSING else None):
            kwargs[name] = _build(f.default_factory, value or {}, sub)  # type: ignore[arg-type]
        else:
            kwargs[name] = _coerce(value, f.type, sub)
    return cls(**kwargs)


def validate(cfg: TrainConfig) -> TrainConfig:
    r, a, o = cfg.rollout, cfg.advantage, cfg.optim
    checks = [
        (cfg.steps >= 0, "steps must be >= 0"),
        (r.backend in {"transformers", "openai", "vllm"}, "rollout.backend must be transformers, openai or vllm"),
        (r.mode in {"single_turn", "agent"}, "rollout.mode must be single_turn or agent"),
        (r.n >= 2, "rollout.n (group size) must be >= 2: advantages compare rollouts of one task"),
        (r.tasks_per_step >= 1, "rollout.tasks_per_step must be >= 1"),
        (r.backend != "openai" or bool(r.base_url), "rollout.backend=openai needs rollout.base_url"),
        (cfg.sandbox.executor in {"local", "ray"}, "sandbox.executor must be local or ray"),
        (cfg.sandbox.executor == "ray" or not cfg.sandbox.ray_address, "sandbox.ray_address needs sandbox.executor: ray"),
        (a.mode in ADVANTAGE_MODES, f"advantage.mode must be one of {', '.join(ADVANTAGE_MODES)}"),
        (0 < a.coverage <= 1, "advantage.coverage must be in (0, 1]"),
        (cfg.grader.judge in {"heuristic", "llm"}, "grader.judge must be heuristic or llm"),
        (cfg.grader.judge != "llm" or bool(cfg.grader.model or cfg.grader.base_url),
         "grader.judge=llm needs grader.model (path or hub id) or grader.base_url"),
        (o.clip_low >= 0 and o.clip_high >= 0, "optim.clip_low/clip_high must be >= 0"),
        (o.loss_agg in {"token_mean", "seq_mean"}, "optim.loss_agg must be token_mean or seq_mean"),
        (o.minibatch_size >= 1 and o.epochs >= 1, "optim.minibatch_size and optim.epochs must be >= 1"),
        (cfg.model.dtype in {"float32", "bfloat16", "float16"}, "model.dtype must be float32, bfloat16 or float16"),
        (not (cfg.warmstart.enabled and r.mode == "agent"),
         "warmstart imitates single-turn diff answers; set rollout.mode: single_turn or warmstart.enabled: false"),
        (r.backend == "transformers" or cfg.lora.enabled,
         f"rollout.backend={r.backend} receives LoRA adapters only; set lora.enabled: true"),
    ]
    for ok, msg in checks:
        if not ok:
            raise ConfigError(msg)
    return cfg


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
    try:
        data = yaml.safe_load(p.read_text()) or {}
    except OSError as exc:
        raise ConfigError(f"cannot read config {p}: {exc.strerror or exc}") from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"config {p} is not valid YAML: {exc}") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"config {p}: the top level must be a mapping of sections")
    data = apply_overrides(data, overrides or [])
    try:
        return validate(_build(TrainConfig, data, ""))
    except ConfigError as exc:
        raise ConfigError(f"{p}: {exc}") from exc
