"""Runs inside each session's kernel: the names the model's code can use.

Only the standard library is imported here (no litellm: it costs seconds and ~190 MiB per kernel);
every model call and every state change goes to the runner over its socket.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

from primefs.rpc import RpcError, call


class ChildFailed(RuntimeError):
    """A child session failed or was stopped; the message carries its error."""


class _Link:
    def __init__(self, sock: str, token: str):
        self.sock, self.token = sock, token

    def __call__(self, op: str, **args):
        try:
            return call(self.sock, self.token, op, args)
        except RpcError as exc:  # re-raise as the error type the runner named, for clear tracebacks
            kind = {"TimeoutError": TimeoutError, "ChildFailed": ChildFailed, "ValueError": ValueError,
                    "PrimefsError": ValueError, "LookupError": LookupError}.get(exc.kind, RpcError)
            raise kind(str(exc)) from None


def load_context(paths: list[str], data: str | None):
    """A goal's files: one -> str, several -> {path: str}. A parent's value: str or JSON data."""
    if data:
        p = Path(data)
        return json.loads(p.read_text(encoding="utf-8")) if p.suffix == ".json" else p.read_text(encoding="utf-8")
    if not paths:
        return None
    texts = {p: Path(p).read_text(encoding="utf-8", errors="replace") for p in paths}
    return texts[paths[0]] if len(paths) == 1 else texts


@dataclass
class Message:
    id: str
    sender: str
    kind: str
    text: str
    created: str

    def __str__(self) -> str:
        return f"[{self.kind} from {self.sender}] {self.text}"


class Handle:
    """A child session started by rlm(). Status and result are read fresh from the child's files."""

    def __init__(self, link: _Link, id: str, name: str):
        self._link, self.id, self.name = link, id, name

    def __repr__(self) -> str:
        return f"Handle(id={self.id!r}, name={self.name!r}, status={self.status!r})"

    @property
    def status(self) -> str:
        return self._link("child_status", child=self.id)["status"]

    @property
    def result(self) -> str | None:
        return self._link("child_status", child=self.id)["result"]

    def wait(self, timeout: float | None = None) -> str:
        """Block until the child's turn ends; return its result. Raises ChildFailed or TimeoutError."""
        return self._link("wait", child=self.id, timeout=timeout)

    def send(self, text: str) -> None:
        """Mail the child; an idle or finished child starts a new turn with it."""
        self._link("send", to=self.id, text=str(text))


def setup(ns: dict, sock: str, token: str, session_id: str, context_paths: list[str],
          context_data: str | None = None) -> None:
    link = _Link(sock, token)

    def done(answer) -> None:
        """Finish: `answer` becomes the session's result; no further model call this turn.
        Refused (ValueError) while the goal's end conditions fail."""
        link("done", answer=str(answer))
        print("[done: the answer is recorded; the turn ends after this cell]")

    def goal_status() -> dict:
        """Your goal, budgets (limit, used, left) and end-condition results, checked now."""
        return link("goal_status")

    def llm(prompt: str, model: str | None = None) -> str:
        """One plain model call (no tools, no kernel); accounted to this session."""
        return link("llm", prompt=str(prompt), model=model)

    def llm_batch(prompts: list[str], model: str | None = None) -> list[str]:
        """Many plain model calls in parallel (bounded); answers in the order of `prompts`."""
        return link("llm_batch", prompts=[str(p) for p in prompts], model=model)

    def rlm(task: str, *, name: str | None = None, model: str | None = None, context=None,
            agent: str | None = None) -> Handle:
        """Start a child session on `task` and return its Handle at once (never waits).

        `context` (str, or JSON-able dict/list) becomes the child's `context` variable.
        """
        if context is not None and not isinstance(context, str):
            try:
                json.dumps(context)
            except (TypeError, ValueError) as exc:
                raise TypeError(f"rlm(context=...) must be str or JSON-able data: {exc}") from None
        info = link("spawn", task=str(task), name=name, model=model, context=context, agent=agent)
        return Handle(link, info["id"], info["name"])

    def wait_all(handles: list[Handle], timeout: float | None = None) -> list[str]:
        """Wait for each handle in order; `timeout` bounds the whole wait."""
        deadline = None if timeout is None else time.monotonic() + timeout
        return [h.wait(None if deadline is None else max(0.0, deadline - time.monotonic())) for h in handles]

    def send(to: str, text: str) -> int:
        """Mail a session: an id, a child's name, "parent", "children" or "all". Returns how many got it."""
        return link("send", to=str(to), text=str(text))

    def inbox() -> list[Message]:
        """Messages not yet read; they are marked read."""
        return [Message(**m) for m in link("inbox")]

    def recv(timeout: float | None = None) -> Message:
        """Wait for the next message (TimeoutError after `timeout` seconds)."""
        return Message(**link("recv", timeout=timeout))

    ns.update(context=load_context(context_paths, context_data), done=done, llm=llm, llm_batch=llm_batch,
              rlm=rlm, wait_all=wait_all, goal_status=goal_status, send=send, inbox=inbox, recv=recv, Handle=Handle,
              ChildFailed=ChildFailed, SESSION_ID=session_id)
