"""Compaction: when the next prompt would be too long, older turns become a model-written summary.

The original events stay in history.jsonl; a `compaction` event records what it replaced (every
message-producing event with n <= `upto_n`) and the summary. The last turns stay verbatim, and a
cut is only made where a turn or a step begins, never between a code cell and its output. Kernel
variables are untouched: the kernel is the same.
"""
from __future__ import annotations

from primefs.runner.gateway import cautious_tokens
from primefs.store.conversation import rebuild, to_messages
from primefs.store.history import since_compaction

# Events where a cut may begin the kept tail: user input, or a new step (an assistant reply with
# the cells that follow it). Never a cell: it belongs to the reply before it.
CUT_BEFORE = ("task", "message", "notice", "assistant")

SUMMARY_PROMPT = """You are compacting your own working memory. Below is the earlier part of your session. \
Write a summary that lets you continue without it: the task, what you did and found (exact numbers, names, \
file paths, variable names in your kernel), what failed, and what is left to do. Your kernel and its \
variables still exist. Be complete but brief; plain text.

{transcript}"""


def context_window(settings: dict) -> int | None:
    """The model's input window: the alias's `context_window`, else litellm's model info, else unknown."""
    if settings.get("context_window"):
        return int(settings["context_window"])
    model = settings["model"]
    if model.split("/")[0] == "local":
        return 8192
    if model.startswith("scripted/") or settings.get("provider") == "scripted":
        return None
    try:
        from primefs.providers.litellm_provider import get_litellm

        info = get_litellm().get_model_info(model)
        return int(info.get("max_input_tokens") or info.get("max_tokens") or 0) or None
    except Exception:  # unknown to litellm: no automatic compaction (set limits.compact_at_tokens)
        return None


def threshold(agent) -> int | None:
    configured = agent.limits.compact_at_tokens
    if configured:
        return configured
    window = context_window(agent.settings)
    return int(window * 0.75) if window else None


def _transcript(events: list[dict]) -> str:
    lines = []
    for e in events:
        for m in to_messages(e, "fenced"):
            lines.append(f"{m['role']}: {m['content']}")
        if e["type"] == "compaction":
            lines.append(f"(summary of earlier work) {e['summary']}")
    return "\n\n".join(lines)


def maybe_compact(agent, system: str) -> bool:
    """Compact if the next prompt would exceed the threshold (counted by the model's tokenizer where
    there is one; only when a cautious estimate says it may: most steps cost no count). True if it did."""
    limit = threshold(agent)
    prompt = [{"role": "system", "content": system}, *agent.messages]
    if not limit or cautious_tokens(prompt) <= limit or agent.gateway.prompt_tokens(agent.settings, prompt) <= limit:
        return False
    last, tail = since_compaction(agent.session.history.path)
    live = [e for e in tail if e["type"] != "compaction"]
    # the kept tail: the longest suffix starting at a cut point that fits in half of what the system
    # prompt leaves, but always at least the last step
    budget = (limit - cautious_tokens([{"role": "system", "content": system}])) // 2
    cuts = [i for i, e in enumerate(live) if e["type"] in CUT_BEFORE]
    if len(cuts) < 2:
        return False  # nothing older than the current step to replace
    keep_from = cuts[-1]
    for i in reversed(cuts[1:]):
        tail = [m for e in live[i:] for m in to_messages(e, agent.tool_mode)]
        if cautious_tokens(tail) > budget:
            break
        keep_from = i
    old = live[:keep_from]
    if not any(to_messages(e, agent.tool_mode) for e in old):
        return False
    transcript = _transcript(([last] if last else []) + old)
    reply = agent.complete([{"role": "user", "content": SUMMARY_PROMPT.format(transcript=transcript)}],
                           purpose="compaction")
    before = agent.gateway.prompt_tokens(agent.settings, [{"role": "system", "content": system}, *agent.messages])
    event = agent.session.history.append(
        "compaction", upto_n=old[-1]["n"], replaced=len(old), kept_from_n=live[keep_from]["n"],
        summary=reply.text or "", tokens_before=before)
    agent.messages = rebuild(since_compaction(agent.session.history.path)[1], agent.tool_mode)
    # a message id repeats only soon after a crash (runner/postoffice.py): those of the summarized part need
    # not be kept, so the set stays the size of the conversation for the session's whole life
    agent.seen_ids.difference_update(e.get("id") for e in old if e["type"] == "message")
    done = agent.session.history.append("compaction_done", n_compaction=event["n"],
                                        tokens_after=agent.gateway.prompt_tokens(
                                            agent.settings, [{"role": "system", "content": system}, *agent.messages]))
    if agent.hooks is not None:
        agent.hooks.fire("after_compaction", agent.session, done)
    return True
