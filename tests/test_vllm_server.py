"""`vllm serve` as the product runs it (`rollout.backend: vllm-server`, `grader.backend: vllm-server`): started on
127.0.0.1 with the engine spec's flags, health-checked, sampled through the policy's token-id client, handed a LoRA
adapter at run time, and stopped with every process it started — also after it died under a request, which is an
error naming its exit and its log. A busy port or a missing model is refused before anything starts."""

from __future__ import annotations

import os
import signal
import socket
import time
import urllib.request

import psutil
import pytest

from inference.vllm import EngineError, EngineSpec
from inference.vllm_server import LOG_NAME, VLLMServer, port_free


def _group_gone(pgid: int, within: float = 30.0) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        alive = [p for p in psutil.process_iter(["pid"]) if _pgid(p.pid) == pgid and
                 p.status() != psutil.STATUS_ZOMBIE]
        if not alive:
            return True
        time.sleep(0.5)
    return False


def _pgid(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except (ProcessLookupError, PermissionError):
        return None


def test_a_busy_port_is_refused_before_anything_starts(tmp_path):
    from model_fixtures import smol_base

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        server = VLLMServer(EngineSpec(model=str(smol_base())), tmp_path, port=port)
        with pytest.raises(ValueError, match=f"port {port} on 127.0.0.1 is already in use"):
            server.start()
        assert server.proc is None and not (tmp_path / LOG_NAME).exists()


def test_a_missing_model_is_refused_before_anything_starts(tmp_path):
    server = VLLMServer(EngineSpec(model=str(tmp_path / "nope")), tmp_path)
    with pytest.raises(ValueError, match="no such model directory"):
        server.start()
    assert server.proc is None


@pytest.mark.slow
def test_served_engine_samples_takes_an_adapter_and_is_stopped_with_its_children(tmp_path):
    """One server for the whole story (starting one takes about a minute here)."""
    from model_fixtures import smol_base
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from trainer.rollout.openai_server import OpenAIServerBackend

    smol = str(smol_base())
    tok = AutoTokenizer.from_pretrained(smol)
    server = VLLMServer(EngineSpec(model=smol, max_lora_rank=8), tmp_path).start()
    pgid = server.proc.pid
    be = OpenAIServerBackend(server.url, server.model, tok, str(tmp_path), server=server)
    try:
        assert server.port and not port_free(server.port)
        with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/health", timeout=10) as r:
            assert r.status == 200
        prompt = list(tok.apply_chat_template([{"role": "user", "content": "Say hi."}], add_generation_prompt=True,
                                              return_dict=True)["input_ids"])
        samples = be.generate([prompt] * 4, max_new_tokens=12, temperature=1.0)
        assert len(samples) == 4 and all(s.token_ids and len(s.logprobs) == len(s.token_ids) for s in samples)
        # an adapter at run time (PEFT's initialisation: B = 0, so it changes nothing but its name)
        adapter = get_peft_model(AutoModelForCausalLM.from_pretrained(smol),
                                 LoraConfig(r=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM"))
        be.sync_weights(adapter, step=1)
        assert be.model == "gagar-step-1"
        assert be.generate([prompt], max_new_tokens=4, temperature=1.0)[0].token_ids
        assert "--enable-lora" in (tmp_path / LOG_NAME).read_text()  # the server logs under the run dir
        # the server dies under the run: an error naming how and where its log is, not a connection error
        os.killpg(pgid, signal.SIGKILL)
        time.sleep(1.0)
        with pytest.raises(EngineError, match=f"(?s)killed by signal 9.*{LOG_NAME}.*--resume"):
            be.generate([prompt], max_new_tokens=4, temperature=1.0)
    finally:
        be.close()
    assert server.proc is None and _group_gone(pgid)
    assert port_free(server.port)


@pytest.mark.slow
def test_the_judge_chats_with_a_served_adapter_and_close_stops_everything(tmp_path):
    """`grader.backend: vllm-server`: the judge's adapter is served as `judge`; closing the backend ends the API
    server and its engine processes (SIGTERM to the group, nothing left)."""
    from model_fixtures import smol_base
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from inference.backends import close_backend, make_backend

    smol = str(smol_base())
    get_peft_model(AutoModelForCausalLM.from_pretrained(smol),
                   LoraConfig(r=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")).save_pretrained(
        str(tmp_path / "judge-adapter"))
    judge = make_backend("vllm-server", smol, adapter=str(tmp_path / "judge-adapter"), work_dir=str(tmp_path))
    server = judge.server
    pgid = server.proc.pid
    try:
        members = [p for p in psutil.process_iter(["pid"]) if _pgid(p.pid) == pgid]
        assert len(members) >= 2  # the API server and at least its engine core
        assert judge.model == "judge" and judge.name.endswith("+judge-adapter")
        assert isinstance(judge.chat([{"role": "user", "content": "Say hi."}], max_new_tokens=8), str)
    finally:
        close_backend(judge)
    assert _group_gone(pgid) and port_free(server.port)
    assert "--lora-modules" in (tmp_path / LOG_NAME).read_text()
