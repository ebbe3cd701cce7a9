"""Sampling from an OpenAI-compatible server (e.g. `vllm serve MODEL --enable-lora`).

Prompts go to `/v1/completions` as token ids (vLLM accepts them), so the server continues exactly the
conversation the trainer tokenised; the completion comes back as the token ids the server *sampled* (vLLM's
`return_token_ids`, or `logprobs` with `return_tokens_as_token_ids`, which gives `token_id:N` strings; `gagar
serve` answers both). Re-tokenising the returned text would not do: a sampled sequence is often not the
tokenizer's canonical encoding of its text, and then the trainer would score (and train on) tokens the policy
never produced. After each update the LoRA adapter is saved where the server can read it
(a shared path) and loaded with vLLM's runtime endpoint `/v1/load_lora_adapter` (start the server with
`VLLM_ALLOW_RUNTIME_LORA_UPDATING=True`); the next requests name that adapter as their model.
The sampler's own log-prob of each sampled token (`logprobs.token_logprobs`) comes back with the sample: the
update corrects the sampler-vs-trainer mismatch with it (truncated importance sampling, `optim.tis_cap`). Those
must be taken under the distribution sampled from (after temperature: vLLM's and gagar serve's
`--logprobs-mode processed_logprobs`); raw ones make every ratio wrong at a temperature other than 1. Before the
first batch at such a temperature the server is asked twice for the first token's top log-probs of one prompt
(at the rollout temperature and at 1): under a temperature the gaps between tokens' log-probs scale by 1/T, raw
ones do not move, so a raw server is refused with the flag to set (`check_logprobs`).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from inference.base import Sample
from inference.openai import api_url, describe_error, make_client


class OpenAIServerBackend:
    name = "openai"

    def __init__(self, base_url: str, model: str, tokenizer: Any, work_dir: str, *, lora: bool = True,
                 timeout: float = 600.0, concurrency: int = 16, max_retries: int = 2, server: Any = None,
                 check_logprobs: bool = True) -> None:
        self.base_url = api_url(base_url)
        self.client = make_client(base_url, timeout=timeout, max_retries=max_retries)
        self.base_model = model
        self.model = model
        self.tokenizer = tokenizer
        self.work_dir = Path(work_dir)
        self.lora = lora
        self.concurrency = concurrency
        self.check_logprobs = check_logprobs  # the update uses the sampler's log-probs (optim.tis_cap set)
        self._checked: set[float] = set()
        # rollout.backend vllm-server: the `vllm serve` this backend owns (inference.vllm_server.VLLMServer)
        self.server = server

    def close(self) -> None:
        """Stop the server this backend started (vllm-server); a server you run is left alone."""
        if self.server is not None:
            self.server.stop()
            self.server = None

    def _fail(self, exc: Exception) -> RuntimeError:
        import openai

        if self.server is not None:
            self.server.check()  # a server that died: its exit code and log, not a connection error

        if isinstance(exc, openai.APIConnectionError) and not isinstance(exc, openai.APITimeoutError):
            return RuntimeError(f"cannot reach the rollout server at {self.base_url}: {exc.__cause__ or exc}")
        return RuntimeError(describe_error(exc, self.base_url))

    def _post(self, path: str, payload: dict) -> Any:
        """One of vLLM's own endpoints (`/load_lora_adapter`, …), through the same client and retries."""
        import openai

        try:
            return self.client.post(path, body=payload, cast_to=object)
        except openai.OpenAIError as exc:
            raise self._fail(exc) from exc

    def _one(self, prompt: list[int], max_new_tokens: int, temperature: float, top_p: float,
             stop: list[str] | None) -> Sample:
        import openai

        extra = {"skip_special_tokens": True, "return_token_ids": True, "return_tokens_as_token_ids": True}
        if stop:
            extra["include_stop_str_in_output"] = True
        try:
            reply = self.client.completions.create(model=self.model, prompt=prompt, max_tokens=max_new_tokens,
                                                   temperature=temperature, top_p=top_p, n=1, logprobs=1,
                                                   stop=stop or openai.omit, extra_body=extra)
        except openai.OpenAIError as exc:
            raise self._fail(exc) from exc
        if not reply.choices:
            raise RuntimeError(f"{self.base_url}/completions: a reply without choices")
        choice = reply.choices[0].model_dump()
        text = choice.get("text") or ""
        # Exactly the tokens the server says it sampled: nothing appended (an eos it does not list was never
        # shown to be sampled, and training on it would train on a token the policy may not have produced).
        ids = sampled_token_ids(choice, self.base_url)
        finish = "length" if choice.get("finish_reason") == "length" else "stop"
        return Sample(token_ids=ids, text=text, finish_reason=finish, logprobs=sampled_logprobs(choice, len(ids)))

    def _first_token_logprobs(self, prompt: list[int], temperature: float) -> dict[str, float]:
        import openai

        try:
            reply = self.client.completions.create(model=self.model, prompt=prompt, max_tokens=1, n=1, seed=0,
                                                   logprobs=LOGPROB_PROBE_K, temperature=temperature, top_p=1.0,
                                                   extra_body={"return_tokens_as_token_ids": True})
        except openai.OpenAIError as exc:
            raise self._fail(exc) from exc
        tops = ((reply.choices[0].model_dump().get("logprobs") or {}).get("top_logprobs") or [None])[0] \
            if reply.choices else None
        return {str(k): float(v) for k, v in (tops or {}).items() if isinstance(v, (int, float))}

    def _check_processed(self, prompt: list[int], temperature: float) -> None:
        """Refuse a server that reports raw log-probs while sampling at `temperature` (see the module doc)."""
        if not self.check_logprobs or temperature in (0.0, 1.0) or temperature in self._checked:
            return
        at_t, at_1 = self._first_token_logprobs(prompt, temperature), self._first_token_logprobs(prompt, 1.0)
        if logprobs_look_raw(at_t, at_1, temperature):
            raise RuntimeError(
                f"the rollout server at {self.base_url} reports raw log-probs (the model's distribution before "
                f"temperature {temperature}), but the update's importance correction (optim.tis_cap) needs the "
                "log-probs of the distribution sampled from: start it with `--logprobs-mode processed_logprobs` "
                "(vllm serve and gagar serve), or set optim.tis_cap: null to train without the correction")
        self._checked.add(temperature)

    def generate(self, prompts: list[list[int]], *, max_new_tokens: int, temperature: float, top_p: float = 1.0,
                 stop: list[str] | None = None) -> list[Sample]:
        if prompts:
            self._check_processed(prompts[0], temperature)
        with ThreadPoolExecutor(max_workers=self.concurrency) as pool:
            return list(pool.map(lambda p: self._one(p, max_new_tokens, temperature, top_p, stop), prompts))

    def sync_weights(self, model: Any, step: int) -> None:
        if not self.lora:
            raise RuntimeError("the openai rollout backend can only receive LoRA adapters; set lora.enabled: true")
        path = (self.work_dir / "served_adapters" / f"step_{step:06d}").resolve()
        model.save_pretrained(str(path))
        name = f"gagar-step-{step}"
        self._post("/load_lora_adapter", {"lora_name": name, "lora_path": str(path)})
        if self.model != self.base_model:
            try:
                self._post("/unload_lora_adapter", {"lora_name": self.model})
            except RuntimeError:
                pass  # an adapter the server already dropped is not worth failing a run over
        self.model = name


LOGPROB_PROBE_K = 20  # vLLM's default --max-logprobs


def logprobs_look_raw(at_t: dict[str, float], at_1: dict[str, float], temperature: float) -> bool:
    """True when one position's top log-probs asked at `temperature` (`at_t`) are the raw ones (`at_1`, asked at
    temperature 1): the gaps to the best token are unchanged instead of scaled by 1/T. Normalisation cancels in
    the gaps, so only the two hypotheses are compared; ties and noise (gaps that T barely moves) say nothing."""
    common = [k for k in at_t if k in at_1 and at_t[k] > -1000 and at_1[k] > -1000]
    if len(common) < 2:
        return False
    best = max(common, key=lambda k: at_1[k])
    ga = [at_t[k] - at_t[best] for k in common]
    gb = [at_1[k] - at_1[best] for k in common]
    err_raw = max(abs(a - b) for a, b in zip(ga, gb, strict=True))
    err_processed = max(abs(a - b / temperature) for a, b in zip(ga, gb, strict=True))
    return err_processed > 0.05 and err_processed > 3 * err_raw


def sampled_logprobs(choice: dict, n: int) -> list[float] | None:
    """The sampler's log-prob of each sampled token (`logprobs.token_logprobs`), or None when the server gives
    none for some token or a count that does not match the ids. vLLM and `gagar serve` report them under the
    sampling distribution with `--logprobs-mode processed_logprobs` (gagar serve's default; docs/trainer.md)."""
    lps = (choice.get("logprobs") or {}).get("token_logprobs")
    if isinstance(lps, list) and len(lps) == n and all(isinstance(x, (int, float)) for x in lps):
        return [float(x) for x in lps]
    return None


def sampled_token_ids(choice: dict, where: str) -> list[int]:
    """The completion's sampled token ids from an OpenAI-compatible completion choice: vLLM's `token_ids`
    (`return_token_ids`), else `logprobs.tokens` as `token_id:N` strings (`return_tokens_as_token_ids`)."""
    ids = choice.get("token_ids")
    if isinstance(ids, list) and all(isinstance(i, int) for i in ids):
        return list(ids)
    tokens = (choice.get("logprobs") or {}).get("tokens")
    if isinstance(tokens, list) and all(isinstance(t, str) and t.startswith("token_id:") for t in tokens):
        return [int(t.split(":", 1)[1]) for t in tokens]
    raise RuntimeError(f"{where}/completions returned no sampled token ids; the trainer needs them (re-tokenised "
                       "text is not what the policy sampled). Use a server that honours `return_token_ids` or "
                       "`logprobs` with `return_tokens_as_token_ids` (vLLM >= 0.5, gagar serve)")
