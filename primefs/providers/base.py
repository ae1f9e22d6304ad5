"""What every provider returns, independent of where the reply came from."""
from __future__ import annotations

from dataclasses import dataclass, field

from primefs.store.history import mend_surrogates


class ModelError(Exception):
    """A model call failed. ``retryable`` says whether trying again may help."""

    def __init__(self, message: str, retryable: bool = True):
        super().__init__(message)
        self.retryable = retryable


@dataclass
class ToolCall:
    id: str
    name: str
    arguments: str  # JSON text, as the model wrote it


@dataclass
class ModelReply:
    text: str
    tool_calls: list[ToolCall] = field(default_factory=list)
    input_tokens: int = 0  # every prompt token, the cached ones too (as litellm's prompt_tokens)
    output_tokens: int = 0
    cache_read_tokens: int = 0  # of input_tokens: read from the provider's prompt cache
    cache_write_tokens: int = 0  # of input_tokens: written to it (priced apart by some providers)
    cost_usd: float = 0.0
    cost_known: bool = False  # False: the provider had no price for this model; cost counted as 0
    model: str = ""

    def __post_init__(self):
        # A server's JSON may hold lone surrogates (\ud800), which no file or later request can: U+FFFD
        self.text = mend_surrogates(self.text)
        for call in self.tool_calls:
            call.arguments = mend_surrogates(call.arguments)


# The single tool the model is offered (OpenAI function-calling format).
PYTHON_TOOL = {
    "type": "function",
    "function": {
        "name": "python",
        "description": "Run Python code in your persistent IPython kernel and see its output.",
        "parameters": {
            "type": "object",
            "properties": {"code": {"type": "string", "description": "Python code to run."}},
            "required": ["code"],
        },
    },
}
