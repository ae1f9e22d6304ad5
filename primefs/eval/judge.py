"""A judge model for benchmarks that score with one: `primefs eval BENCH --judge ALIAS`.

A benchmark takes a judge when its `score` has a keyword `judge`: primefs passes `judge(prompt) -> reply`.
Each judgement is a session of its own (`<item>.<mode>.judge`, `eval_mode: judge`), one call through the
runner's model gateway as a direct item's is: retried, budgeted, traced and accounted like any call, and
seen by `primefs usage`, `status` and `log`. Its usage is kept apart from the item's in results.jsonl.
"""
from __future__ import annotations

import inspect

from primefs.errors import PrimefsError
from primefs.eval.direct import DirectCaller, one_turn
from primefs.store.session import create_session


def takes_judge(bench) -> bool:
    try:
        return "judge" in inspect.signature(bench.score).parameters
    except (TypeError, ValueError):
        return False


def check_judge(bench, alias, oracle: bool) -> None:
    """A judge is asked for a benchmark that scores with one, and for a run with a model."""
    if alias is None:
        return
    if not isinstance(alias, str) or not alias.strip():
        raise PrimefsError("eval config: judge is a model alias or id")
    if not takes_judge(bench):
        raise PrimefsError(f"benchmark {bench.name} does not score with a judge (its score takes no judge)")
    if oracle:
        raise PrimefsError("--judge scores a model's answers: an --oracle run has none to judge")


class Judge:
    """Judgements of one eval run by the model `alias` of its workspace."""

    def __init__(self, ws, alias: str):
        from primefs.runner.core import Runner

        self.ws, self.alias = ws, alias
        self.settings = ws.resolve_model(alias)  # an unknown alias: PrimefsError, before any item runs
        self.runner = Runner(ws, log=lambda m: None)  # its gateway and tree only; never run()
        self.limits = ws.limits({})

    def asker(self, item_id: str, mode: str, sessions: list):
        """judge(prompt) -> reply for one answer; the judge's session ids go to `sessions`."""
        from primefs.runner.core import RunnerLock

        def judge(prompt: str) -> str:
            s = create_session(self.ws.sessions, task=f"judge the {mode} answer of {item_id}",
                               name=f"{item_id}.{mode}.judge", model=self.alias,
                               extra={"eval": True, "eval_mode": "judge"})
            self.runner.tree.put(s)
            self.runner.tree.link(s.id, None)
            sessions.append(s.id)
            lock = RunnerLock(self.ws)
            try:
                one_turn(self.runner.gateway, DirectCaller(s, self.settings, self.limits),
                         [{"role": "user", "content": prompt}], "judge", f"judge {self.alias}: one call")
            finally:
                lock.release()
            meta = s.reload()
            if meta.get("stop_reason") != "answered":
                raise PrimefsError(f"judge {self.alias} failed on {item_id} ({mode}): "
                                   f"{meta.get('error') or meta.get('stop_reason')}")
            return s.read_result() or ""

        return judge
