"""vLLM in the trainer's process (the `vllm` extra, CUDA only). Imported lazily: nothing here loads without it.

The engine holds the base model; after each update the trainer's LoRA adapter is saved and handed to vLLM as a
new `LoRARequest` (vLLM loads adapters per request, so no engine restart). Full-weight training is not pushed
into an in-process engine here: use LoRA, or the openai backend with a server you restart from checkpoints.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainer.rollout.base import Sample

if TYPE_CHECKING:
    from trainer.config import TrainConfig


class VLLMBackend:
    name = "vllm"

    def __init__(self, cfg: TrainConfig, tokenizer: Any, work_dir: str, gpu_memory_utilization: float = 0.4) -> None:
        try:
            from vllm import LLM
        except ImportError as exc:
            raise RuntimeError(
                "rollout.backend=vllm needs vLLM in this environment (`pip install 'gagar[vllm]'`, CUDA only); "
                "or run `vllm serve` and use rollout.backend=openai"
            ) from exc
        if not cfg.lora.enabled:
            raise RuntimeError("rollout.backend=vllm pushes LoRA adapters only; set lora.enabled: true")
        self.llm = LLM(model=cfg.model.name_or_path, enable_lora=True, max_lora_rank=max(8, cfg.lora.r),
                       gpu_memory_utilization=gpu_memory_utilization, dtype=cfg.model.dtype, seed=cfg.seed)
        self.tokenizer = tokenizer
        self.work_dir = Path(work_dir)
        self.lora_request = None

    def generate(self, prompts: list[list[int]], *, max_new_tokens: int, temperature: float, top_p: float = 1.0,
                 stop: list[str] | None = None) -> list[Sample]:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        params = SamplingParams(max_tokens=max_new_tokens, temperature=temperature, top_p=top_p, stop=stop or None,
                                include_stop_str_in_output=True)
        outs = self.llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params,
                                 lora_request=self.lora_request, use_tqdm=False)
        samples = []
        for o in outs:
            c = o.outputs[0]
            samples.append(Sample(token_ids=list(c.token_ids), text=c.text,
                                  finish_reason="length" if c.finish_reason == "length" else "stop"))
        return samples

    def sync_weights(self, model: Any, step: int) -> None:
        from vllm.lora.request import LoRARequest

        path = (self.work_dir / "served_adapters" / f"step_{step:06d}").resolve()
        model.save_pretrained(str(path))
        # A fresh id per update: vLLM caches adapters by id, so reusing one would keep sampling stale weights.
        self.lora_request = LoRARequest(f"gagar-step-{step}", step + 1, str(path))
