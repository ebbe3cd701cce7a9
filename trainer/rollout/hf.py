"""transformers `generate` on the training model itself (CPU or GPU): no weight push is ever needed."""

from __future__ import annotations

from typing import Any

import torch

from trainer.rollout.base import Sample


class TransformersBackend:
    name = "transformers"

    def __init__(self, model: Any, tokenizer: Any, batch_size: int = 16) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.batch_size = batch_size
        eos = model.generation_config.eos_token_id if model.generation_config is not None else None
        eos = eos if eos is not None else tokenizer.eos_token_id
        self.eos_ids = set(eos if isinstance(eos, list) else [eos])
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else next(iter(self.eos_ids))

    @torch.no_grad()
    def generate(
        self,
        prompts: list[list[int]],
        *,
        max_new_tokens: int,
        temperature: float,
        top_p: float = 1.0,
        stop: list[str] | None = None,
    ) -> list[Sample]:
        out: list[Sample] = []
        for i in range(0, len(prompts), self.batch_size):
            out += self._batch(prompts[i : i + self.batch_size], max_new_tokens, temperature, top_p, stop)
        return out

    def _batch(self, prompts, max_new_tokens, temperature, top_p, stop) -> list[Sample]:
        model = self.model
        device = next(model.parameters()).device
        width = max(len(p) for p in prompts)
        # Left padding so every row's completion starts at the same column.
        ids = torch.full((len(prompts), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for r, p in enumerate(prompts):
            ids[r, width - len(p) :] = torch.tensor(p)
            mask[r, width - len(p) :] = 1
        was_training = model.training
        model.eval()
        try:
            kwargs: dict[str, Any] = {
                "input_ids": ids.to(device),
                "attention_mask": mask.to(device),
                "max_new_tokens": max_new_tokens,
                "pad_token_id": self.pad_id,
                "eos_token_id": sorted(self.eos_ids),
            }
            if temperature > 0:
                kwargs.update(do_sample=True, temperature=temperature, top_p=top_p, top_k=0)
            else:
                kwargs.update(do_sample=False)
            if stop:
                kwargs.update(stop_strings=stop, tokenizer=self.tokenizer)
            gen = model.generate(**kwargs)
        finally:
            model.train(was_training)
        samples = []
        for row in gen[:, width:].tolist():
            toks: list[int] = []
            finish = "length"
            for t in row:
                toks.append(t)
                if t in self.eos_ids:
                    finish = "stop"
                    break
            # Rows that finished early (stop string) are padded; a stop string leaves no eos token.
            while toks and toks[-1] == self.pad_id and self.pad_id not in self.eos_ids:
                toks.pop()
                finish = "stop"
            text = self.tokenizer.decode(toks, skip_special_tokens=True, clean_up_tokenization_spaces=False)
            if finish == "length" and stop and any(text.rstrip().endswith(s) for s in stop):
                finish = "stop"
            samples.append(Sample(token_ids=toks, text=text, finish_reason=finish))
        return samples

    def sync_weights(self, model: Any, step: int) -> None:
        self.model = model  # same object as the trainer's: nothing to copy
