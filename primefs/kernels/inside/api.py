"""Runs inside each session's kernel: the names the model's code can use.

Only the standard library is imported here (no litellm: it costs seconds and ~190 MiB per kernel);
every model call and every state change goes to the runner over its socket.
"""
from __future__ import annotations

import importlib.util
import json
import re
import sys
import time
import types
from dataclasses import dataclass
from pathlib import Path

from primefs.kernels.inside.rpc import RpcError, call
from primefs.kernels.inside.snapshot import PROVIDED
from primefs.kernels.inside.tools import make_tools


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


def load_context(root: Path, paths: list[str], data: str | None):
    """A goal's files: one -> str, several -> {path: str}. A parent's value: str or JSON data. Paths are
    the workspace's (`root`), as session.yaml names them."""
    if data:
        p = root / data
        return json.loads(p.read_text(encoding="utf-8")) if p.suffix == ".json" else p.read_text(encoding="utf-8")
    if not paths:
        return None
    texts = {p: (root / p).read_text(encoding="utf-8", errors="replace") for p in paths}
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

    @property
    def worktree(self) -> dict | None:
        """With rlm(worktree=...): {repo, branch, path, changed, overlaps, removed} as of its last turn end
        (`changed`: files changed on its branch; `overlaps`: {sibling id: files it changed too})."""
        return self._link("child_status", child=self.id)["worktree"]

    def wait(self, timeout: float | None = None) -> str:
        """Block until the child's turn ends; return its result. Raises ChildFailed or TimeoutError."""
        return self._link("wait", child=self.id, timeout=timeout)

    def send(self, text: str) -> None:
        """Mail the child; an idle or finished child starts a new turn with it."""
        self._link("send", to=self.id, text=str(text))


class HarnessAPI:
    """Notes, memories, skills and subagent specs: files under harness/ (or this session's harness/),
    each change one git commit. Changes show in the system prompt from the next turn on."""

    def __init__(self, link: _Link):
        self._link = link

    def put(self, kind: str, name: str, body: str, *, scope: str = "global", description: str | None = None,
            **fields) -> str:
        """Create or update an entry (kind: note, memory, skill, agent); returns the commit id.
        For a skill, pass its Python as files={"module.py": code}."""
        return self._link("harness_put", kind=kind, name=name, body=body, scope=scope,
                          description=description, fields=fields)

    def get(self, kind: str, name: str) -> dict | None:
        """The entry this session sees (its own, an ancestor's, else global): a dict, or None."""
        return self._link("harness_get", kind=kind, name=name)

    def list(self, kind: str | None = None) -> list[dict]:
        return self._link("harness_list", kind=kind)

    def delete(self, kind: str, name: str, *, scope: str = "global") -> str:
        return self._link("harness_delete", kind=kind, name=name, scope=scope)


class HistoryAPI:
    """This session's history.jsonl, read from the file: everything, also what compaction summarized;
    and, through the runner, every session's (`search(..., scope=...)`)."""

    def __init__(self, path: str, link: _Link | None = None):
        self._path = Path(path)
        self._link = link

    def events(self, type: str | None = None, last: int | None = None) -> list[dict]:
        from primefs.store.history import events_of  # the runner's reader: the same lines skipped, a torn last one too

        with open(self._path, "rb") as f:
            out = [e for e in events_of(f) if type is None or e.get("type") == type]
        return out[-last:] if last else (out if last is None else [])

    def search(self, pattern: str, type: str | None = None, *, scope: str = "session", limit: int = 20) -> list[dict]:
        """scope="session": this session's events whose text (any string field) matches the regular
        expression `pattern`, all of them. scope="tree" (this session's whole tree) or "workspace" (every
        session, archived ones too): a full-text search of the index (words, "a phrase", prefix*, a OR b),
        the newest `limit` events, each with `session` and `session_name`."""
        if scope != "session":
            return self._link("search", text=pattern, scope=scope, type=type, limit=limit)
        rx = re.compile(pattern)
        return [e for e in self.events(type) if any(isinstance(v, str) and rx.search(v) for v in e.values())]


class SkillsModule(types.ModuleType):
    """`from skills import csv_stats` loads harness/skills/csv-stats/ (nearest session first).

    The skill's module is `__init__.py`, `<name>.py`, `skill.py` or its only .py file; it is loaded
    again when the file changed, so edits apply without restarting the kernel."""

    def __init__(self, dirs: list[str], refused: dict[str, str] | None = None):
        super().__init__("skills", "Skills from the primefs harness: `from skills import <name>`.")
        self.__path__ = []  # a namespace-like package: submodules are resolved by __getattr__
        self._dirs = [Path(d) for d in dirs]
        self._refused = refused or {}  # skill folder -> why it is not loaded in this kernel
        self._loaded: dict[str, tuple[float, types.ModuleType]] = {}

    def __dir__(self):
        names = {p.name.replace("-", "_") for d in self._dirs if d.is_dir() for p in d.iterdir() if p.is_dir()}
        return sorted(names)

    def __getattr__(self, attr: str):
        if attr.startswith("__"):
            raise AttributeError(attr)
        folder = next((d / attr.replace("_", "-") for d in self._dirs if (d / attr.replace("_", "-")).is_dir()), None)
        if folder is None:
            raise AttributeError(f"no skill {attr.replace('_', '-')!r} in the harness (see harness.list('skill'))")
        if str(folder) in self._refused:  # (ImportError: `from skills import x` shows it as it is)
            raise ImportError(self._refused[str(folder)])
        pys = sorted(folder.glob("*.py"))
        pick = next((folder / n for n in ("__init__.py", f"{attr}.py", "skill.py") if (folder / n).is_file()),
                    pys[0] if len(pys) == 1 else None)
        if pick is None:
            raise AttributeError(f"skill {folder.name!r} has no Python module (__init__.py, {attr}.py or skill.py)")
        mtime = pick.stat().st_mtime
        cached = self._loaded.get(attr)
        if cached and cached[0] == mtime:
            return cached[1]
        spec = importlib.util.spec_from_file_location(f"skills.{attr}", pick,
                                                      submodule_search_locations=[str(folder)])
        module = importlib.util.module_from_spec(spec)
        sys.modules[f"skills.{attr}"] = module
        spec.loader.exec_module(module)
        self._loaded[attr] = (mtime, module)
        return module


def route_thread_output(shell) -> None:
    """A thread's output goes to the cell that started it, not to whichever cell runs when it prints
    (ipykernel's default: a thread a connected console started would print into the agent's cell)."""
    import threading

    if not hasattr(shell, "set_thread_parent"):  # ipykernel before 6.26: its own routing
        return
    start = threading.Thread.start

    def start_in_this_cell(thread):
        parent, run = shell.get_parent(), thread.run

        def run_in_that_cell():
            shell.set_thread_parent(parent)
            run()

        thread.run = run_in_that_cell
        start(thread)

    threading.Thread.start = start_in_this_cell


def setup(ns: dict, *, sock: str, token: str, session_id: str, workspace: str = ".", history: str | None = None,
          context_paths: list[str] | None = None, context_data: str | None = None, skill_dirs: list[str] | None = None,
          skills_refused: dict[str, str] | None = None,
          tools: list[dict] | None = None, plugins_dir: str | None = None) -> None:
    link = _Link(sock, token)
    sys.modules["skills"] = SkillsModule(skill_dirs or [], skills_refused)
    api = {"context": load_context(Path(workspace), context_paths or [], context_data),
           **_turn_control(link), **_model_calls(link), **_mail(link),
           "harness": HarnessAPI(link),
           "history": HistoryAPI(history or str(Path(workspace, "sessions", session_id, "history.jsonl")), link),
           "Handle": Handle, "ChildFailed": ChildFailed, "SESSION_ID": session_id}
    box = make_tools(link, tools or [], plugins_dir)
    api["tools"] = box
    import builtins

    for name, fn in vars(box).items():  # the bare name too, where that shadows nothing
        if name not in api and name not in ns and not hasattr(builtins, name):
            api[name] = fn
    ns.update(api)
    PROVIDED.clear()
    PROVIDED.update(api)


def _turn_control(link: _Link) -> dict:
    """done, goal_status, refine, heartbeat: how this session's turns end, and what follows them."""

    def done(answer) -> None:
        """Finish: `answer` becomes the session's result; no further model call this turn.
        Refused (ValueError) while the goal's end conditions fail."""
        link("done", answer=str(answer))
        print("[done: the answer is recorded; the turn ends after this cell]")

    def goal_status() -> dict:
        """Your goal, budgets (limit, used, left) and end-condition results, checked now."""
        return link("goal_status")

    def refine(instructions: str | None = None, scope: str = "global") -> str:
        """Ask for one refinement of the harness from this session's recent events, applied when
        this turn ends (one model call proposes edits; valid ones are committed with provenance)."""
        return link("refine", instructions=instructions, scope=scope)

    def heartbeat(every: str | None = None, *, cron: str | None = None, prompt: str | None = None) -> dict:
        """Re-enter this session on a schedule (every="5m", or cron="*/15 * * * *") with `prompt` as mail."""
        return link("heartbeat", every=every, cron=cron, prompt=prompt)

    return {"done": done, "goal_status": goal_status, "refine": refine, "heartbeat": heartbeat}


def _model_calls(link: _Link) -> dict:
    """llm, llm_batch, rlm, wait_all: plain model calls, and child sessions."""

    def llm(prompt: str, model: str | None = None) -> str:
        """One plain model call (no tools, no kernel); accounted to this session."""
        return link("llm", prompt=str(prompt), model=model)

    def llm_batch(prompts: list[str], model: str | None = None) -> list[str]:
        """Many plain model calls in parallel (bounded); answers in the order of `prompts`."""
        return link("llm_batch", prompts=[str(p) for p in prompts], model=model)

    def rlm(task: str, *, name: str | None = None, model: str | None = None, context=None,
            agent: str | None = None, resources: dict | None = None, budget: dict | None = None,
            worktree: str | None = None) -> Handle:
        """Start a child session on `task` and return its Handle at once (never waits).

        `context` (str, or JSON-able dict/list) becomes the child's `context` variable.
        `resources` ({num_cpus, num_gpus, memory, custom}: what its kernel needs; default: this session's).
        `budget` ({tokens, cost_usd, turns, seconds}): the child's and its descendants' own limits; its
        tokens and cost are reserved of this session's budget while the child runs.
        `worktree` (a git repository's path, workspace-relative or absolute): the child works in its own
        worktree of it, on a new branch (Handle.worktree: the branch and the files it changed).
        """
        if context is not None and not isinstance(context, str):
            try:
                json.dumps(context)
            except (TypeError, ValueError) as exc:
                raise TypeError(f"rlm(context=...) must be str or JSON-able data: {exc}") from None
        info = link("spawn", task=str(task), name=name, model=model, context=context, agent=agent,
                    resources=resources, budget=budget, worktree=worktree)
        return Handle(link, info["id"], info["name"])

    def wait_all(handles: list[Handle], timeout: float | None = None) -> list[str]:
        """Wait for each handle in order; `timeout` bounds the whole wait."""
        deadline = None if timeout is None else time.monotonic() + timeout
        return [h.wait(None if deadline is None else max(0.0, deadline - time.monotonic())) for h in handles]

    return {"llm": llm, "llm_batch": llm_batch, "rlm": rlm, "wait_all": wait_all}


def _mail(link: _Link) -> dict:
    """send, inbox, recv: messages between sessions."""

    def send(to: str, text: str) -> int:
        """Mail a session: an id, a child's name, "parent", "children" or "all". Returns how many got it."""
        return link("send", to=str(to), text=str(text))

    def inbox() -> list[Message]:
        """Messages not yet read; they are marked read."""
        return [Message(**m) for m in link("inbox")]

    def recv(timeout: float | None = None) -> Message:
        """Wait for the next message (TimeoutError after `timeout` seconds)."""
        return Message(**link("recv", timeout=timeout))

    return {"send": send, "inbox": inbox, "recv": recv}
