"""Every litellm model id. litellm is imported lazily: it costs ~2 s and ~190 MiB."""
from __future__ import annotations

import os
import threading

from primefs.providers.base import ModelError, ModelReply, ToolCall

_import_lock = threading.Lock()
_litellm = None

# Settings that are ours, not litellm's: never passed on.
OWN_KEYS = {"model", "tool_mode", "api_key_env", "api_key_file", "provider", "script", "stream", "context_window", "workspace",
            "first_reply_grammar"}


def get_litellm():
    global _litellm
    with _import_lock:
        if _litellm is None:
            os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
            import litellm

            litellm.suppress_debug_info = True
            litellm.drop_params = True
            _litellm = litellm
    return _litellm


def _is_retryable(exc: Exception) -> bool:
    status = getattr(exc, "status_code", None)
    if status in (400, 401, 403, 404) or type(exc).__name__ in ("AuthenticationError", "PermissionDeniedError",
                                                                  "NotFoundError", "BadRequestError",
                                                                  "ContextWindowExceededError"):
        return False  # a wrong key, model or request, a prompt over the window: trying again cannot help
    # errors raised before any request was sent (bad arguments) are not retried either
    return not isinstance(exc, (TypeError, ValueError)) or status is not None


class LiteLLMProvider:
    name = "litellm"

    def matches(self, model_id: str) -> bool:
        return True

    def complete(self, messages: list[dict], tools: list[dict] | None, settings: dict) -> ModelReply:
        litellm = get_litellm()
        # keys starting with "_" are the gateway's (cancel event, progress, timeouts), never litellm's
        kwargs = {k: v for k, v in settings.items() if k not in OWN_KEYS and not k.startswith("_") and v is not None}
        if settings.get("_timeout_s"):  # the HTTP client gives up too, a little after the gateway stopped waiting
            kwargs.setdefault("timeout", 5 + (settings["_idle_timeout_s"] if settings.get("stream") else settings["_timeout_s"]))
        if settings.get("api_key_env"):
            key = os.environ.get(settings["api_key_env"])
            if key is None:
                raise ModelError(f"environment variable {settings['api_key_env']} (api_key_env) is not set",
                                 retryable=False)
            kwargs["api_key"] = key
        if settings.get("api_key_file"):
            from primefs.errors import PrimefsError
            from primefs.providers.models import key_from_file

            try:
                kwargs["api_key"] = key_from_file(settings["api_key_file"])
            except PrimefsError as exc:
                raise ModelError(str(exc), retryable=False) from None
        if tools:
            kwargs["tools"] = tools
        kwargs.setdefault("num_retries", 0)  # the loop retries with its own backoff and records it
        model = settings["model"]
        try:
            if settings.get("stream"):
                response = litellm.stream_chunk_builder(self._chunks(litellm, model, messages, kwargs, settings),
                                                        messages=messages)
            else:
                response = litellm.completion(model=model, messages=messages, **kwargs)
        except Exception as exc:  # litellm maps provider errors to its own exception types
            raise ModelError(f"{type(exc).__name__}: {exc}", retryable=_is_retryable(exc)) from exc
        return _to_reply(litellm, response, model)


    def count_tokens(self, messages: list[dict], settings: dict) -> int:
        """The prompt's tokens as litellm counts them for this model (its tokenizer where it knows the
        model, else tiktoken's)."""
        return int(get_litellm().token_counter(model=settings["model"], messages=messages))

    @staticmethod
    def _chunks(litellm, model, messages, kwargs, settings) -> list:
        """A streamed reply's chunks; stops (closing the stream) when the gateway cancels the call."""
        cancel, progress = settings.get("_cancel"), settings.get("_progress")
        stream = litellm.completion(model=model, messages=messages, stream=True,
                                    stream_options={"include_usage": True}, **kwargs)
        chunks = []
        try:
            for chunk in stream:
                chunks.append(chunk)
                if progress:
                    progress(_text_of(chunk))
                if cancel is not None and cancel.is_set():
                    raise ModelError("the model call was cancelled", retryable=False)
        finally:
            close = getattr(stream, "close", None) or getattr(getattr(stream, "completion_stream", None), "close", None)
            if close:
                try:
                    close()
                except Exception:  # noqa: BLE001 - closing is best effort
                    pass
        return chunks


def _text_of(chunk) -> str:
    try:
        return chunk.choices[0].delta.content or ""
    except (AttributeError, IndexError, TypeError):
        return ""


def _to_reply(litellm, response, model: str) -> ModelReply:
    message = response.choices[0].message
    calls = [ToolCall(id=c.id or f"call_{i}", name=c.function.name or "", arguments=c.function.arguments or "")
             for i, c in enumerate(message.tool_calls or [])]
    usage = getattr(response, "usage", None)
    cost, known = _cost(litellm, response)
    return ModelReply(
        text=message.content or "",
        tool_calls=calls,
        input_tokens=int(getattr(usage, "prompt_tokens", 0) or 0),
        output_tokens=int(getattr(usage, "completion_tokens", 0) or 0),
        **_cache_tokens(usage),
        cost_usd=cost,
        cost_known=known,
        model=getattr(response, "model", None) or model,
    )


def _cost(litellm, response) -> tuple[float, bool]:
    """(cost in USD, whether litellm knows the model's price). litellm prices every response as it builds it
    (`_hidden_params["response_cost"]`, None for a model it has no price for, cached tokens priced as such):
    pricing it again costs ~1 ms a call, more for an unknown model (a failed lookup is never cached)."""
    hidden = getattr(response, "_hidden_params", None) or {}
    if "response_cost" in hidden:
        cost = hidden["response_cost"]
        return (float(cost), True) if isinstance(cost, (int, float)) else (0.0, False)
    try:
        return float(litellm.completion_cost(completion_response=response) or 0.0), True
    except Exception:  # unknown model: no price; counted as 0 and marked unknown
        return 0.0, False


def _cache_tokens(usage) -> dict:
    """Cached prompt tokens as litellm reports them: `prompt_tokens_details` (OpenAI's `cached_tokens`;
    litellm puts Anthropic's and DeepSeek's there too), else Anthropic's own fields. Priced by
    completion_cost already (the model map's cache_read/cache_creation prices)."""
    details = getattr(usage, "prompt_tokens_details", None)

    def first(*values) -> int:
        return next((int(v) for v in values if isinstance(v, (int, float)) and v > 0), 0)

    return {"cache_read_tokens": first(getattr(details, "cached_tokens", None),
                                       getattr(usage, "cache_read_input_tokens", None)),
            "cache_write_tokens": first(getattr(details, "cache_write_tokens", None),
                                        getattr(details, "cache_creation_tokens", None),
                                        getattr(usage, "cache_creation_input_tokens", None))}
