"""The RL loop, in plain sight. One step:

    sample    tasks ─► n rollouts each (policy: single-turn diff, or a multi-turn agent in a container)
    evaluate  every patch through the sandbox ─► one `RolloutGroup` per task (an infra_error is masked, not 0)
    check     the grader's hack check on every group with a passing rollout ─► hacks become failures
    keep      dynamic sampling on those final verdicts: mixed-outcome groups only, refilled from the next tasks
    advantage base estimator (GRPO / GAPO) ─► the judge ranks only groups where GAGAR can move something ─►
              GAGAR redistribution (or the downweight ablation)
    update    clipped token-level policy gradient, log-probs under the sampling distribution

So a hack never pays: sandbox verdicts (`EvalResult.passed`) and grader verdicts (`Grading.hacks`) both apply
before dynamic sampling, so a tamperer in an otherwise all-passing group gets a negative advantage instead of
being dropped with its group, and no hacked patch reaches the judge.

With `rollout.overlap`, evaluate/check/keep of step t+1's first batch run in a background thread while step t
finishes; those rollouts are then one update stale, which the clipped importance ratio against the behaviour
log-probs (recorded at generation) accounts for.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import torch

from inference.backends import close_backend
from sandbox.records import Prediction
from trainer import rewards
from trainer.agent import Trajectory
from trainer.checkpoint import latest_checkpoint, resume_point, save_checkpoint
from trainer.config import TrainConfig
from trainer.generation import generate, mismatch_means, record_behaviour_logprobs, sampling_mismatch
from trainer.groups import RolloutGroup, build_groups, infra_result
from trainer.judging import Judge
from trainer.metrics import MetricsWriter, step_row
from trainer.plots import plot_metrics
from trainer.policy import build_policy
from trainer.sandbox_pool import SandboxPool
from trainer.tasks import TaskSampler, load_instances
from trainer.update import lr_factor, policy_update


@dataclass
class Batch:
    """One draw of tasks after sample → evaluate → check → keep."""

    ids: list[str]
    groups: list[RolloutGroup]
    kept: list[RolloutGroup] = field(default_factory=list)
    times: dict[str, float] = field(default_factory=dict)


class Trainer:
    def __init__(self, cfg: TrainConfig, *, resume: bool = False, log: Callable[[str], None] = print) -> None:
        self.cfg, self.log = cfg, log
        self.out = Path(cfg.out)
        self.out.mkdir(parents=True, exist_ok=True)
        torch.manual_seed(cfg.seed)
        self.instances = load_instances(cfg)
        self.repos = cfg.tasks.repos_path()
        self.pool = SandboxPool(cfg.sandbox, self.repos, run_id=f"train-{self.out.name}")  # checks before the model
        ckpt, state = resume_point(self.out, resume, log)
        self.policy = build_policy(cfg, self.instances, ckpt=ckpt, state=state, log=log)
        from trainer.rollout import make_backend

        self.backend = make_backend(cfg, self.policy.model, self.policy.tokenizer, str(self.out),
                                    base_path=self.policy.base_path)
        try:
            if cfg.rollout.backend == "openai" and self.policy.base_path != cfg.model.name_or_path:
                log(f"note: the policy's base is {self.policy.base_path} (warm start or checkpoint): the server at "
                    f"{cfg.rollout.base_url} must serve those weights for the LoRA updates it receives to apply")
            self.judge = Judge(cfg.grader, self.repos, sandbox=self.pool.config, work_dir=self.out,
                               models_root=cfg.model.cache_dir)
            if cfg.tasks.frontier_k:  # before any trained adapter reaches the engine: it samples the starting policy
                self.instances = self.frontier(resumed=ckpt is not None)
            self.sampler = TaskSampler(list(self.instances), cfg.seed, cfg.tasks.shuffle)
            self.restore(state)
            if ckpt and cfg.rollout.backend != "transformers":
                self.backend.sync_weights(self.policy.model, self.start_step)
            self.metrics = MetricsWriter(self.out, start_step=self.start_step, tensorboard=cfg.tensorboard)
            (self.out / "config.json").write_text(json.dumps(cfg.to_dict(), indent=2) + "\n")
        except BaseException:
            close_backend(self.backend)
            raise

    def close(self) -> None:
        """Hand back the rollout engine and the judge's (an in-process engine stays up for the next user of the
        same base; a `vllm serve` the run started is stopped with its children)."""
        close_backend(self.backend)
        self.judge.close()

    def frontier(self, *, resumed: bool) -> dict:
        """The training tasks with 0 < p < 1 under the starting policy (`tasks.frontier_k`; trainer.frontier). A
        resumed run keeps the tasks it started with: its policy is no longer the starting one."""
        from trainer.frontier import ensure_frontier

        record = self.out / "frontier.json"
        if resumed:
            if not record.is_file():
                raise ValueError(f"{self.out} trains on frontier tasks but has no frontier.json to resume with")
            kept = json.loads(record.read_text())["kept"]
        else:
            kept = ensure_frontier(self.cfg, self.policy.base_path, self.backend, self.policy.tokenizer,
                                   self.instances, self.pool, self.judge, self.out, self.log)
        return {i: self.instances[i] for i in kept if i in self.instances}

    def restore(self, state: dict) -> None:
        """Continue where a checkpoint's state left off: its step and task cursor, and the tasks it had drawn
        for the next step (overlap) without training on them yet."""
        self.start_step = int(state.get("step", 0))
        if "sampler" in state:
            self.sampler.load(state["sampler"])
        self._resumed_ids: list[str] | None = state.get("pending") or None

    # ── the stages of one step, in order ───────────────────────────────────────────────────────────────
    def sample(self, ids: list[str], tag: str) -> tuple[list[list[Trajectory]], dict[str, float]]:
        """The rollouts and, per batch: seconds generating (`gen_s`) and scoring them with the trainer's model
        (`score_s`), and the sampling-vs-scoring sums (`sampling_mismatch`)."""
        r, o = self.cfg.rollout, self.cfg.optim
        t0 = time.monotonic()
        trajs = generate(r, self.backend, self.policy.tokenizer, self.instances, ids, tag, repos_dir=self.repos,
                         sandbox=self.pool.config())
        t1 = time.monotonic()
        flat = [t for g in trajs for t in g]
        record_behaviour_logprobs(self.policy.model, self.policy.pad_id, flat, temperature=r.temperature,
                                  top_p=r.top_p, batch_size=o.minibatch_size)
        t2 = time.monotonic()
        if r.drop_unfinished:  # agent episodes that never finished leave the group (masked, still evaluated)
            for t in flat:
                t.dropped = t.finish in ("max_turns", "context")
        return trajs, {"gen_s": t1 - t0, "score_s": t2 - t1,
                       **sampling_mismatch(flat, clip_low=o.clip_low, clip_high=o.clip_high)}

    def evaluate(self, trajs: list[list[Trajectory]], run_dir: Path) -> list[RolloutGroup]:
        """Every patch through the sandbox; a rollout whose own sandbox already failed is masked, not evaluated."""
        flat = [t for g in trajs for t in g]
        preds = [Prediction(instance_id=t.instance_id, model_patch=t.patch, model_name_or_path="gagar-train",
                            rollout_id=t.rollout_id) for t in flat if not t.infra_error]
        results = self.pool.evaluate_masked(self.instances, preds, run_dir, self.log)
        results += [infra_result(t.instance_id, t.rollout_id, t.infra_error) for t in flat if t.infra_error]
        return build_groups(self.instances, trajs, results)

    def check(self, groups: list[RolloutGroup]) -> None:
        self.judge.check_hacks(groups)

    def keep(self, groups: list[RolloutGroup]) -> list[RolloutGroup]:
        if not self.cfg.advantage.dynamic_sampling:
            return [g for g in groups if any(g.valid)]
        return [g for g, k in zip(groups, rewards.keep_mask(groups), strict=True) if k]

    def advantages(self, kept: list[RolloutGroup]) -> tuple[torch.Tensor, dict]:
        a = self.cfg.advantage
        base = rewards.base_advantages(kept, a)
        stats: dict = {}
        if a.redistribution != "none":
            need = rewards.needs_ranking(kept, base)
            t0 = time.monotonic()
            self.judge.rank_groups([g for g, n in zip(kept, need, strict=True) if n])
            stats.update(judge_ranked=sum(need), judge_skipped=sum(1 for g, n in zip(kept, need, strict=True)
                                                                  if not n and any(g.passed)),
                         judge_fallbacks=sum(bool(g.ranking and g.ranking.fallback) for g in kept),
                         rank_s=round(time.monotonic() - t0, 3))
            base = rewards.base_advantages(kept, a)  # the judge may have found more hacks
        adv = rewards.redistribute_groups(kept, base, a)
        stats.update(rewards.redistribution_stats(kept, base, adv))
        if adv.numel():
            valid = rewards.masks(kept)[1]
            v = adv[valid]
            stats.update(adv_mean=float(v.mean()), adv_std=float(v.std()) if v.numel() > 1 else 0.0,
                         adv_min=float(v.min()), adv_max=float(v.max()))
        return adv, stats

    def update(self, kept: list[RolloutGroup], adv: torch.Tensor, step: int = 1) -> dict[str, float]:
        # Rollouts the sandbox could not run (or dropped ones) are not in the loss at all (not even through the
        # KL term); with DAPO's overlong filtering, neither are rollouts the token limit cut off.
        o = self.cfg.optim
        items = [(t, float(adv[b, k])) for b, g in enumerate(kept)
                 for k, (t, ok) in enumerate(zip(g.trajs, g.valid, strict=True)) if ok]
        cut = [o.overlong_filter and t.finish in ("length", "context") for t, _ in items]
        items = [it for it, c in zip(items, cut, strict=True) if not c]
        r, p = self.cfg.rollout, self.policy
        lr = o.lr * lr_factor(step, o, self.cfg.steps)
        if lr == 0.0:  # nothing can change (AdamW's step and its weight decay both scale with lr): skip the passes
            return {"lr": 0.0, "overlong_filtered": sum(cut), "update_skipped": 1}
        stats = policy_update(p.model, p.optimizer, items, o, pad_id=p.pad_id, temperature=r.temperature,
                              top_p=r.top_p, seed=self.cfg.seed, ref_model=p.ref_model, lr=lr,
                              loss_scale=o.loss_scale or self.cfg.policy_token_budget())
        return {**stats, "lr": lr, "overlong_filtered": sum(cut)}

    # ── one step ───────────────────────────────────────────────────────────────────────────────────────
    def collect(self, ids: list[str], tag: str, run_dir: Path,
                sampled: tuple[list[list[Trajectory]], dict[str, float]] | None = None) -> Batch:
        """sample → evaluate → check → keep for one draw of tasks (`sampled` given: `sample`'s result)."""
        trajs, times = sampled if sampled is not None else self.sample(ids, tag)
        t1 = time.monotonic()
        groups = self.evaluate(trajs, run_dir)
        t2 = time.monotonic()
        self.check(groups)
        t3 = time.monotonic()
        return Batch(ids, groups, self.keep(groups), {**times, "eval_s": t2 - t1, "check_s": t3 - t2})

    def step(self, step: int, first: Batch, refill: Callable[[int, int], Batch]) -> dict:
        batches = [first]
        kept = list(first.kept)
        for k in range(1, self.cfg.rollout.max_refill + 1):
            if len(kept) >= self.cfg.rollout.tasks_per_step:
                break
            batches.append(refill(k, self.cfg.rollout.tasks_per_step - len(kept)))
            kept += batches[-1].kept
        t0 = time.monotonic()
        stats: dict = {}
        sync_s = 0.0
        if kept:
            adv, stats = self.advantages(kept)
            stats.update(self.update(kept, adv, step))
            if self.cfg.rollout.backend != "transformers":
                t_sync = time.monotonic()
                self.backend.sync_weights(self.policy.model, step)
                sync_s = time.monotonic() - t_sync
        total = {k: sum(b.times.get(k, 0.0) for b in batches) for k in
                 ("gen_s", "score_s", "eval_s", "check_s", "sampler_tokens", "sampler_absdiff_sum",
                  "sampler_outside_clip_n")}
        stats.update({k: round(total[k], 3) for k in ("gen_s", "score_s", "eval_s", "check_s")},
                     **mismatch_means(total),
                     update_s=round(time.monotonic() - t0 - sync_s - stats.get("rank_s", 0.0), 3),
                     sync_s=round(sync_s, 3))
        return step_row(step, [g for b in batches for g in b.groups], kept, stats)

    # ── the loop ───────────────────────────────────────────────────────────────────────────────────────
    def run(self, on_step: Callable[[dict], None] | None = None) -> dict:
        cfg, r = self.cfg, self.cfg.rollout
        worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="gagar-judge") if r.overlap else None
        pending: tuple[list[str], Future | Batch] | None = None
        last_row: dict = {}

        def start(ids: list[str], step: int, sub: str) -> tuple[list[str], Future | Batch]:
            tag, run_dir = f"s{step}{sub}", self.out / "sandbox" / f"step_{step:06d}" / sub
            if worker is None:
                return ids, self.collect(ids, tag, run_dir)
            sampled = self.sample(ids, tag)  # generation stays on this thread (it uses the model)
            return ids, worker.submit(self.collect, ids, tag, run_dir, sampled)

        def result(p: tuple[list[str], Future | Batch]) -> Batch:
            return p[1].result() if isinstance(p[1], Future) else p[1]

        try:
            for step in range(self.start_step + 1, cfg.steps + 1):
                t_step = time.monotonic()
                if pending is None:
                    pending = start(self._resumed_ids or self.sampler.take(r.tasks_per_step), step, "r0")
                    self._resumed_ids = None
                first, pending = pending, None
                if worker is not None and step < cfg.steps:
                    pending = start(self.sampler.take(r.tasks_per_step), step + 1, "r0")
                row = self.step(step, result(first),
                                lambda k, n, step=step: result(start(self.sampler.take(n), step, f"r{k}")))
                row["step_s"] = round(time.monotonic() - t_step, 3)
                self.metrics.write(row)
                last_row = row
                if on_step:
                    on_step(row)
                if step % cfg.save_every == 0 or step == cfg.steps:
                    # The cursor *after* this step's draws, plus the prefetched next tasks that are not trained
                    # on yet: a resumed run neither repeats nor skips a task.
                    save_checkpoint(self.out, step, self.policy.model, self.policy.optimizer,
                                    {"sampler": self.sampler.state(), "base_model": self.policy.base_path,
                                     "pending": pending[0] if pending else None})
        except BaseException:
            if worker is not None:  # Ctrl-C: the judge thread's containers must not outlive us (nor block the join)
                from sandbox.container import remove_live

                remove_live()
            raise
        finally:
            if worker is not None:
                worker.shutdown(wait=True, cancel_futures=True)
            self.metrics.close()
            self.close()
        return self._summary(last_row)

    def _summary(self, last_row: dict) -> dict:
        plot = plot_metrics(self.metrics.path, self.out / "plots" / "curves.png")
        ckpt = latest_checkpoint(self.out)
        summary = {"out": str(self.out), "steps": self.cfg.steps, "last": last_row, "metrics": str(self.metrics.path),
                   "plot": str(plot) if plot else None, "checkpoint": str(ckpt) if ckpt else None}
        (self.out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
        return summary


def train(cfg: TrainConfig, *, resume: bool = False, log: Callable[[str], None] = print,
          on_step: Callable[[dict], None] | None = None) -> dict:
    return Trainer(cfg, resume=resume, log=log).run(on_step=on_step)
