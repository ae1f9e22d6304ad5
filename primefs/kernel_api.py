"""Runs inside each session's kernel: the names the model's code can use.

Only the standard library is imported here (no litellm: it costs 2 s and 190 MiB per kernel);
every model call and every state change goes to the runner over its socket.
"""
from __future__ import annotations

from pathlib import Path

from primefs.rpc import RpcError, call


class _Link:
    def __init__(self, sock: str, token: str):
        self.sock, self.token = sock, token

    def __call__(self, op: str, **args):
        return call(self.sock, self.token, op, args)


def load_context(paths: list[str]):
    """One file -> str; several -> {path: str}; none -> None."""
    if not paths:
        return None
    texts = {p: Path(p).read_text(encoding="utf-8", errors="replace") for p in paths}
    return texts[paths[0]] if len(paths) == 1 else texts


def setup(ns: dict, sock: str, token: str, session_id: str, context_paths: list[str]) -> None:
    link = _Link(sock, token)

    def done(answer) -> None:
        """Finish: `answer` becomes the session's result; no further model call this turn."""
        link("done", answer=str(answer))
        print("[done: the answer is recorded; the turn ends after this cell]")

    def llm(prompt: str, model: str | None = None) -> str:
        """One plain model call (no tools, no kernel); accounted to this session."""
        return link("llm", prompt=str(prompt), model=model)

    ns.update(context=load_context(context_paths), done=done, llm=llm, SESSION_ID=session_id,
              PrimefsError=RpcError)
