"""`primefs eval --mode direct`: the baseline an RLM is measured against.

Each item is one model call: its task with its context in the prompt, cut to the model's input
window (head and tail kept; the cut is recorded). No kernel. The call goes through the runner's
model gateway like any session's, so budgets, retries and the `model_call` record are the same,
and each item is a session of its own (`eval_mode: direct`): `primefs usage`, `status` and `log`
show it like any other.
"""
from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from primefs.errors import BudgetExhausted, PrimefsError, SessionStopping
from primefs.kernels.client import cut
from primefs.providers.base import ModelError
from primefs.providers.script import estimate_tokens
from primefs.runner.compaction import context_window
from primefs.store.fsutil import write_atomic
from primefs.store.session import Session, create_session
from primefs.store.settings import Limits

SYSTEM = ("Answer the task. The input it calls `context` is given in full (or cut, where it says so) between "
          "<context> and </context> after the task. There is no code to run and no tool to call: read the "
          "input and reply with the answer only, in the form the task asks for.")
CHARS_PER_TOKEN = 3  # on the safe side of ~4 for English text: a cut context must still fit
REPLY_TOKENS = 1024  # kept free for the reply when the alias sets no max_tokens


@dataclass
class DirectCaller:
    """What the gateway needs of a caller: its session, model settings and limits."""
    session: Session
    settings: dict
    limits: Limits
    stop_requested: bool = False


def context_text(ctx) -> str:
    if ctx is None:
        return ""
    return ctx if isinstance(ctx, str) else json.dumps(ctx, ensure_ascii=False)


def build_prompt(task: str, ctx: str, settings: dict, count=None) -> tuple[list[dict], dict]:
    """The messages, and what was sent: the window, the context's size before and after the cut. With
    `count` (the gateway's prompt_tokens: the model's tokenizer), the cut is made to fit by its count."""
    window = context_window(settings)
    head = f"{task}\n\n<context>\n"
    tail = "\n</context>"

    def prompt(text: str) -> list[dict]:
        return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": head + text + tail}]

    sent, kept = ctx, len(ctx)
    if window:
        room_tokens = window - int(settings.get("max_tokens") or REPLY_TOKENS)
        tokens = count(settings, prompt(ctx)) if count else None
        room = len(ctx) if tokens is not None and tokens <= room_tokens else \
            max(0, (room_tokens - estimate_tokens(SYSTEM) - estimate_tokens(head + tail) - 16) * CHARS_PER_TOKEN)
        for _ in range(4):  # shrink until the tokenizer says it fits (a few rounds at most)
            if room >= len(ctx):
                break
            sent, kept = (cut(ctx, room) if room else ""), room  # cut() keeps `room` characters and says so
            tokens = count(settings, prompt(sent)) if count else None
            if tokens is None or tokens <= room_tokens:
                break
            room = int(room * room_tokens / tokens * 0.97)
    return prompt(sent), {"window_tokens": window, "context_chars": len(ctx), "context_sent_chars": kept,
                          "cut_chars": len(ctx) - kept}


def slots(settings: dict, concurrency: int) -> int:
    """Calls at once: the eval's concurrency, but never more than the embedded model's server has slots
    (more would wait in its queue, their time counted against model_timeout_s)."""
    if settings["model"].split("/")[0] == "local":
        from primefs.providers.localserver import N_PARALLEL

        return min(concurrency, N_PARALLEL)
    return concurrency


def run_direct(ws, model: str, items: list[dict], cfg: dict, control: dict, progress) -> dict:
    """Run every item as one model call; returns item id -> its session."""
    from primefs.runner.core import Runner, RunnerLock
    from primefs.store.gitops import Committer, Mark

    settings = ws.resolve_model(model)
    runner = Runner(ws, log=lambda m: None)  # its parts only (gateway, budgets, tree); never run()
    limits = ws.limits(control.get("limits") or {})
    extra = {k: v for k, v in control.items() if k in ("budget", "limits")}
    lock = RunnerLock(ws)  # like `run --once`: no other runner may pick these sessions up meanwhile
    committer = Committer(ws.root)
    try:
        sessions = {}
        for item in items:
            s = create_session(ws.sessions, task=item["task"], name=f"{item['id']}.direct", model=model,
                               extra={**extra, "eval": True, "eval_mode": "direct"})
            runner.tree.put(s)
            runner.tree.link(s.id, None)
            sessions[item["id"]] = s

        def one(item):
            s = sessions[item["id"]]
            _call(runner.gateway, DirectCaller(s, settings, limits), item)
            committer.request(f"sessions/{s.id}", f"session {s.id} ({s.name}): direct call",
                              Mark(s.id, s.name, "direct call"))
            if progress:
                progress(1)

        with ThreadPoolExecutor(max_workers=slots(settings, int(cfg["concurrency"])),
                                thread_name_prefix="primefs-direct") as pool:
            for _ in pool.map(one, items):
                pass
    finally:
        committer.close()
        lock.release()
    return sessions


def _call(gateway, caller: DirectCaller, item: dict) -> None:
    """One turn of one model call, recorded as a turn of the session (task, call, answer, turn end)."""
    ctx = context_text(item.get("context"))
    messages, sent = build_prompt(item["task"], ctx, caller.settings, gateway.prompt_tokens)
    write_atomic(caller.session.dir / "prompt.txt", messages[1]["content"], durable=False)  # big: a file
    if sent["cut_chars"]:
        note = (f"direct mode: {sent['context_sent_chars']:,} of {sent['context_chars']:,} context characters "
                f"sent in one prompt (prompt.txt); {sent['cut_chars']:,} cut (head and tail kept) to fit the "
                f"window of {sent['window_tokens']:,} tokens")
    else:
        note = (f"direct mode: the task and all {sent['context_chars']:,} context characters in one prompt "
                f"(prompt.txt)" + ("" if sent["window_tokens"] else "; the model's window is unknown: no cut"))
    caller.session.update(direct=sent)
    one_turn(gateway, caller, messages, "direct", note, direct=sent)


def one_turn(gateway, caller: DirectCaller, messages: list[dict], purpose: str, note: str, **notice) -> None:
    """The session's one turn: a model call through the gateway, its reply the session's answer."""
    s = caller.session
    started = time.monotonic()
    s.set_status("running", stop_reason=None, started_ts=time.time())
    s.history.append("task", text=s.task)
    s.history.append("turn_start", turn=1, model=caller.settings["model"])
    s.history.append("notice", text=note, **notice)
    outcome = "idle"
    try:
        reply = gateway.complete(caller, messages, None, purpose=purpose)
        s.history.append("assistant", text=reply.text, calls=[])
        s.write_result(reply.text)
        s.history.append("result", text=reply.text)
        s.set_status("idle", stop_reason="answered", error=None)
    except ModelError as exc:
        s.history.append("error", error=str(exc))
        s.set_status("failed", error=str(exc), stop_reason="error")
        outcome = "failed"
    except BudgetExhausted as exc:
        s.history.append("budget", reason=exc.reason, detail=str(exc))
        s.set_status("stopped", stop_reason=exc.reason, error=str(exc))
        outcome = "stopped"
    except (SessionStopping, PrimefsError) as exc:
        s.history.append("error", error=str(exc))
        s.set_status("failed", error=str(exc), stop_reason="error")
        outcome = "failed"
    s.history.append("turn_end", turn=1, outcome=outcome, elapsed_s=round(time.monotonic() - started, 4),
                     status=s.status, stop_reason=s.meta.get("stop_reason"))
