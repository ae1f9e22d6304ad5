"""What kernels may ask of the runner: model calls, children, mail, done(), the harness.

The kernel host has already verified the caller (its token, and the calling process), and hands
over the caller's session id: `from` on every message, the parent of every child and the session
every model call is accounted to are derived from it, never taken from code. Every answer a kernel
gets is redacted (redact.py): model replies, tool results, children's results, mail.
"""
from __future__ import annotations

import inspect
import json
import time
from concurrent.futures import ThreadPoolExecutor

from primefs.errors import PrimefsError
from primefs.runner.bell import Bell, Stopping
from primefs.runner.goalctl import GoalControl
from primefs.runner.intake import Intake
from primefs.runner.postoffice import PostOffice
from primefs.runner.scheduler import Scheduler
from primefs.runner.toolbox import ToolBox
from primefs.runner.tree import SessionTree
from primefs.runner.turns import Turns
from primefs.store import mail, redact, worktrees
from primefs.store.fsutil import check_name
from primefs.store.session import Session, context_files, create_session
from primefs.store.settings import FINISHED, check_budget, check_resources
from primefs.store.trust import WRITTEN_BY_KERNELS
from primefs.tools.registry import check_selection
from primefs.tracing import spans as tracing


class ChildFailed(RuntimeError):
    pass


class KernelServices:
    def __init__(self, ws, tree: SessionTree, turns: Turns, post: PostOffice, scheduler: Scheduler,
                 goals: GoalControl, intake: Intake, bell: Bell, toolbox: ToolBox):
        self.ws, self.tree, self.turns, self.post, self.scheduler = ws, tree, turns, post, scheduler
        self.goals, self.intake, self.bell, self.toolbox = goals, intake, bell, toolbox

    def handle(self, sid: str, op: str, args: dict):
        method = getattr(self, f"op_{op}", None)
        if method is None:
            raise ValueError(f"unknown request {op!r}")
        if not isinstance(args, dict):
            raise ValueError("request arguments must be a JSON object")
        agent = self.turns.agent(sid)
        if "agent" in args:  # rlm(agent=...) names a subagent spec, not the caller
            args["agent_spec"] = args.pop("agent")
        try:
            inspect.signature(method).bind(agent, **args)
        except TypeError as exc:
            raise ValueError(f"bad arguments for {op}: {exc}") from None
        try:  # what reaches a kernel never holds a known secret (a model or a tool may echo one)
            return redact.value(method(agent, **args))
        except Exception as exc:
            if redact.text(str(exc)) != str(exc):
                exc.args = (redact.text(str(exc)),)
            raise

    # -- model calls ------------------------------------------------------------------------------
    def _settings(self, agent, model: str | None) -> dict:
        return self.ws.resolve_model(model) if model else agent.settings

    def op_llm(self, agent, prompt: str, model: str | None = None) -> str:
        return agent.complete([{"role": "user", "content": prompt}], purpose="llm",
                              settings=self._settings(agent, model)).text

    def op_llm_batch(self, agent, prompts: list[str], model: str | None = None) -> list[str]:
        settings = self._settings(agent, model)
        workers = max(1, min(len(prompts), agent.limits.llm_batch_concurrency))
        pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="llm-batch")
        try:
            futures = [pool.submit(agent.complete, [{"role": "user", "content": p}], purpose="llm_batch",
                                   settings=settings) for p in prompts]
            return [f.result().text for f in futures]
        finally:  # after a failure, calls not yet started are cancelled (not paid for)
            pool.shutdown(wait=True, cancel_futures=True)

    def op_done(self, agent, answer: str) -> bool:
        refusal = self.goals.refuse_done(agent, answer)
        if refusal:
            agent.record("done_refused", answer=answer[:2000], report=refusal[-4000:])
            raise PrimefsError(refusal)
        agent.done_answer = answer
        return True

    def op_tool(self, agent, name: str, args: list | None = None, kwargs: dict | None = None) -> dict:
        agent.approvals.check_tool(agent, name, list(args or []), dict(kwargs or {}))
        return self.toolbox.call(agent, name, list(args or []), dict(kwargs or {}))

    def op_tools(self, agent) -> list[dict]:
        """The session's tools now (an MCP server that came up since its kernel started has more)."""
        return [t.spec() for t in agent.tools()]

    def op_goal_status(self, agent) -> dict:
        return self.goals.status(agent)

    # -- children ---------------------------------------------------------------------------------
    def op_spawn(self, agent, task: str, name=None, model=None, context=None, agent_spec=None,
                 resources=None, budget=None, worktree=None) -> dict:
        parent = agent.session
        depth = int(parent.meta.get("depth") or 0) + 1
        max_depth = agent.limits.max_depth
        if depth > max_depth:
            raise PrimefsError(f"rlm(): depth limit reached (this session is at depth {depth - 1}; "
                               f"limits.max_depth is {max_depth}); no child was created")
        if not str(task).strip():
            raise PrimefsError("rlm(): the task is empty")
        n = len(self.tree.children(parent.id)) + 1
        if name:
            self._check_name_free(parent.id, check_name(name, "child name"))
        name = name or f"{parent.name}.{n}"
        explicit_model = model
        model = model or parent.meta["model"]
        extra = {}
        if agent_spec:  # a subagent spec: its body is the child's role, its model the default
            spec = self._harness().get("agent", check_name(agent_spec, "subagent spec"),
                                       sessions=self.tree.chain(parent.id))
            if spec is None:
                raise PrimefsError(f"rlm(agent={agent_spec!r}): no such subagent spec in the harness "
                                   "(harness/agents/<name>.md)")
            spec_model = spec.meta.get("model")
            if not explicit_model and spec_model and spec_model != "inherit":
                model = str(spec_model)
            extra["agent"] = agent_spec
            if "tools" in spec.meta:  # the spec's own selection, else the parent's (below)
                wanted = check_selection(spec.meta["tools"], f"subagent spec {agent_spec}")
                pf = spec.meta.get("primefs") if isinstance(spec.meta.get("primefs"), dict) else {}
                extra["tools"] = within_parent(self.toolbox, parent, wanted) \
                    if pf.get("source") in WRITTEN_BY_KERNELS else wanted
        self.ws.resolve_model(model)  # unknown model: error in the cell, nothing created
        if parent.meta.get("limits"):
            extra["limits"] = parent.meta["limits"]
        if "tools" not in extra and parent.meta.get("tools") is not None:
            extra["tools"] = parent.meta["tools"]
        if "sandbox" in parent.meta:  # a goal's sandbox covers its whole tree
            extra["sandbox"] = parent.meta["sandbox"]
        if parent.meta.get("approve"):  # and so does what it needs a yes for
            extra["approve"] = parent.meta["approve"]
        if budget is not None:  # its own limits; its tokens and cost reserved of every budget above it
            extra["budget"] = check_budget(budget, "rlm(budget=...)")
            self.goals.left_for_child(parent.id, extra["budget"])
        if resources is not None:  # what the child's kernel needs from a node; else the parent's needs
            extra["resources"] = check_resources(resources, "rlm(resources=...)")
        elif parent.meta.get("resources"):
            extra["resources"] = parent.meta["resources"]
        if worktree is not None:  # made by the runner at the child's first turn (store/worktrees.py)
            extra["worktree"] = worktrees.check_repo(self.ws, worktree, "rlm(worktree=...)")
        agent.approvals.check_spawn(agent, n, str(task))  # past approve.children: a person says yes first
        child = create_session(self.ws.sessions, task=task, name=name, model=model, parent=parent.id, depth=depth,
                               extra=extra, files=context_files(context))
        agent.record("spawn", child=child.id, name=name, model=model, task=task[:2000], agent=agent_spec)
        tracing.spawned(parent.id, child.id)
        self.intake.adopt(child)
        return {"id": child.id, "name": name}

    def _check_name_free(self, parent: str, name: str) -> None:
        """A person addresses sessions by name (`primefs send NAME`: the newest session that has it). A child a
        kernel names after a session of another tree took that name over (found by an attack): refused."""
        from primefs.index.db import Index

        with Index(self.ws.root) as index:
            found = index.find(name)
        if found and self.tree.root(found) != self.tree.root(parent):
            raise PrimefsError(f"rlm(name={name!r}): a session of another tree has that name; choose another")

    def _child(self, agent, child: str) -> Session:
        if not isinstance(child, str) or self.tree.parent(child) != agent.session.id:
            raise LookupError(f"{child!r} is not a child of this session")
        return self.tree.session(child)

    def op_child_status(self, agent, child: str) -> dict:
        s = self._child(agent, child)
        meta = s.reload()
        return {"status": meta.get("status"), "result": s.read_result(), "worktree": worktrees.shown(meta)}

    def op_wait(self, agent, child: str, timeout: float | None = None) -> str:
        s = self._child(agent, child)
        cell = agent.cell_seq  # the cell that asked; if it ends (interrupted), this request is void
        if not self._wait_settled(agent, child, timeout, cell):
            raise TimeoutError(f"child {s.name} ({child}) still running after {timeout} s")
        meta = s.reload()
        self.post.consume_results(agent, child, cell=cell)
        if meta.get("status") == "failed":
            raise ChildFailed(f"child {s.name} ({child}) failed: {meta.get('error')}")
        if meta.get("status") == "stopped":
            raise ChildFailed(f"child {s.name} ({child}) was stopped")
        result = s.read_result()
        if result is None or meta.get("stop_reason") not in ("answered", "done"):
            raise ChildFailed(f"child {s.name} ({child}) ended its turn without an answer: "
                              f"{meta.get('error') or meta.get('stop_reason')}")
        return result

    def _wait_settled(self, agent, child: str, timeout: float | None, cell: int) -> bool:
        """Block until the child has no turn running or queued and no unread mail. Frees the caller's slot."""
        s = self.tree.session(child)

        def settled() -> bool:
            if self.scheduler.busy(child):
                return False
            status = s.reload().get("status")
            return status == "stopped" or (status in FINISHED and not self.post.has_new(child))

        def void() -> str | None:
            if agent.cell_seq != cell:
                return "the cell that asked has ended (interrupted); this request is void"
            if agent.stop_requested:
                return "wait() interrupted: the session is stopping"
            return None

        with self.scheduler.waiting_for_others(agent.session.id):
            try:
                return self.bell.wait_until(settled, timeout, abort=void)
            except Stopping:
                raise RuntimeError("wait() interrupted: the runner is stopping") from None

    # -- harness ----------------------------------------------------------------------------------
    def _harness(self):
        from primefs.harness.entries import Harness

        return Harness(self.ws)

    def op_harness_put(self, agent, kind, name, body, scope="global", description=None, fields=None) -> str | None:
        fields = dict(fields or {})
        if "gate" in fields:  # only a gate's verdict writes Primefs-Gate: a kernel must not forge one
            raise PrimefsError("harness.put: `gate` is not a field an agent sets")
        files = fields.pop("files", None)
        sha = self._harness().put(kind, name, body, scope=scope, session=agent.session.id, description=description,
                                  source="agent", files=files, **fields)
        agent.record("harness", op="put", kind=kind, name=name, scope=scope, commit=sha)
        return sha

    def op_harness_get(self, agent, kind, name) -> dict | None:
        e = self._harness().get(kind, name, sessions=self.tree.chain(agent.session.id))
        return None if e is None else _entry(e, body=True)

    def op_harness_list(self, agent, kind=None) -> list[dict]:
        return [_entry(e) for e in self._harness().list(kind, sessions=self.tree.chain(agent.session.id))]

    def op_harness_delete(self, agent, kind, name, scope="global") -> str | None:
        sha = self._harness().delete(kind, name, scope=scope, session=agent.session.id, source="agent")
        agent.record("harness", op="delete", kind=kind, name=name, scope=scope, commit=sha)
        return sha

    def op_refine(self, agent, instructions=None, scope="global") -> str:
        if scope not in ("global", "session"):
            raise PrimefsError("refine(scope=...) is 'global' or 'session'")
        agent.pending_refine = {"instructions": instructions, "scope": scope}
        return "refinement scheduled for the end of this turn"

    def op_heartbeat(self, agent, every=None, cron=None, prompt=None) -> dict:
        if bool(every) == bool(cron):
            raise PrimefsError("heartbeat() needs every='10m' or cron='*/5 * * * *' (one of them)")
        from primefs.store.heartbeat import add, from_spec

        hb = add(agent.session.dir, *from_spec({"every": every, "cron": cron, "prompt": prompt}))
        self.intake.watch_heartbeats(agent.session.id)
        agent.record("heartbeat_set", id=hb["id"], schedule=hb["schedule"], prompt=hb["prompt"])
        return {"id": hb["id"], "next_due": hb["next_due"]}

    # -- mail -------------------------------------------------------------------------------------
    # -- search ---------------------------------------------------------------------------------------
    def op_search(self, agent, text: str, scope: str = "workspace", type: str | None = None, limit: int = 20) -> list[dict]:
        """`history.search(..., scope="tree"|"workspace")`: full-text, over the index (archived sessions too)."""
        tree = self.tree.subtree(self.tree.root(agent.session.id)) if scope == "tree" else None
        return search_sessions(self.ws.root, text, scope, type, limit, tree)

    def op_send(self, agent, to: str, text: str) -> int:
        targets = self.post.resolve(agent.session.id, str(to))
        for sid in targets:
            self.post.deliver(sid, sender=agent.session.id, kind="message", text=str(text))
        agent.record("sent", to=targets, target=to, kind="message", text=text[:2000])
        return len(targets)

    def op_inbox(self, agent) -> list[dict]:
        return [_msg(m) for m in self.post.read_mail(agent)]

    def op_recv(self, agent, timeout: float | None = None) -> dict:
        deadline = None if timeout is None else time.monotonic() + timeout
        cell = agent.cell_seq
        while True:
            msgs = self.post.read_mail(agent, limit=1, cell=cell)
            if msgs:
                return _msg(msgs[0])
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise TimeoutError(f"no message within {timeout} s")
            if self.bell.stopping or agent.stop_requested:
                raise RuntimeError("recv() interrupted: the session or the runner is stopping")
            self.post.wait(0.5 if left is None else min(0.5, left))


def within_parent(toolbox: ToolBox, parent: Session, wanted):
    """A kernel-written spec's tool selection, cut to the tools its parent has: a spec a kernel wrote
    through the harness never gives its child a tool the person did not give the parent (a person's
    spec may)."""
    if parent.meta.get("tools") is None:
        return wanted
    allowed = {t.name for t in toolbox.for_session(parent.meta["tools"])[0]}
    return sorted(t.name for t in toolbox.for_session(wanted)[0] if t.name in allowed)


def _entry(e, body: bool = False) -> dict:
    """A harness Entry as plain JSON data (front matter may hold ruamel types and dates)."""
    d = {"kind": e.kind, "name": e.name, "scope": e.scope, "session": e.session, "path": e.path,
         "description": e.description, "problem": e.problem}
    if body:
        d.update(body=e.body, meta=json.loads(json.dumps(e.meta, default=str)), files=list(e.files))
    return d


def search_sessions(root, text, scope: str, type, limit, sessions: list[str] | None) -> list[dict]:
    """A kernel's full-text search of the index (`sessions`: its tree's ids, or None: every session)."""
    from primefs.index.archived import sync_archives
    from primefs.index.db import Index
    from primefs.index.find import find_events

    if scope not in ("tree", "workspace"):
        raise ValueError(f"history.search(scope={scope!r}): scope is 'session', 'tree' or 'workspace'")
    if not isinstance(text, str) or not text.strip():
        raise ValueError("history.search(): the pattern is empty")
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= 1000:
        raise ValueError("history.search(limit=...) must be a whole number from 1 to 1000")
    with Index(root) as index:
        sync_archives(index)
        try:
            events, _ = find_events(root, index, limit, label="history.search()", text=text,
                                    types=[type] if type else None, sessions=sessions)
        except PrimefsError as exc:
            raise ValueError(str(exc)) from None
    return events


def _msg(m: mail.Message) -> dict:
    return {"id": m.id, "sender": m.sender, "kind": m.kind, "text": m.text, "created": m.created}
