"""The training's time budget: `clock_callback(max_minutes)` is a transformers callback that estimates the run after
a few steps and, when it would pass the budget, shortens it to the steps that fit, learning-rate schedule included
(`fit_schedule`)."""

from __future__ import annotations

from typing import Any


def fit_schedule(scheduler: Any, steps: int) -> bool:
    """Give a transformers LambdaLR schedule (cosine, linear, ...) a new horizon of `steps`; False if it has none."""
    import functools

    lambdas = getattr(scheduler, "lr_lambdas", None) or []
    fits = [f for f in lambdas if isinstance(f, functools.partial) and "num_training_steps" in f.keywords]
    if not fits or len(fits) != len(lambdas):
        return False
    scheduler.lr_lambdas = [functools.partial(f.func, *f.args, **{**f.keywords, "num_training_steps": steps})
                            for f in fits]
    return True


def clock_callback(max_minutes: float | None, measure_steps: int = 8) -> Any:
    """The time budget: after `measure_steps` optimizer steps it prints the estimate, and if the run would pass
    `max_minutes` it shortens it to the steps that fit, learning-rate schedule included (a cosine that ends where
    the run ends, not one cut off at full height); it also stops at the cap itself. Steps count from where this
    process began: a run resumed from a checkpoint measures and fits its own steps."""
    import time

    from transformers import TrainerCallback

    class Clock(TrainerCallback):
        def __init__(self) -> None:
            self.t0 = self.t_first = 0.0
            self.start_step = 0
            self.stopped_at_cap = False
            self.planned_steps: int | None = None
            self.fitted_steps: int | None = None

        def on_train_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            self.t0 = time.perf_counter()
            self.planned_steps = state.max_steps
            self.start_step = state.global_step  # > 0 when resumed from a checkpoint

        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            now = time.perf_counter()
            spent = now - self.t0
            done = state.global_step - self.start_step
            if done == 1:
                self.t_first = now  # the first step pays for warm-up (allocations, kernels): not a fair sample
            if done == measure_steps:
                per = (now - self.t_first) / (measure_steps - 1)
                total = state.max_steps
                left = total - self.start_step
                print(f"gagar sft train: {per:.1f} s/step: about {per * left / 60:.0f} min for {left} steps"
                      + (f" (budget {max_minutes:g} min)" if max_minutes else ""), flush=True)
                if max_minutes:
                    fit = state.global_step + int((max_minutes * 60 - spent) / per)
                    if fit < total and fit_schedule(kw.get("lr_scheduler"), fit):
                        state.max_steps = self.fitted_steps = fit
                        print(f"gagar sft train: {fit} steps fit the budget; the schedule now ends there",
                              flush=True)
            if self.fitted_steps and state.global_step >= self.fitted_steps:
                control.should_training_stop = True
            if max_minutes and spent > max_minutes * 60:
                self.stopped_at_cap = True
                control.should_training_stop = True

    return Clock()
