"""vLLM in-process (the `vllm` extra, CUDA only): the judge's chat engine and the policy's sampler.

The only module that imports vllm, and lazily. A LoRA adapter is passed per request (`LoRARequest`): the judge's
trained adapter, or the policy's adapter saved after each update — a fresh id per update, because vLLM caches
adapters by id and reusing one would keep sampling stale weights. Full-weight policy training is not pushed
into an in-process engine: use LoRA, or the openai backend with a server restarted from checkpoints.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from inference.base import BackendError, Messages, Sample, one_token_options, option_rows

_MISSING = (
    "the vllm backend needs vLLM (CUDA only): install it in its own environment with "
    "`pip install 'gagar[vllm]'`, or run `vllm serve` and use the openai backend"
)


def _sampled_logprobs(ids: list[int], per_position: Any) -> list[float] | None:
    """vLLM's per-position {token id: Logprob} → the sampled tokens' log-probs (None when absent)."""
    if not per_position or len(per_position) != len(ids):
        return None
    try:
        return [float(pos[t].logprob) for t, pos in zip(ids, per_position, strict=True)]
    except (KeyError, TypeError, AttributeError):
        return None


class VLLMBackend:
    name = "vllm"

    def __init__(
        self,
        model: str,
        adapter: str | None = None,
        *,
        tokenizer: Any = None,
        work_dir: str | None = None,
        **engine_kwargs: Any,
    ) -> None:
        try:
            from vllm import LLM
        except ImportError as exc:
            raise ImportError(_MISSING) from exc
        if adapter:
            engine_kwargs.setdefault("enable_lora", True)
        self.llm = LLM(model=model, **engine_kwargs)
        self.tokenizer = tokenizer
        self.work_dir = Path(work_dir) if work_dir else None
        self.lora_request = None
        if adapter:
            from vllm.lora.request import LoRARequest

            self.lora_request = LoRARequest("judge", 1, str(adapter))
        self.name = os.path.basename(model.rstrip("/")) + (
            f"+{os.path.basename(str(adapter).rstrip('/'))}" if adapter else ""
        )

    @classmethod
    def for_policy(cls, model: str, *, lora_rank: int, dtype: str, seed: int, tokenizer: Any, work_dir: str,
                   gpu_memory_utilization: float = 0.4) -> VLLMBackend:
        """The policy's sampler: LoRA enabled (adapters arrive through `sync_weights`), sharing the GPU. `model`
        is the base the trainer's adapter sits on — a warm-started or resumed base, not the configured name.
        Log-probs are reported after temperature and top-p (`processed_logprobs`): the distribution sampled."""
        return cls(model, tokenizer=tokenizer, work_dir=work_dir, enable_lora=True, max_lora_rank=max(8, lora_rank),
                   gpu_memory_utilization=gpu_memory_utilization, dtype=dtype, seed=seed,
                   logprobs_mode="processed_logprobs")

    # ── tokens (the policy) ──────────────────────────────────────────────────────────────────────────────
    def generate(self, prompts: list[list[int]], *, max_new_tokens: int, temperature: float, top_p: float = 1.0,
                 stop: list[str] | None = None) -> list[Sample]:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        # logprobs=0: the sampled token's own log-prob only (no alternatives)
        params = SamplingParams(max_tokens=max_new_tokens, temperature=temperature, top_p=top_p, stop=stop or None,
                                include_stop_str_in_output=True, logprobs=0)
        outs = self.llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params,
                                 lora_request=self.lora_request, use_tqdm=False)
        samples = []
        for o in outs:
            c = o.outputs[0]
            ids = list(c.token_ids)
            samples.append(Sample(token_ids=ids, text=c.text, logprobs=_sampled_logprobs(ids, c.logprobs),
                                  finish_reason="length" if c.finish_reason == "length" else "stop"))
        return samples

    def sync_weights(self, model: Any, step: int) -> None:
        from vllm.lora.request import LoRARequest

        if self.work_dir is None:
            raise RuntimeError("sync_weights needs the backend's work_dir (where adapters are saved)")
        path = (self.work_dir / "served_adapters" / f"step_{step:06d}").resolve()
        model.save_pretrained(str(path))
        self.lora_request = LoRARequest(f"gagar-step-{step}", step + 1, str(path))

    # ── chat (the judge) ────────────────────────────────────────────────────────────────────────────────
    def chat_batch(
        self, conversations: list[Messages], *, max_new_tokens: int = 512, temperature: float = 0.0
    ) -> list[str | BackendError]:
        """All conversations in one `LLM.chat` call: vLLM schedules them as one continuous batch."""
        from vllm import SamplingParams

        params = SamplingParams(max_tokens=max_new_tokens, temperature=temperature)
        try:
            outputs = self.llm.chat(conversations, params, lora_request=self.lora_request, use_tqdm=False)
        except ValueError as exc:  # e.g. a prompt longer than the model's context
            if len(conversations) == 1:
                return [BackendError(str(exc))]
            return [r for c in conversations for r in self.chat_batch([c], max_new_tokens=max_new_tokens,
                                                                       temperature=temperature)]
        return [o.outputs[0].text for o in outputs]

    def score_continuations(
        self, requests: list[tuple[Messages, str, list[str]]]
    ) -> list[list[float] | BackendError]:
        """Log-probability of each option as the assistant's reply continuing `prefix` (the contract of
        `TransformersBackend.score_continuations`), from prompt log-probs; nothing is sampled. Options that are
        one token after a shared part (the scoring judge's "A"/"B") are read from one request's next-token
        log-probs of exactly those ids (`logprob_token_ids`); others from the prompt log-probs of the option's
        own tokens (`prompt_logprobs`, one request per option: the shared part is a prefix-cache hit)."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        tok = self.llm.get_tokenizer()
        # temperature 1, no top-p/top-k: the one token sampled is not used, and the log-probs are the model's own
        # whether the engine reports raw or processed ones (an engine shared with the policy reports processed)
        plain = {"max_tokens": 1, "temperature": 1.0, "top_p": 1.0, "top_k": 0, "detokenize": False}
        out: list[list[float] | BackendError] = []
        jobs: list[tuple[int, Any, SamplingParams, Any]] = []  # (request, prompt, params, what to read)
        for ri, (msgs, prefix, options) in enumerate(requests):
            try:
                seqs, start = option_rows(tok, msgs, prefix, options)
            except BackendError as exc:
                out.append(exc)
                continue
            out.append([])
            one = one_token_options(seqs, start)
            if one is not None:
                params = SamplingParams(**plain, logprob_token_ids=one)
                jobs.append((ri, TokensPrompt(prompt_token_ids=seqs[0][:start]), params, one))
            else:
                for seq in seqs:
                    params = SamplingParams(**plain, prompt_logprobs=0)
                    jobs.append((ri, TokensPrompt(prompt_token_ids=seq), params, (seq, start)))
        for (ri, _, _, want), got in zip(jobs, self._generate_each([(p, sp) for _, p, sp, _ in jobs]), strict=True):
            if isinstance(out[ri], BackendError):
                continue
            if isinstance(got, BackendError):
                out[ri] = got
                continue
            try:
                if isinstance(want, list):  # one token per option: the first step's log-probs of those ids
                    step = got.outputs[0].logprobs[0]
                    out[ri].extend(float(step[t].logprob) for t in want)
                else:
                    seq, start = want
                    out[ri].append(sum(float(got.prompt_logprobs[k][seq[k]].logprob) for k in range(start, len(seq))))
            except (IndexError, KeyError, TypeError, AttributeError) as exc:
                out[ri] = BackendError(f"vLLM returned no log-probability for an option: {exc!r}")
        return out

    def _generate_each(self, jobs: list[tuple[Any, Any]]) -> list[Any]:
        """`LLM.generate` on all (prompt, params) at once; if vLLM refuses the batch (a prompt longer than the
        model's context), one at a time, so only the bad one becomes a BackendError."""
        if not jobs:
            return []
        try:
            return list(self.llm.generate([p for p, _ in jobs], [sp for _, sp in jobs],
                                          lora_request=self.lora_request, use_tqdm=False))
        except ValueError as exc:
            if len(jobs) == 1:
                return [BackendError(str(exc))]
            return [r for job in jobs for r in self._generate_each([job])]

    def chat(self, messages: Messages, *, max_new_tokens: int = 512, temperature: float = 0.0) -> str:
        [res] = self.chat_batch([messages], max_new_tokens=max_new_tokens, temperature=temperature)
        if isinstance(res, BackendError):
            raise res
        return res
