"""Goals that run until done: budgets over the session tree, end conditions, autonomous turns.

A goal's front matter may carry `autonomous`, `budget: {turns, tokens, seconds, cost_usd}` and
`end_conditions: [{name: arg}, ...]`; they are copied into the goal session's session.yaml.
Budgets count the whole tree below the session that holds them (tokens = input + output of
every model call, cached prompt tokens too unless limits.budget_tokens is "uncached"; cost in USD,
seconds of wall time since its first turn); `turns` counts the turns of the goal session itself.
They are checked before every model call of every session in the tree. A stop for a limit never
reports success: the status is `stopped`, with a reason.
"""
from __future__ import annotations

import threading
import time
from typing import Callable

from primefs.errors import BudgetExhausted, SessionStopping
from primefs.index.accounting import own_usage
from primefs.runner.bell import Bell
from primefs.runner.tree import SessionTree
from primefs.store.settings import BUDGET_KEYS
from primefs.store.summary import fold_call


class GoalControl:
    def __init__(self, tree: SessionTree, conditions: dict, ws, bell: Bell, turns_of: Callable[[str], int]):
        self.tree = tree
        self.conditions = conditions
        self.ws, self.root = ws, ws.root
        self.bell = bell
        self.turns_of = turns_of  # a session's turns so far (resumed turns are not new turns)
        self._own: dict[str, dict] = {}  # sid -> its usage (summary.py's), kept current by record_call
        self._lock = threading.Lock()

    # -- usage ------------------------------------------------------------------------------------
    def _own_usage(self, sid: str) -> dict:
        if sid not in self._own:
            self._own[sid] = own_usage(self.tree.session(sid))
        return self._own[sid]

    def forget(self, sid: str) -> None:
        """A session the runner lets go of (Turns.forget_idle): its usage is read again from its summary if
        a budget above it asks."""
        with self._lock:
            self._own.pop(sid, None)

    def record_call(self, sid: str, event: dict) -> None:
        """A model_call event just written to `sid`'s history, counted as its summary counts it."""
        with self._lock:
            if sid in self._own:  # otherwise it is read from history when first needed
                fold_call(self._own[sid], event)

    def holder(self, sid: str) -> str | None:
        """The nearest session at or above `sid` that has a budget."""
        return next(iter(self.holders(sid)), None)

    def holders(self, sid: str) -> list[str]:
        """Every session at or above `sid` that has a budget, nearest first: each one's limits hold."""
        return [x for x in self.tree.chain(sid) if self.tree.session(x).meta.get("budget")]

    def reserved(self, holder: str, but: str | None = None) -> dict:
        """What the running children with a budget of their own (rlm(budget=...)) have reserved of
        `holder`'s tokens and cost and not spent yet: the holder's other sessions may not spend it. `but`:
        the one whose share is being spent (a call inside it). A child's rest returns when its turn ends."""
        out = {"tokens": 0, "cost_usd": 0.0}
        for x in self.tree.subtree(holder)[1:]:
            meta = self.tree.session(x).meta
            budget = meta.get("budget") or {}
            if x == but or not (set(budget) & set(out)) or self.holders(self.tree.parent(x) or x)[:1] != [holder]:
                continue  # not a reserving child of this holder (a grandchild's reserve is its parent's business)
            if meta.get("status") not in ("pending", "running"):
                continue
            used = self.used(x)
            for key in out:
                if key in budget:
                    out[key] += max(0, budget[key] - used[key])
        return out

    def used(self, holder: str) -> dict:
        # limits.budget_tokens "uncached": reads from a prompt cache are not counted (writes are)
        uncached = self.ws.limits(self.tree.session(holder).meta.get("limits")).budget_tokens == "uncached"
        with self._lock:
            tokens = cost = 0.0
            for x in self.tree.subtree(holder):
                u = self._own_usage(x)
                tokens += u["input_tokens"] + u["output_tokens"] - (u.get("cache_read_tokens", 0) if uncached else 0)
                cost += u["cost_usd"]
        started = self.tree.session(holder).meta.get("started_ts")
        return {"turns": self.turns_of(holder), "tokens": int(tokens), "cost_usd": round(cost, 10),
                "seconds": round(time.time() - started, 3) if started else 0.0}

    def exhausted(self, sid: str, *, next_turn: bool = False) -> tuple[str, str] | None:
        """(reason, detail) if a budget over `sid` is used up: its nearest holder's, or any above it (with
        what running children reserved of it, but the share `sid` spends). `next_turn`: about to start one
        more turn."""
        chain = self.holders(sid)
        for i, holder in enumerate(chain):
            budget = self.tree.session(holder).meta["budget"]
            used = self.used(holder)
            # what its running children reserved, but the share of the one `sid` is in (chain[i - 1])
            held = self.reserved(holder, but=chain[i - 1] if i else None) if {"tokens", "cost_usd"} & set(budget) \
                else {}
            for key, limit in budget.items():
                if i and key == "turns":
                    continue  # the turns of a session further up: they count its own turns, not its children's
                value = used[key] + held.get(key, 0)
                over = value >= limit if (key != "turns" or next_turn) else value > limit
                if over:
                    kept = f", {held[key]:g} of it reserved for children" if held.get(key) else ""
                    return BUDGET_KEYS[key], f"{key} used {value:g} of {limit:g}{kept}" + (
                        "" if holder == sid else f" (budget of {holder})")
        return None

    def left_for_child(self, parent: str, budget: dict) -> None:
        """rlm(budget=...): the child's tokens and cost must fit in what every budget over `parent` has left
        (its usage and other children's reserves); PrimefsError saying which does not."""
        from primefs.errors import PrimefsError

        chain = self.holders(parent)
        for i, holder in enumerate(chain):
            limits = self.tree.session(holder).meta["budget"]
            used, held = self.used(holder), self.reserved(holder, but=chain[i - 1] if i else None)
            for key in ("tokens", "cost_usd"):
                if key in budget and key in limits:
                    left = limits[key] - used[key] - held[key]
                    if budget[key] > left:
                        raise PrimefsError(f"rlm(budget=...): {key} {budget[key]:.10g} is more than the {max(left, 0):.10g} "
                                           f"the budget of {holder} has left; no child was created")

    def before_model_call(self, agent) -> None:
        if agent.stop_requested or self.bell.stopping:
            raise SessionStopping("the session or the runner is stopping")
        hit = self.exhausted(agent.session.id)
        if hit:
            raise BudgetExhausted(*hit)

    # -- end conditions ---------------------------------------------------------------------------
    def evaluate(self, agent, answer: str | None = None) -> list[dict]:
        """The session's end conditions, checked now. A `command` runs as the session's kernel would: in its
        sandbox and its room (ctx["run"]); paths are its room's (ctx["room"]). A `judge` calls a model as the
        session does (ctx["complete"]: counted in its usage and budgets) and records its verdict; `answer`:
        the answer being judged (done()'s), else result.md."""
        sid = agent.session.id

        def complete(model: str, prompt: str) -> str:
            reply = agent.complete([{"role": "user", "content": prompt}], purpose="judge",
                                   settings=agent.ws.resolve_model(model))
            return reply.text or ""

        ctx = {"workspace": self.root, "session": sid, "room": agent.room, "run": agent.run_command,
               "goal": agent.session.task, "answer": answer if answer is not None else agent.session.read_result(),
               "complete": complete, "record": agent.record}
        out = []
        for cond in self.tree.session(sid).meta.get("end_conditions") or []:
            (name, arg), = cond.items()
            check = self.conditions.get(name)
            if check is None:
                out.append({"name": name, "arg": arg, "passed": False, "report": f"unknown end condition {name!r}"})
                continue
            try:
                passed, report = check(arg, ctx)
            except Exception as exc:  # a broken plugin fails its condition, not the runner
                passed, report = False, f"{name} raised {type(exc).__name__}: {exc}"
            out.append({"name": name, "arg": arg, "passed": bool(passed), "report": str(report)})
        return out

    def refuse_done(self, agent, answer: str | None = None) -> str | None:
        """done() is refused (with this message) while the session's end conditions fail."""
        results = self.evaluate(agent, answer)
        failing = [r for r in results if not r["passed"]]
        if not failing:
            return None
        return "done() refused: end conditions not met:\n" + "\n".join(r["report"] for r in failing)

    def status(self, agent) -> dict:
        sid = agent.session.id
        meta = agent.session.meta
        holder = self.holder(sid)
        budget = {}
        if holder:
            used = self.used(holder)
            for key, limit in self.tree.session(holder).meta["budget"].items():
                budget[key] = {"limit": limit, "used": used[key], "left": max(0, limit - used[key])}
        return {"goal": agent.session.task, "session": sid, "autonomous": bool(meta.get("autonomous")),
                "turn": agent.turns, "budget": budget, "budget_holder": holder,
                "end_conditions": self.evaluate(agent)}

    # -- autonomy ---------------------------------------------------------------------------------
    def after_turn(self, agent, outcome: str) -> str | None:
        """Decide what follows a turn. Returns the notice that starts another turn, or None."""
        s = agent.session
        meta = s.reload()
        if outcome in ("failed", "stopped", "loop") or meta.get("status") in ("failed", "stopped"):
            return None
        conds = meta.get("end_conditions") or []
        if conds:
            results = self.evaluate(agent)
            failing = [r for r in results if not r["passed"]]
            s.history.append("end_conditions", results=[{k: r[k] for k in ("name", "passed")} for r in results],
                             report="\n".join(r["report"] for r in failing)[-4000:])
            if not failing:
                if meta.get("status") != "done" or meta.get("stop_reason") != "done":
                    s.set_status("done", stop_reason="done", error=None)
                return None
            if meta.get("status") == "done":  # done() was accepted, but the conditions no longer hold
                s.set_status("idle", stop_reason="end_conditions_failed")
            if not meta.get("autonomous"):
                return None
            hit = self.exhausted(s.id, next_turn=True)
            if hit:  # the budget says why it stopped; the error says the conditions still fail
                s.set_status("stopped", stop_reason=hit[0], error=f"{hit[1]}; end conditions still failing: "
                             + ", ".join(r["name"] for r in failing))
                return None
            holder = self.holder(s.id)
            limit = self.tree.session(holder).meta["budget"].get("turns") if holder else None
            attempt = f"attempt {agent.turns + 1}" + (f" of {limit:g}" if limit else "")
            report = "\n\n".join(r["report"] for r in failing)[-4000:]
            return f"The goal's end conditions are not met yet ({attempt}):\n{report}\nKeep working on the goal."
        if not meta.get("autonomous") or outcome == "done":
            return None
        hit = self.exhausted(s.id, next_turn=True)
        if hit:
            s.set_status("stopped", stop_reason=hit[0], error=hit[1])
            return None
        return "Continue working on the goal. When it is complete, call done(answer) with the final answer."
