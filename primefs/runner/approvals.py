"""The approval gate: before what its policy names (store/approvals.py) a session waits for a person.

A cell matching `approve.cells`, a call of a tool in `approve.tools`, a child past `approve.children` and a
model call once the tree has spent past a mark of `approve.cost_usd` each ask: a request file
(`sessions/<id>/approvals/<n>.md`), an `approval_request` event, the `approval_needed` hook, the session's
`approval` field (what `status` shows). The session's slot is free meanwhile. The answer comes from a person
through the runner (`answer`, from control.ask_runner's `approve` request), from the policy's timeout, or is
void (the session or the runner stopped). It is an `approval` event, written into the request file and
committed with who answered. A denial is an error the model sees: its reason is the cell's error.
"""
from __future__ import annotations

import json
import threading
import time

from primefs.errors import BudgetExhausted, PrimefsError
from primefs.runner.bell import Stopping
from primefs.store import approvals as files
from primefs.store.approvals import Policy, check_approve, policy

VERDICTS = {"approve": "approved", "deny": "denied"}


class Denied(PrimefsError):
    """A request denied, timed out to a denial, or void: the text says which, by whom and why."""


class Approvals:
    def __init__(self, ws, bell, scheduler, goals, hooks, log, commit):
        """commit(session, what): ask the committer for the session's folder (Turns.commit_session)."""
        self.ws, self.bell, self.scheduler, self.goals, self.hooks, self.log = ws, bell, scheduler, goals, hooks, log
        self.commit = commit
        self.answers: dict[tuple[str, int], dict | None] = {}  # the requests waiting; guarded by bell.cond
        self._numbering = threading.Lock()
        self._trees: dict[str, threading.Lock] = {}  # one cost question at a time per session tree

    def policy(self, session) -> Policy:
        return policy(check_approve(self.ws.config["approve"], "primefs.yaml") if self.ws.config.get("approve")
                      else None, session.meta.get("approve"))

    # -- the gates -------------------------------------------------------------------------------------
    def check_cell(self, agent, code: str) -> str | None:
        """None: the cell may run. Else why not (the cell's error)."""
        p = self.policy(agent.session)
        rule = p.cell_rule(code) if p else None
        if rule is None:
            return None
        try:
            self.ask(agent, p, "cell", f"run a cell matching {rule!r}", f"approve.cells: {rule}", code)
        except Denied as exc:
            return str(exc)
        return None

    def check_tool(self, agent, name: str, args: list, kwargs: dict) -> None:
        p = self.policy(agent.session)
        if name in p.tools:
            self.ask(agent, p, "tool", f"call the tool {name}", f"approve.tools: {name}",
                     json.dumps({"args": args, "kwargs": kwargs}, ensure_ascii=False, default=str)[:20_000])

    def check_spawn(self, agent, n: int, task: str) -> None:
        """Before the session's n-th child."""
        p = self.policy(agent.session)
        if p.children is not None and n > p.children:
            self.ask(agent, p, "children", f"start child {n} (more than {p.children})",
                     f"approve.children: {p.children}", task[:20_000])

    def check_cost(self, agent) -> None:
        """Before a model call: past a cost mark of its tree not yet approved, ask; denied: BudgetExhausted."""
        p = self.policy(agent.session)
        if not p.cost_usd:
            return
        root = agent.tree.session(agent.tree.root(agent.session.id))

        def due() -> list[float]:
            spent, passed = self.goals.used(root.id)["cost_usd"], float(root.reload().get("approved_cost_usd") or 0)
            return [m for m in p.cost_usd if passed < m <= spent]

        if not due():
            return
        with self.scheduler.waiting_for_others(agent.session.id):  # another session of the tree may be asking
            with self._trees.setdefault(root.id, threading.Lock()):
                marks = due()  # what that one was answered
                if not marks:
                    return
                try:
                    self.ask(agent, p, "cost", f"spend past ${marks[-1]:g} (the tree has spent "
                             f"${self.goals.used(root.id)['cost_usd']:.4f})", f"approve.cost_usd: {marks[-1]:g}", None)
                except Denied as exc:
                    raise BudgetExhausted("approval", str(exc)) from None
                root.update(approved_cost_usd=marks[-1])

    # -- asking and answering --------------------------------------------------------------------------
    def ask(self, agent, p: Policy, kind: str, what: str, why: str, code: str | None) -> None:
        """Wait for the answer; returns if approved, raises Denied if not (or void: Stopping goes on)."""
        s = agent.session
        with self._numbering:
            n = max(files.numbers(s.dir), default=0) + 1
            with self.bell.cond:
                self.answers[(s.id, n)] = None
            files.write(s.dir, n, {"n": n, "session": s.id, "kind": kind, "status": "waiting", "what": what,
                                   "why": why, "asked": _now(), "timeout_s": p.timeout_s, "default": p.default},
                        _body(s, n, what, why, code))
        event = agent.record("approval_request", approval=n, kind=kind, what=what, why=why,
                             timeout_s=p.timeout_s, default=p.default)
        s.update(approval=n)
        self.log(f"{s.id} ({s.name}): waits for approval {n}: {what} (primefs approve {s.id} {n})")
        if self.hooks is not None:
            self.hooks.fire("approval_needed", s, event)
        answer = stop = None
        cell = agent.cell_seq  # a tool's or a child's request is void once the cell that asked has ended

        def void() -> str | None:
            if agent.stop_requested:
                return "the session was stopped"
            return "the cell that asked has ended (interrupted)" if agent.cell_seq != cell else None

        try:
            with self.scheduler.waiting_for_others(s.id):
                if self.bell.wait_until(lambda: self.answers.get((s.id, n)) is not None, p.timeout_s, abort=void):
                    answer = self.answers[(s.id, n)]
                else:
                    answer = {"verdict": VERDICTS[p.default], "by": "timeout", "via": "timeout",
                              "reason": f"no answer within {p.timeout_s:g} s (approve.default: {p.default})"}
        except (Stopping, RuntimeError) as exc:
            stop = exc
            answer = {"verdict": "void", "by": "runner", "via": "runner", "reason": str(exc)}
        finally:
            with self.bell.cond:
                self.answers.pop((s.id, n), None)
            self._close(s, n, answer or {"verdict": "void", "by": "runner", "via": "runner", "reason": "error"},
                        agent.record)
        if isinstance(stop, Stopping):
            raise stop
        if answer["verdict"] != "approved":
            by = "" if answer["by"] == "timeout" else f" by {answer['by']}"
            raise Denied(f"approval {n} ({what}) {answer['verdict']}{by}: {answer['reason'] or 'no reason given'}")

    def _close(self, s, n: int, answer: dict, record) -> None:
        """Record an answer: the event, the request file, the session's `approval` field, a commit."""
        record("approval", approval=n, **answer)
        files.answered(s.dir, n, answer["verdict"], by=answer["by"], via=answer["via"], reason=answer["reason"])
        if s.reload().get("approval") == n:
            s.update(approval=None)
        self.commit(s, f"approval {n} {answer['verdict']} by {answer['by']}")

    def answer(self, sid: str, n: int | None, verdict: str, reason: str | None, by: str, via: str) -> dict:
        """A person's answer (`approve` request): to request n of session sid, or its only waiting one."""
        if verdict not in VERDICTS:
            raise PrimefsError(f"a verdict is approve or deny, not {verdict!r}")
        with self.bell.cond:
            waiting = sorted(k for (s, k), a in self.answers.items() if s == sid and a is None)
            if n is None:
                if len(waiting) != 1:
                    raise PrimefsError(f"session {sid} waits for no approval" if not waiting else
                                       f"session {sid} waits for approvals {', '.join(map(str, waiting))}: say which")
                n = waiting[0]
            if n not in waiting:
                raise PrimefsError(self._not_waiting(sid, n))
            self.answers[(sid, n)] = {"verdict": VERDICTS[verdict], "by": by, "via": via, "reason": reason}
            self.bell.cond.notify_all()
        return {"session": sid, "approval": n, "verdict": VERDICTS[verdict]}

    def _not_waiting(self, sid: str, n: int) -> str:
        folder = self.ws.sessions / sid
        if n not in files.numbers(folder):
            have = files.numbers(folder)
            return f"session {sid} has no approval {n}" + (f" (its approvals: {', '.join(map(str, have))})"
                                                             if have else "")
        try:
            meta, _ = files.read(folder, n)
        except PrimefsError as exc:
            return str(exc)
        if meta.get("status") in ("approved", "denied"):
            return f"approval {n} of {sid} no longer waits: it was {meta['status']} by {meta.get('by') or '?'}"
        return (f"approval {n} of {sid} no longer waits (the session or the runner that asked it stopped; the "
                "session asks again if it still needs it)")

    def void_stale(self, session) -> None:
        """A runner's first look at a session: requests an earlier runner left waiting are void."""
        with self.bell.cond:
            live = {n for (sid, n) in self.answers if sid == session.id}  # this runner's own still wait
        for meta in [m for m in files.listing(session.dir, waiting_only=True) if m["n"] not in live]:
            self._close(session, meta["n"], {"verdict": "void", "by": "runner", "via": "runner",
                                             "reason": "the runner that asked it stopped"}, session.history.append)


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def _body(s, n: int, what: str, why: str, code: str | None) -> str:
    shown = f"\n```python\n{code}\n```\n" if code is not None else ""
    return (f"# Approval {n}: {what}\n\nSession {s.id} ({s.name}) asks, because of `{why}`.\n{shown}\n"
            f"Answer: `primefs approve {s.id} {n}` or `primefs deny {s.id} {n} --reason \"...\"`.\n")
