"""Refinements that must hold up: a gate benchmark run with the harness before and after the edits.

Both runs are `primefs eval` runs in fresh workspaces under `.primefs/gates/<id>/` (before/, after/), each
given the workspace's model aliases and a copy of its global harness; `after` then gets the proposed
edits, applied as they would be here. Same benchmark, items, seed and model. The rule (docs/harness.md,
"Gated refinements"): the edits are kept when the mean score does not fall and no item that scored 1
before scores below 1 after. Any failure to run either side is an error: the edits are then never applied.
"""
from __future__ import annotations

import secrets
import shutil
import statistics
import time

from primefs.errors import PrimefsError
from primefs.eval.record import read_run
from primefs.eval.report import mean_ci
from primefs.eval.run import load_config, run_eval
from primefs.harness.commits import HarnessGit
from primefs.harness.entries import Harness
from primefs.harness.refine import Plan, apply_plan, fingerprint
from primefs.store.workspace import Workspace

DEFAULT_N = 5


def decide(before: dict, after: dict) -> dict:
    """Scores by item id, before and after -> the verdict and its figures."""
    ids = sorted(set(before) & set(after))
    if not ids:
        raise PrimefsError("the gate runs share no item")
    b, a = [before[i] for i in ids], [after[i] for i in ids]
    diff, low, high = mean_ci([y - x for x, y in zip(b, a)], (-1.0, 1.0))
    newly_failed = [i for i in ids if before[i] >= 1.0 > after[i]]
    kept = statistics.fmean(a) >= statistics.fmean(b) and not newly_failed
    return {"kept": kept, "items": len(ids), "before": round(statistics.fmean(b), 4),
            "after": round(statistics.fmean(a), 4), "diff": round(diff, 4),
            "diff_ci95": None if low is None else [round(low, 4), round(high, 4)], "newly_failed": newly_failed}


def _copy_harness(src: Workspace, dst: Workspace) -> None:
    if src.harness.is_dir():
        shutil.copytree(src.harness, dst.harness, dirs_exist_ok=True)
    HarnessGit(dst.root).commit_user_edits()  # the copy's harness as one state, committed


def _with_edits(src: Workspace, p: Plan):
    def setup(dst: Workspace) -> None:
        _copy_harness(src, dst)
        entries = Harness(dst).list(sessions=[])
        planned = {(e.kind, e.name): fingerprint(dst, e.kind, e.name, []) for e in entries}
        copy = Plan(p.edits, [], planned, p.shown, [], p.session, [], "global")
        applied, rejected = apply_plan(dst, copy)
        if not applied:
            why = "; ".join(r["reason"] for r in rejected) or "there are none"
            raise PrimefsError(f"no proposed edit can be applied: {why}")
    return setup


def run_gate(ws: Workspace, p: Plan, gate: dict, log=lambda m: None) -> dict:
    """Run the gate; returns the verdict with both runs' folders, or raises PrimefsError if it could not run."""
    if p.scope != "global":
        raise PrimefsError("a gate measures global refinements: give scope global")
    folder = ws.root / ".primefs" / "gates" / f"{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(3)}"
    model = gate.get("model") or ws.config.get("model") or "local"
    cfg = load_config(None, {"model": model, "n": int(gate.get("n") or DEFAULT_N), "seed": int(gate.get("seed") or 0)})
    scores = {}
    try:
        for side, setup in (("before", lambda dst: _copy_harness(ws, dst)), ("after", _with_edits(ws, p))):
            log(f"gate {gate['benchmark']}: {side} the edits ({cfg['n']} items, seed {cfg['seed']}, model {model})")
            run_eval(gate["benchmark"], dict(cfg), folder / side, plugins_from=(ws, "the refined workspace"),
                     setup=setup)
            rows = read_run(folder / side)[1]
            broken = [r["id"] for r in rows if r.get("stop_reason") == "error"]
            if broken:  # a model or kernel error is no score: the gate did not run
                raise PrimefsError(f"the {side} run's items {', '.join(broken)} failed (a model or kernel "
                                   "error, not a score)")
            scores[side] = {r["id"]: float(r["score"]) for r in rows}
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)  # a gate that did not run leaves no half of one
        raise
    verdict = decide(scores["before"], scores["after"])
    verdict.update(benchmark=gate["benchmark"], n=cfg["n"], seed=cfg["seed"], model=model,
                   runs=[str((folder / s).relative_to(ws.root)) for s in ("before", "after")])
    return verdict
