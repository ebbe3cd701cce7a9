"""One left-padded batch through Hugging Face `generate`, with what an OpenAI-compatible server needs on top:
per-token log-probabilities of the model's raw distribution (and the top k), stop strings, a seed, a
callback per sampled token (streaming) and cancellation — without touching how the tokens are sampled.

How: the first logits processor only records `log_softmax(raw logits)` of each step; temperature, top-k and
top-p follow as HF's own warpers; `_Rows` is at once the streamer (it sees each step's sampled tokens) and a
stopping criterion (a row ends after eos, after the token completing a stop string, or at the length limit),
so HF and the bookkeeping here agree on when every row ends and a finished row's padding is never read as
tokens. (HF evaluates stopping criteria just before it streams a step's tokens, so a row runs one step past
its end; that token is never recorded.) The model's own `generation_config` sampling defaults (a hub model's repetition penalty, top-k,
min-p, …) are left out: the request alone decides the distribution, which is also the one the trainer scores
its importance ratio under (temperature and top-p only).
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from inference.base import Sample, SamplingParams


@dataclass
class RowState:
    """One row's completion so far; `finish` is set on the token that ends it."""

    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    top_logprobs: list[list[tuple[int, float]]] = field(default_factory=list)
    text: str = ""
    finish: str | None = None  # stop | length | abort
    stop_reason: str | int | None = None

    def sample(self, want_logprobs: bool) -> Sample:
        return Sample(token_ids=list(self.token_ids), text=self.text, finish_reason=self.finish or "length",
                      logprobs=list(self.logprobs) if want_logprobs else None,
                      top_logprobs=[list(t) for t in self.top_logprobs] if want_logprobs else None,
                      stop_reason=self.stop_reason)


OnToken = Callable[[int, RowState], None]  # (row index in the caller's prompt list, that row's state)


def _rows_class():
    from transformers.generation.stopping_criteria import StoppingCriteria
    from transformers.generation.streamers import BaseStreamer

    class _Rows(BaseStreamer, StoppingCriteria):
        def __init__(self, tokenizer: Any, params: SamplingParams, eos_ids: set[int], n: int, index: list[int],
                     on_token: OnToken | None, cancel: threading.Event | None) -> None:
            self.tok, self.p, self.eos_ids = tokenizer, params, eos_ids
            self.rows = [RowState() for _ in range(n)]
            self.index, self.on_token, self.cancel = index, on_token, cancel
            self.stops = [s for s in (params.stop or []) if s]
            self.live_text = bool(self.stops) or on_token is not None
            self.mode = "processed" if params.logprobs_mode == "processed" else "raw"
            self.step_logps: deque = deque()  # one per step, taken by `put` (which may come a step late)
            self._prompt_seen = False

        # logits processor: first in the list, so it sees the model's raw scores
        def record(self, input_ids: Any, scores: Any) -> Any:
            import torch

            if self.p.logprobs is not None:
                # a token outside the nucleus has log-prob -inf after top-p: clamped, so JSON can carry it
                self.step_logps.append(torch.log_softmax(scores.float(), dim=-1).clamp(min=-1e4))
            return scores

        def _decode(self, ids: list[int]) -> str:
            return self.tok.decode(ids, skip_special_tokens=self.p.skip_special_tokens,
                                   clean_up_tokenization_spaces=False)

        # streamer: the prompt first, then each step's sampled tokens (padding for rows already finished)
        def put(self, value: Any) -> None:
            if not self._prompt_seen:
                self._prompt_seen = True
                return
            toks = value.reshape(-1).tolist()
            logp = self.step_logps.popleft() if self.step_logps else None
            if self.cancel is not None and self.cancel.is_set():
                return  # HF stops at its next check; nothing sampled after the cancel is kept
            k = self.p.logprobs or 0
            top_ids = top_vals = None
            if logp is not None and k > 0:
                top_vals, top_ids = logp.topk(k, dim=-1)
                top_vals, top_ids = top_vals.tolist(), top_ids.tolist()
            for r, tok in enumerate(toks):
                row = self.rows[r]
                if row.finish is not None:  # HF checks its stopping criteria one step before it streams
                    continue
                row.token_ids.append(tok)
                if logp is not None:
                    row.logprobs.append(float(logp[r, tok]))
                    row.top_logprobs.append(list(zip(top_ids[r], top_vals[r], strict=True)) if k else [])
                eos = tok in self.eos_ids
                if self.live_text:
                    prev = len(row.text)
                    row.text = self._decode(row.token_ids[:-1] if eos else row.token_ids)
                    self._check_stop(row, prev)
                if row.finish is None and eos:
                    row.finish, row.stop_reason = "stop", tok
                if row.finish is None and len(row.token_ids) >= self.p.max_new_tokens:
                    row.finish = "length"
                if self.on_token is not None:
                    self.on_token(self.index[r], row)

        def _check_stop(self, row: RowState, prev: int) -> None:
            # Only the new text (and a stop string's length before it) can hold a new match.
            start = max(0, prev - max(map(len, self.stops), default=0))
            hits = [(i, s) for s in self.stops if (i := row.text.find(s, start)) >= 0]
            if hits:
                row.finish, row.stop_reason = "stop", min(hits)[1]

        def end(self) -> None:
            for r, row in enumerate(self.rows):
                if row.finish is None:
                    row.finish = "abort" if self.cancel is not None and self.cancel.is_set() else "length"
                    if self.on_token is not None:
                        self.on_token(self.index[r], row)

        # stopping criterion: a row is done once the bookkeeping above says so
        def __call__(self, input_ids: Any, scores: Any, **kwargs: Any) -> Any:
            import torch

            if self.cancel is not None and self.cancel.is_set():
                return torch.ones(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)
            return torch.tensor([row.finish is not None for row in self.rows], dtype=torch.bool,
                                device=input_ids.device)

    return _Rows


def generate_rows(model: Any, tokenizer: Any, prompts: list[list[int]], params: SamplingParams, *, pad_id: int,
                  eos_ids: set[int], index: list[int] | None = None, on_token: OnToken | None = None,
                  cancel: threading.Event | None = None) -> list[Sample]:
    """Sample one completion per prompt in one left-padded batch (the caller holds the model's lock and has
    seeded the RNG). `index` names each row in `on_token` callbacks (default: its position)."""
    import torch
    from transformers import GenerationConfig, LogitsProcessorList, StoppingCriteriaList
    from transformers.generation.logits_process import (
        LogitsProcessor,
        TemperatureLogitsWarper,
        TopKLogitsWarper,
        TopPLogitsWarper,
    )

    device = next(model.parameters()).device
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for r, p in enumerate(prompts):
        ids[r, width - len(p):] = torch.tensor(p, dtype=torch.long)
        mask[r, width - len(p):] = 1
    rows = _rows_class()(tokenizer, params, eos_ids, len(prompts), index or list(range(len(prompts))),
                         on_token, cancel)

    class _Record(LogitsProcessor):
        def __init__(self, stage: str) -> None:
            self.stage = stage

        def __call__(self, input_ids: Any, scores: Any) -> Any:
            return rows.record(input_ids, scores) if self.stage == rows.mode else scores

    eos = sorted(eos_ids)
    sampling = params.temperature > 0
    if params.model_defaults:
        # The checkpoint's own defaults fill what is not given; its warpers run before ours, so no log-probs.
        if params.logprobs is not None:
            raise ValueError("log-probs need model_defaults=False (the warpers must be exactly the request's)")
        config = GenerationConfig(max_new_tokens=params.max_new_tokens, do_sample=sampling, pad_token_id=pad_id,
                                  eos_token_id=eos, **({"temperature": params.temperature, "top_p": params.top_p,
                                                        "top_k": params.top_k} if sampling else {}))
        procs: list[Any] = []
        swap = None
    else:
        procs = [_Record("raw")]
        if sampling:
            if params.temperature != 1.0:
                procs.append(TemperatureLogitsWarper(params.temperature))
            if params.top_k > 0:
                procs.append(TopKLogitsWarper(params.top_k))
            if params.top_p < 1.0:
                procs.append(TopPLogitsWarper(params.top_p))
        procs.append(_Record("processed"))
        # The warpers above are the whole distribution: HF's own defaults (top-k 50) must not add theirs.
        config = GenerationConfig(max_new_tokens=params.max_new_tokens, do_sample=sampling, pad_token_id=pad_id,
                                  eos_token_id=eos, **({"temperature": 1.0, "top_p": 1.0, "top_k": 0} if sampling else {}))
        # HF fills a passed config's unset values from the model's generation_config: swap in one with none.
        swap = GenerationConfig(pad_token_id=pad_id, eos_token_id=eos)
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    saved = base.generation_config
    if swap is not None:
        base.generation_config = swap
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            model.generate(input_ids=ids.to(device), attention_mask=mask.to(device), generation_config=config,
                           logits_processor=LogitsProcessorList(procs), stopping_criteria=StoppingCriteriaList([rows]),
                           streamer=rows)
    finally:
        base.generation_config = saved
        model.train(was_training)
    out = []
    for row in rows.rows:
        if not rows.live_text:  # the eos token's text is never part of the text (vLLM's too)
            row.text = rows._decode(row.token_ids[:-1] if isinstance(row.stop_reason, int) else row.token_ids)
        out.append(row.sample(params.logprobs is not None))
    return out
