"""Model providers: the runner's only way to reach a model."""
from primefs.providers.base import ModelError, ModelReply, ToolCall

__all__ = ["ModelError", "ModelReply", "ToolCall"]
