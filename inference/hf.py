"""transformers in-process: the judge's chat model (path + optional PEFT adapter) and the policy's sampler.

One class for both. Given a path it loads the model (and adapter) for inference; given an already loaded model
(the policy being trained) it samples from that very object, so no weight push is ever needed. Batches are
left-padded so every row's completion starts at the same column; the judge's conversations of one turn and the
policy's n rollouts of a step each go through `generate` as one batch (chunks of `batch_size`).
`score_continuations` scores given continuations instead of sampling one: the judge's answer grammar chooses
by it (`grader.judge.grammar`).
"""

from __future__ import annotations

import os
import threading
from typing import Any

from inference.base import BackendError, Messages, Sample, SamplingParams
from inference.hf_sampling import OnToken


class TransformersBackend:
    """A causal LM; `model` is a path, a hub id, or an already loaded model (then pass its `tokenizer`)."""

    def __init__(
        self,
        model: Any,
        adapter: str | None = None,
        *,
        tokenizer: Any = None,
        device: str | None = None,
        dtype: str | None = None,
        batch_size: int = 16,
    ) -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        loaded_here = isinstance(model, (str, os.PathLike))
        if loaded_here:
            self.name = os.path.basename(str(model).rstrip("/")) or str(model)
            kwargs: dict[str, Any] = {"dtype": getattr(torch, dtype)} if dtype else {}
            self.tokenizer = tokenizer or AutoTokenizer.from_pretrained(str(model))
            self.model = AutoModelForCausalLM.from_pretrained(str(model), **kwargs)
        else:
            if tokenizer is None:
                raise ValueError("pass the tokenizer along with an already loaded model")
            self.name = getattr(getattr(model, "config", None), "_name_or_path", "") or "model"
            self.model, self.tokenizer = model, tokenizer
        if adapter:
            from peft import PeftModel

            self.model = PeftModel.from_pretrained(self.model, str(adapter))
            self.name += "+" + os.path.basename(str(adapter).rstrip("/"))
        if loaded_here or device:
            # A model loaded here is ours to place; the policy's model stays where the trainer put it.
            self.model.to(device or ("cuda" if torch.cuda.is_available() else "cpu"))
            self.model.eval()
        self.batch_size = max(1, batch_size)
        gen_cfg = getattr(self.model, "generation_config", None)
        eos = getattr(gen_cfg, "eos_token_id", None)
        eos = eos if eos is not None else self.tokenizer.eos_token_id
        self.eos_ids = {int(e) for e in (eos if isinstance(eos, list) else [eos]) if e is not None}
        pad = self.tokenizer.pad_token_id
        self.pad_id = pad if pad is not None else (min(self.eos_ids) if self.eos_ids else 0)
        cfg = getattr(self.model, "config", None)
        self.max_positions = int(getattr(cfg, "max_position_embeddings", 0) or 0)
        self._lock = threading.Lock()  # one generate at a time: `gagar serve` is threaded

    # ── tokens (the policy, `gagar serve`) ─────────────────────────────────────────────────────────────
    def generate(
        self,
        prompts: list[list[int]],
        *,
        max_new_tokens: int,
        temperature: float,
        top_p: float = 1.0,
        stop: list[str] | None = None,
    ) -> list[Sample]:
        """One completion per prompt (the policy's rollouts, the judge's turns)."""
        return self.sample(prompts, SamplingParams(max_new_tokens, temperature, top_p, stop=stop))

    def sample(
        self,
        prompts: list[list[int]],
        params: SamplingParams,
        *,
        on_token: OnToken | None = None,
        cancel: threading.Event | None = None,
    ) -> list[Sample]:
        """One completion per prompt under `params`; prompts are batched by similar length (less padding),
        order kept. `on_token(i, state)` sees every sampled token of prompt i as it comes (streaming); setting
        `cancel` ends the generation early. One call at a time (`gagar serve` is threaded), seeded inside the
        lock, so a seed gives the same samples whatever else the server is doing."""
        import torch

        from inference.hf_sampling import generate_rows

        order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
        out: list[Sample | None] = [None] * len(prompts)
        with self._lock:
            if params.seed is not None:
                torch.manual_seed(params.seed)
            for i in range(0, len(order), self.batch_size):
                rows = order[i : i + self.batch_size]
                got = generate_rows(self.model, self.tokenizer, [prompts[r] for r in rows], params, pad_id=self.pad_id,
                                    eos_ids=self.eos_ids, index=rows, on_token=on_token, cancel=cancel)
                for r, smp in zip(rows, got, strict=True):
                    out[r] = smp
        return [smp for smp in out if smp is not None]

    def sync_weights(self, model: Any, step: int) -> None:
        self.model = model  # same object as the trainer's: nothing to copy

    # ── chat (the judge, `gagar serve`) ─────────────────────────────────────────────────────────────────
    def encode_chat(self, messages: Messages) -> list[int]:
        """The conversation's prompt ids under the chat template, ready for the assistant's reply."""
        try:
            enc = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_dict=True)
        except Exception as exc:  # templates raise on roles or shapes they do not support
            raise BackendError(f"the chat template rejected the conversation: {exc}") from exc
        return list(enc["input_ids"])

    def chat_batch(
        self, conversations: list[Messages], *, max_new_tokens: int = 512, temperature: float = 0.0
    ) -> list[str | BackendError]:
        """Replies to many conversations in left-padded batches; errors stay with their conversation."""
        return [r if isinstance(r, BackendError) else r[0] for r in self._chat(conversations, max_new_tokens,
                                                                                  temperature)]

    def _chat(
        self, conversations: list[Messages], max_new_tokens: int, temperature: float
    ) -> list[tuple[str, int, int] | BackendError]:
        out: list[tuple[str, int, int] | BackendError] = []
        todo: list[tuple[int, list[int]]] = []
        new_tokens = max_new_tokens
        for i, msgs in enumerate(conversations):
            try:
                ids = self.encode_chat(msgs)
                if self.max_positions and len(ids) + 16 > self.max_positions:
                    raise BackendError(f"conversation of {len(ids)} tokens exceeds the model's {self.max_positions}")
            except BackendError as exc:
                out.append(exc)
                continue
            out.append(BackendError("not generated"))
            todo.append((i, ids))
            if self.max_positions:
                new_tokens = min(new_tokens, self.max_positions - len(ids))
        if todo:
            # the judge's replies keep the checkpoint's own decoding defaults for what is not set here
            samples = self.sample([ids for _, ids in todo],
                                  SamplingParams(new_tokens, temperature, model_defaults=True))
            for (i, ids), s in zip(todo, samples, strict=True):
                out[i] = (s.text, len(ids), len(s.token_ids))
        return out

    def score_continuations(
        self, requests: list[tuple[Messages, str, list[str]]]
    ) -> list[list[float] | BackendError]:
        """Log-probability of each option as the assistant's reply continuing `prefix`, per (messages, prefix,
        options) request: what grammar-constrained answers (`grader.judge.grammar`) choose by.

        Each option is tokenized with everything before it, as the model reads it, and scored from the first
        token where the options' tokenizations part: the shared part has the same probability for all of them,
        so the scores rank the whole texts. All rows of all requests go through left-padded forward batches.
        """
        rows: list[tuple[int, list[int], int]] = []  # (request, token ids, first scored position)
        out: list[list[float] | BackendError] = []
        for ri, (msgs, prefix, options) in enumerate(requests):
            try:
                head = self.tokenizer.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
            except Exception as exc:  # templates raise on roles or shapes they do not support
                out.append(BackendError(f"the chat template rejected the conversation: {exc}"))
                continue
            seqs = [list(self.tokenizer(head + prefix + o, add_special_tokens=False)["input_ids"]) for o in options]
            longest = max(map(len, seqs))
            if self.max_positions and longest > self.max_positions:
                out.append(BackendError(f"conversation of {longest} tokens exceeds the model's {self.max_positions}"))
                continue
            start = min(map(len, seqs)) - 1  # every option keeps at least one scored token
            for seq in seqs[1:]:
                start = min(start, next((k for k, (x, y) in enumerate(zip(seqs[0], seq, strict=False)) if x != y), start))
            rows += [(ri, seq, max(1, start)) for seq in seqs]
            out.append([])
        row_scores = [0.0] * len(rows)
        order = sorted(range(len(rows)), key=lambda r: len(rows[r][1]))
        for i in range(0, len(order), self.batch_size):
            chunk = order[i : i + self.batch_size]
            for r, lp in zip(chunk, self._tail_logprobs([(rows[r][1], rows[r][2]) for r in chunk]), strict=True):
                row_scores[r] = lp
        for (ri, _, _), lp in zip(rows, row_scores, strict=True):
            got = out[ri]
            if isinstance(got, list):
                got.append(lp)
        return out

    def _tail_logprobs(self, rows: list[tuple[list[int], int]]) -> list[float]:
        """Sum of log P(token) over positions start.. of each row, in one left-padded forward pass."""
        import torch

        model = self.model
        device = next(model.parameters()).device
        width = max(len(ids) for ids, _ in rows)
        keep = max(len(ids) - start for ids, start in rows) + 1  # logits for the scored tail (and the one before)
        ids = torch.full((len(rows), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for r, (seq, _) in enumerate(rows):
            ids[r, width - len(seq) :] = torch.tensor(seq, dtype=torch.long)
            mask[r, width - len(seq) :] = 1
        # Left padding shifts every row; positions count real tokens only, as they did in training.
        pos = (mask.cumsum(-1) - 1).clamp(min=0)
        with self._lock, torch.no_grad():
            was_training = model.training
            model.eval()
            try:
                logits = model(input_ids=ids.to(device), attention_mask=mask.to(device),
                               position_ids=pos.to(device), logits_to_keep=keep).logits.float()
            finally:
                model.train(was_training)
        logp = torch.log_softmax(logits, dim=-1).cpu()
        out = []
        for r, (seq, start) in enumerate(rows):
            n = len(seq) - start  # scored tokens: the last n of the row, predicted by the n positions before
            tgt = torch.tensor(seq[start:], dtype=torch.long)
            pred = logp[r, keep - 1 - n : keep - 1]
            out.append(float(pred.gather(-1, tgt[:, None]).sum()))
        return out

    def chat(self, messages: Messages, *, max_new_tokens: int = 512, temperature: float = 0.0) -> str:
        return self.chat_with_usage(messages, max_new_tokens=max_new_tokens, temperature=temperature)[0]

    def chat_with_usage(
        self, messages: Messages, *, max_new_tokens: int = 512, temperature: float = 0.0
    ) -> tuple[str, int, int]:
        """Reply text plus (prompt tokens, completion tokens), for servers that report usage."""
        [res] = self._chat([messages], max_new_tokens, temperature)
        if isinstance(res, BackendError):
            raise res
        return res
