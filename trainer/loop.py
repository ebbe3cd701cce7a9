"""The RL loop, in plain sight. One step:

    tasks ─► n rollouts each (policy, single-turn diff or multi-turn agent in a container)
          ─► sandbox: every patch evaluated SWE-bench style (parallel; one repo copy per group)
          ─► dynamic sampling: keep mixed-outcome groups, refill from the next tasks (up to rollout.max_refill)
          ─► grader ranks each kept group's passing patches (heuristic or LLM judge) → quality weights
          ─► advantages: baseline estimator (GRPO / GAPO) then GAGAR redistribution (or the downweight ablation)
          ─► clipped token-level policy-gradient update (asymmetric clip, optional KL to the reference)

With `rollout.overlap`, the sandbox and the judge work on step t's rollouts in a background thread while the
policy generates step t+1's rollouts; those are then one update stale, which the clipped importance ratio
against the behaviour log-probs (recorded at generation) accounts for.
"""

from __future__ import annotations

import json
import math
import random
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from sandbox.records import EvalResult, Instance, Prediction
from trainer.advantage import apply_hack_verdicts, compute_advantages, downweight, mixed_outcome, redistribute
from trainer.agent import Trajectory, run_agent_episodes, run_single_turn
from trainer.checkpoint import latest_checkpoint, load_state, restore_optimizer, save_checkpoint
from trainer.config import TrainConfig
from trainer.metrics import MetricsWriter
from trainer.plots import plot_metrics
from trainer.policy import (
    base_model_path,
    load_policy,
    load_tokenizer,
    pad_batch,
    reference_context,
    token_logprobs,
)
from trainer.sandbox_pool import SandboxPool


def load_instances(cfg: TrainConfig) -> dict[str, Instance]:
    path = cfg.tasks.instances_path()
    if not path.is_file():
        raise FileNotFoundError(f"no instances file at {path}; build the bundled tasks with `make tasks` "
                                f"(or set tasks.dir / tasks.instances)")
    out = {}
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if line.strip():
            try:
                inst = Instance.from_dict(json.loads(line))
            except (json.JSONDecodeError, ValueError) as exc:
                raise ValueError(f"{path}:{n}: {exc}") from exc
            if cfg.tasks.languages and (inst.language or "") not in cfg.tasks.languages:
                continue
            if cfg.tasks.instance_ids and inst.instance_id not in cfg.tasks.instance_ids:
                continue
            out[inst.instance_id] = inst
    if not out:
        raise ValueError(f"{path}: no instances left after the tasks.languages / tasks.instance_ids filters")
    return out


class TaskSampler:
    """Epochs over the tasks, reshuffled each epoch; its position is checkpointed."""

    def __init__(self, ids: list[str], seed: int, shuffle: bool) -> None:
        self.ids, self.seed, self.shuffle = sorted(ids), seed, shuffle
        self.epoch, self.pos = 0, 0
        self._order = self._perm()

    def _perm(self) -> list[str]:
        order = list(self.ids)
        if self.shuffle:
            random.Random(self.seed * 100003 + self.epoch).shuffle(order)
        return order

    def take(self, k: int) -> list[str]:
        out = []
        while len(out) < k:
            if self.pos >= len(self._order):
                self.epoch, self.pos = self.epoch + 1, 0
                self._order = self._perm()
            out.append(self._order[self.pos])
            self.pos += 1
        return out

    def state(self) -> dict:
        return {"epoch": self.epoch, "pos": self.pos}

    def load(self, state: dict) -> None:
        self.epoch, self.pos = int(state["epoch"]), int(state["pos"])
        self._order = self._perm()


@dataclass
class Group:
    """One task's n rollouts and what the sandbox and the judge said about them."""

    instance: Instance
    trajs: list[Trajectory]
    results: list[EvalResult]
    grading: Any = None  # grader.records.Grading

    @property
    def passed(self) -> list[bool]:
        return [r.resolved for r in self.results]


@dataclass
class Judged:
    groups: list[Group]  # kept (mixed-outcome) groups, graded
    sampled: int = 0
    statuses: Counter = field(default_factory=Counter)
    passed: int = 0
    rollouts: int = 0
    tampered: int = 0
    graded: int = 0
    fallbacks: int = 0
    eval_s: float = 0.0
    grade_s: float = 0.0


class Trainer:
    def __init__(self, cfg: TrainConfig, *, resume: bool = False, log: Callable[[str], None] = print) -> None:
        self.cfg, self.log = cfg, log
        self.out = Path(cfg.out)
        self.out.mkdir(parents=True, exist_ok=True)
        torch.manual_seed(cfg.seed)
        self.instances = load_instances(cfg)
        self.repos = cfg.tasks.repos_path()
        self.sampler = TaskSampler(list(self.instances), cfg.seed, cfg.tasks.shuffle)
        ckpt = latest_checkpoint(self.out) if resume else None
        if resume and ckpt is None:
            log(f"--resume: no checkpoint under {self.out / 'checkpoints'}; starting from step 0")
        state = load_state(ckpt) if ckpt else {}
        path = state.get("base_model") or base_model_path(cfg.model)
        self.tokenizer = load_tokenizer(path)
        if cfg.warmstart.enabled and not ckpt:
            from trainer.warmstart import ensure_warmstart

            path = ensure_warmstart(cfg, path, self.instances, self.tokenizer, log=log)
        self.base_path = path
        adapter = str(ckpt / "weights") if ckpt and cfg.lora.enabled else None
        self.model = load_policy(cfg, str(ckpt / "weights") if ckpt and not cfg.lora.enabled else path, adapter)
        self.device = next(self.model.parameters()).device
        self.ref_model = None
        if cfg.optim.kl_coef > 0 and not cfg.lora.enabled:
            from trainer.policy import load_policy as _lp

            self.ref_model = _lp(cfg, path).eval().requires_grad_(False)
        params = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(params, lr=cfg.optim.lr, weight_decay=cfg.optim.weight_decay)
        self.start_step = 0
        if ckpt:
            restore_optimizer(ckpt, self.optimizer)
            self.sampler.load(state["sampler"])
            self.start_step = int(state["step"])
            log(f"resumed from {ckpt} (step {self.start_step})")
        from trainer.rollout import make_backend

        self.backend = make_backend(cfg, self.model, self.tokenizer, str(self.out))
        if ckpt and cfg.rollout.backend != "transformers":
            self.backend.sync_weights(self.model, self.start_step)
        self.pool = SandboxPool(cfg.sandbox, self.repos, run_id=f"train-{self.out.name}")
        self.metrics = MetricsWriter(self.out, start_step=self.start_step, tensorboard=cfg.tensorboard)
        (self.out / "config.json").write_text(json.dumps(cfg.to_dict(), indent=2) + "\n")

    # ── rollouts ────────────────────────────────────────────────────────────────────────────────────────
    def generate(self, ids: list[str], tag: str) -> list[list[Trajectory]]:
        r = self.cfg.rollout
        jobs = [(self.instances[i], f"{tag}-{g}-{k}") for g, i in enumerate(ids) for k in range(r.n)]
        if r.mode == "single_turn":
            trajs = run_single_turn(jobs, self.backend, self.tokenizer, repos_dir=self.repos,
                                    max_context_chars=r.max_context_chars, max_new_tokens=r.max_new_tokens,
                                    temperature=r.temperature, top_p=r.top_p, max_prompt_tokens=r.max_prompt_tokens)
        else:
            trajs = run_agent_episodes(jobs, self.backend, self.tokenizer, repos_dir=self.repos,
                                       sandbox=self.pool.config(), max_turns=r.max_turns,
                                       max_new_tokens=r.max_new_tokens, temperature=r.temperature, top_p=r.top_p,
                                       tool_timeout=r.tool_timeout_s, tool_output_chars=r.tool_output_chars,
                                       max_total_tokens=r.max_prompt_tokens + r.max_turns * r.max_new_tokens)
        self._record_behaviour_logprobs(trajs)
        return [trajs[g * r.n : (g + 1) * r.n] for g in range(len(ids))]

    @torch.no_grad()
    def _record_behaviour_logprobs(self, trajs: list[Trajectory]) -> None:
        """log π_behaviour of every token, from the trainer's model at generation time (the importance ratio's
        denominator; recomputed here rather than taken from the engine so both sides use the same numerics)."""
        was = self.model.training
        self.model.eval()
        bs = max(1, self.cfg.optim.minibatch_size)
        for i in range(0, len(trajs), bs):
            chunk = trajs[i : i + bs]
            ids, attn, lmask = pad_batch([t.token_ids for t in chunk], [t.mask for t in chunk],
                                         self.tokenizer.pad_token_id, self.device)
            logp, _ = token_logprobs(self.model, ids, attn, lmask)
            for t, row in zip(chunk, logp.cpu(), strict=True):
                t.old_logprobs = row[: len(t.token_ids) - 1].tolist()
        self.model.train(was)

    # ── sandbox, dynamic sampling, judge ───────────────────────────────────────────────────────────────
    def judge(self, ids: list[str], groups_trajs: list[list[Trajectory]], run_dir: Path) -> Judged:
        t0 = time.monotonic()
        preds = [Prediction(instance_id=t.instance_id, model_patch=t.patch, model_name_or_path="gagar-train",
                            rollout_id=t.rollout_id) for trajs in groups_trajs for t in trajs]
        results = {r.key: r for r in self.pool.evaluate(self.instances, preds, run_dir)}
        j = Judged(groups=[], sampled=len(ids), eval_s=time.monotonic() - t0)
        groups = []
        for iid, trajs in zip(ids, groups_trajs, strict=True):
            res = [results[(iid, t.rollout_id)] for t in trajs]
            groups.append(Group(self.instances[iid], trajs, res))
            j.statuses.update(r.status for r in res)
            j.passed += sum(r.resolved for r in res)
            j.tampered += sum(r.tampered_tests for r in res)
            j.rollouts += len(res)
        passed = torch.tensor([g.passed for g in groups], dtype=torch.bool)
        keep = mixed_outcome(passed) if self.cfg.advantage.dynamic_sampling else torch.ones(len(groups), dtype=torch.bool)
        j.groups = [g for g, k in zip(groups, keep.tolist(), strict=True) if k]
        t1 = time.monotonic()
        if self.cfg.advantage.redistribution != "none":
            self._grade(j)
        j.grade_s = time.monotonic() - t1
        return j

    def _grade(self, j: Judged) -> None:
        from grader.grade import grade_groups
        from grader.records import Candidate
        from grader.records import Group as GGroup

        todo = [g for g in j.groups if sum(g.passed) >= 2]  # one passing patch has nothing to be ranked against
        if not todo:
            return
        ggroups = [GGroup(instance_id=g.instance.instance_id, repo=g.instance.repo, base_commit=g.instance.base_commit,
                          problem_statement=g.instance.problem_statement,
                          candidates=[Candidate(rollout_id=t.rollout_id, patch=t.patch, trajectory=t.events or None)
                                      for t, ok in zip(g.trajs, g.passed, strict=True) if ok]) for g in todo]
        gr = self.cfg.grader
        backend = self._judge_backend() if gr.judge == "llm" else None
        gradings = grade_groups(ggroups, self.repos, judge=gr.judge, backend=backend, permutations=gr.permutations)
        for g, grading in zip(todo, gradings, strict=True):
            g.grading = grading
            j.graded += 1
            j.fallbacks += bool(grading.fallback)

    def _judge_backend(self) -> Any:
        if getattr(self, "_jb", None) is None:
            from grader.backends import make_backend

            gr = self.cfg.grader
            self._jb = make_backend(gr.backend, gr.model, adapter=gr.adapter or None, base_url=gr.base_url or None)
        return self._jb

    # ── advantages ─────────────────────────────────────────────────────────────────────────────────────
    def advantages(self, groups: list[Group]) -> torch.Tensor:
        a = self.cfg.advantage
        rewards = torch.tensor([[1.0 if ok else 0.0 for ok in g.passed] for g in groups])
        passed = torch.tensor([g.passed for g in groups], dtype=torch.bool)
        hacked = torch.tensor([[r.tampered_tests for r in g.results] for g in groups], dtype=torch.bool)
        rewards, passed = apply_hack_verdicts(rewards, passed, hacked)
        params = {"gapo": {"coverage": a.coverage, "center": a.center, "norm": a.norm, "eps": a.eps},
                  "grpo": {"eps": a.eps, "norm": a.norm}}.get(a.estimator, {})
        adv = compute_advantages(rewards, estimator=a.estimator, **params)
        if a.redistribution == "none":
            return adv
        weights = torch.full_like(adv, math.nan)
        usable = torch.zeros(len(groups), dtype=torch.bool)
        for b, g in enumerate(groups):
            # The judge's output is used only when it is its own (a fallback ranking leaves advantages as they are).
            if g.grading is not None and not g.grading.fallback:
                usable[b] = True
                for k, t in enumerate(g.trajs):
                    if t.rollout_id in g.grading.weights:
                        weights[b, k] = float(g.grading.weights[t.rollout_id])
        if a.redistribution == "gagar":
            return redistribute(adv, passed, weights, cap=a.cap, usable=usable)
        return downweight(adv, passed, weights, usable=usable)

    # ── policy update ──────────────────────────────────────────────────────────────────────────────────
    def update(self, groups: list[Group], adv: torch.Tensor) -> dict[str, float]:
        o = self.cfg.optim
        items = [(t, float(adv[b, k])) for b, g in enumerate(groups) for k, t in enumerate(g.trajs)]
        if o.kl_coef == 0:
            items = [(t, a) for t, a in items if a != 0.0]  # zero advantage, zero gradient: skip the compute
        stats: dict[str, list[float]] = {"loss": [], "clip_frac": [], "kl": [], "entropy": [], "grad_norm": []}
        if not items:
            return {}
        self.model.train()
        rng = random.Random(self.cfg.seed + len(items))
        for _ in range(o.epochs):
            rng.shuffle(items)
            for i in range(0, len(items), o.minibatch_size):
                mb = items[i : i + o.minibatch_size]
                ids, attn, lmask = pad_batch([t.token_ids for t, _ in mb], [t.mask for t, _ in mb],
                                             self.tokenizer.pad_token_id, self.device)
                mask = lmask[:, 1:]  # position t scores token t+1
                old = torch.zeros_like(mask)
                for r, (t, _) in enumerate(mb):
                    old[r, : len(t.old_logprobs)] = torch.tensor(t.old_logprobs)
                A = torch.tensor([a for _, a in mb], device=self.device)[:, None]
                logp, ent = token_logprobs(self.model, ids, attn, lmask, with_entropy=True)
                ratio = torch.exp(logp - old)
                # PPO/DAPO clipped surrogate: pessimistic of the raw and the clipped ratio; clip-higher lets
                # low-probability tokens with positive advantage grow more than a symmetric clip would.
                clipped = ratio.clamp(1 - o.clip_low, 1 + o.clip_high)
                tok_loss = torch.maximum(-A * ratio, -A * clipped)
                kl = torch.zeros_like(tok_loss)
                if o.kl_coef > 0:
                    with torch.no_grad(), reference_context(self.model, self.ref_model) as ref:
                        ref_logp, _ = token_logprobs(ref, ids, attn, lmask)
                    d = ref_logp - logp
                    kl = torch.exp(d) - d - 1  # k3 estimator: unbiased, always >= 0
                    tok_loss = tok_loss + o.kl_coef * kl
                if o.loss_agg == "token_mean":
                    loss = (tok_loss * mask).sum() / mask.sum().clamp(min=1)
                else:
                    loss = ((tok_loss * mask).sum(1) / mask.sum(1).clamp(min=1)).mean()
                self.optimizer.zero_grad()
                loss.backward()
                gn = torch.nn.utils.clip_grad_norm_([p for p in self.model.parameters() if p.requires_grad],
                                                    o.max_grad_norm)
                self.optimizer.step()
                n = mask.sum().clamp(min=1)
                was_clipped = ((ratio > 1 + o.clip_high) & (A > 0)) | ((ratio < 1 - o.clip_low) & (A < 0))
                stats["loss"].append(loss.item())
                stats["clip_frac"].append(float((was_clipped.float() * mask).sum() / n))
                stats["kl"].append(float((kl.detach() * mask).sum() / n))
                stats["entropy"].append(float((ent.detach() * mask).sum() / n))
                stats["grad_norm"].append(float(gn))
        return {k: sum(v) / len(v) for k, v in stats.items() if v}

    # ── the loop ───────────────────────────────────────────────────────────────────────────────────────
    def run(self, on_step: Callable[[dict], None] | None = None) -> dict:
        cfg, r = self.cfg, self.cfg.rollout
        pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="gagar-judge") if r.overlap else None
        pending: tuple[list[str], Future, float] | None = None
        last_row: dict = {}
        try:
            for step in range(self.start_step + 1, cfg.steps + 1):
                t_step = time.monotonic()
                gen_s = 0.0
                cursor = self.sampler.state()
                step_dir = self.out / "sandbox" / f"step_{step:06d}"

                def start(ids: list[str], tag: str, sub: str, step_dir: Path = step_dir) -> tuple[list[str], Any, float]:
                    t0 = time.monotonic()
                    trajs = self.generate(ids, tag)
                    dt = time.monotonic() - t0
                    if pool is not None:
                        return ids, pool.submit(self.judge, ids, trajs, step_dir / sub), dt
                    return ids, self.judge(ids, trajs, step_dir / sub), dt

                if pending is None:
                    pending = start(self.sampler.take(r.tasks_per_step), f"s{step}r0", "r0")
                    gen_s += pending[2]
                first = pending
                pending = None
                if pool is not None and step < cfg.steps:
                    cursor = self.sampler.state()  # the next step's tasks are drawn now; resume redraws them
                    pending = start(self.sampler.take(r.tasks_per_step), f"s{step + 1}r0", "next")
                    gen_s += pending[2]
                judged = [first[1].result() if isinstance(first[1], Future) else first[1]]
                kept = list(judged[0].groups)
                for refill in range(1, r.max_refill + 1):
                    if len(kept) >= r.tasks_per_step:
                        break
                    ids, j, dt = start(self.sampler.take(r.tasks_per_step - len(kept)), f"s{step}r{refill}",
                                       f"r{refill}")
                    gen_s += dt
                    judged.append(j.result() if isinstance(j, Future) else j)
                    kept += judged[-1].groups
                t_up = time.monotonic()
                upd = {}
                adv = None
                if kept:
                    adv = self.advantages(kept)
                    upd = self.update(kept, adv)
                    if r.backend != "transformers":
                        self.backend.sync_weights(self.model, step)
                update_s = time.monotonic() - t_up
                row = self._row(step, judged, kept, adv, upd, gen_s, update_s, time.monotonic() - t_step)
                self.metrics.write(row)
                last_row = row
                if on_step:
                    on_step(row)
                if step % cfg.save_every == 0 or step == cfg.steps:
                    save_checkpoint(self.out, step, self.model, self.optimizer,
                                    {"sampler": cursor, "base_model": self.base_path})
        except BaseException:
            if pool is not None:  # Ctrl-C: the judge thread's containers must not outlive us (nor block the join)
                from sandbox.container import remove_live

                remove_live()
            raise
        finally:
            if pool is not None:
                pool.shutdown(wait=True, cancel_futures=True)
            self.metrics.close()
        plot = plot_metrics(self.metrics.path, self.out / "plots" / "curves.png")
        ckpt = latest_checkpoint(self.out)
        summary = {"out": str(self.out), "steps": cfg.steps, "last": last_row, "metrics": str(self.metrics.path),
                   "plot": str(plot) if plot else None, "checkpoint": str(ckpt) if ckpt else None}
        (self.out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
        return summary

    def _row(self, step, judged: list[Judged], kept: list[Group], adv, upd, gen_s, update_s, step_s) -> dict:
        rollouts = sum(j.rollouts for j in judged)
        statuses: Counter = Counter()
        for j in judged:
            statuses.update(j.statuses)
        graded = sum(j.graded for j in judged)
        row = {
            "step": step,
            "groups_sampled": sum(j.sampled for j in judged),
            "groups_kept": len(kept),
            "rollouts": rollouts,
            "pass_rate": sum(j.passed for j in judged) / max(1, rollouts),
            "tampered": sum(j.tampered for j in judged),
            "reward_mean": (sum(sum(g.passed) for g in kept) / max(1, sum(len(g.passed) for g in kept)))
            if kept else None,
            "judge_graded": graded,
            "judge_fallback_rate": (sum(j.fallbacks for j in judged) / graded) if graded else None,
            "policy_tokens_mean": sum(t.policy_tokens for j in judged for g in j.groups for t in g.trajs)
            / max(1, sum(len(g.trajs) for j in judged for g in j.groups)) if kept else None,
            "patch_lines_mean": sum(len(t.patch.splitlines()) for g in kept for t in g.trajs)
            / max(1, sum(len(g.trajs) for g in kept)) if kept else None,
            "gen_s": round(gen_s, 3),
            "eval_s": round(sum(j.eval_s for j in judged), 3),
            "grade_s": round(sum(j.grade_s for j in judged), 3),
            "update_s": round(update_s, 3),
            "step_s": round(step_s, 3),
            **{f"status_{k}": v for k, v in sorted(statuses.items())},
        }
        if adv is not None:
            row.update(adv_mean=float(adv.mean()), adv_std=float(adv.std()) if adv.numel() > 1 else 0.0,
                       adv_min=float(adv.min()), adv_max=float(adv.max()))
        row.update(upd)
        return row


def train(cfg: TrainConfig, *, resume: bool = False, log: Callable[[str], None] = print,
          on_step: Callable[[dict], None] | None = None) -> dict:
    return Trainer(cfg, resume=resume, log=log).run(on_step=on_step)
