"""`primefs eval`: benchmark items as root sessions, scored, with exact tree usage per item.

Everything that changes a result comes from one config (file and flags): model and provider
settings, limits, budgets, end conditions, autonomy, refine, concurrency, seed. It is written to
the output folder with the primefs version and the workspace's git commit, so a run can be repeated.
"""
from __future__ import annotations

import json
import statistics
import threading
import time
from pathlib import Path

from . import __version__
from .accounting import UsageIndex
from .errors import PrimefsError
from .frontmatter import dump_yaml, load_yaml
from .gitops import git
from .goalctl import check_budget, check_end_conditions
from .plugins import benchmarks, end_conditions, plugin_manager
from .session import create_session
from .workspace import Workspace, check_limits, init_workspace

CONFIG_KEYS = {"benchmark", "n", "seed", "model", "models", "limits", "budget", "end_conditions", "autonomous",
               "refine", "concurrency"}
DEFAULTS = {"n": 5, "seed": 0, "concurrency": 2, "refine": False, "autonomous": False}


def load_config(path: str | None, overrides: dict) -> dict:
    cfg = dict(DEFAULTS)
    if path:
        data = load_yaml(Path(path))
        if not isinstance(data, dict):
            raise PrimefsError(f"{path}: an eval config is a YAML mapping")
        unknown = set(data) - CONFIG_KEYS
        if unknown:
            raise PrimefsError(f"{path}: unknown key(s) {', '.join(sorted(unknown))} (known: {', '.join(sorted(CONFIG_KEYS))})")
        cfg.update(json.loads(json.dumps(data)))  # plain data: it is copied and compared later
    cfg.update({k: v for k, v in overrides.items() if v is not None})
    for key in ("n", "seed", "concurrency"):
        if not isinstance(cfg[key], int) or isinstance(cfg[key], bool) or cfg[key] < (0 if key == "seed" else 1):
            raise PrimefsError(f"eval config: {key} must be a {'non-negative' if key == 'seed' else 'positive'} integer")
    if cfg.get("budget") is not None:
        cfg["budget"] = check_budget(cfg["budget"], "eval config")
    return cfg


def prepare_workspace(out: Path, cfg: dict, given: Workspace | None) -> tuple[Workspace, str]:
    """The workspace and the model the items use. A fresh workspace gets the eval's aliases in its
    primefs.yaml; a given one is left as it is (its aliases must already be there)."""
    if given is None:
        ws = init_workspace(out / "workspace")
        if cfg.get("models"):
            conf = load_yaml(ws.root / "primefs.yaml")
            conf.setdefault("models", {}).update(cfg["models"])
            (ws.root / "primefs.yaml").write_text(dump_yaml(conf))
            ws = Workspace(ws.root)
    else:
        ws = given
        if cfg.get("models"):
            raise PrimefsError("with -w, define model aliases in the workspace's primefs.yaml, not in the eval config")
    model = cfg.get("model") or ws.config.get("model") or "local"  # the eval's choice, not $PRIMEFS_MODEL
    ws.resolve_model(model)  # a bad model fails here, before any item runs
    return ws, model


def run_eval(bench_name: str, cfg: dict, out: Path, *, oracle: bool = False, workspace: Workspace | None = None,
             progress=None) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    pm = plugin_manager(workspace.root if workspace else None)
    found = benchmarks(pm)
    if bench_name not in found:
        raise PrimefsError(f"unknown benchmark {bench_name!r} (installed: {', '.join(sorted(found)) or 'none'}; "
                           "see `primefs eval --list`)")
    bench = found[bench_name]
    if cfg.get("end_conditions") is not None:
        cfg["end_conditions"] = check_end_conditions(cfg["end_conditions"], "eval config", end_conditions(pm))
    items = list(bench.items(cfg["n"], cfg["seed"]))
    ws, model = (None, None) if oracle else prepare_workspace(out, cfg, workspace)
    if ws is not None:
        check_limits(cfg.get("limits") or {}, "eval config")
    commit = git(ws.root, "rev-parse", "HEAD", check=False).stdout.strip() if ws else None
    (out / "config.yaml").write_text(dump_yaml({**cfg, "benchmark": bench_name, "oracle": oracle,
                                                "model": model, "primefs_version": __version__,
                                                "workspace_commit": commit,
                                                "workspace": str(ws.root) if ws else None}))
    rows = _run_oracle(bench, items, progress) if oracle else _run_sessions(ws, model, bench, items, cfg, progress)
    with open(out / "results.jsonl", "w") as f:
        for r in rows:
            f.write(json.dumps(r, default=str) + "\n")
    summary = summarize(bench_name, rows, oracle)
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    return summary


def _row(item, answer, score, usage=None, wall=0.0, stop_reason=None, session=None) -> dict:
    u = usage or {}
    return {"id": item["id"], "score": score, "expected": item["expected"], "answer": answer,
            "calls": u.get("calls", 0), "input_tokens": u.get("input_tokens", 0),
            "output_tokens": u.get("output_tokens", 0), "cost_usd": u.get("cost_usd", 0.0), "wall_s": round(wall, 3),
            "stop_reason": stop_reason, "session": session}


def _run_oracle(bench, items, progress) -> list[dict]:
    rows = []
    for item in items:
        started = time.monotonic()
        answer = bench.oracle(item)
        rows.append(_row(item, answer, float(bench.score(answer, item["expected"])), wall=time.monotonic() - started,
                         stop_reason="oracle"))
        if progress:
            progress(1)
    return rows


def _run_sessions(ws: Workspace, model: str, bench, items, cfg, progress) -> list[dict]:
    from .runner import Runner

    control = {k: cfg[k] for k in ("budget", "end_conditions") if cfg.get(k)}
    if cfg.get("limits"):
        control["limits"] = cfg["limits"]  # per item session; the workspace config stays as it is
    if cfg.get("autonomous"):
        control["autonomous"] = True
    sessions = {}
    for item in items:
        ctx = item.get("context")
        files = {} if ctx is None else ({"context.txt": ctx} if isinstance(ctx, str)
                                        else {"context.json": json.dumps(ctx, ensure_ascii=False)})
        s = create_session(ws.sessions, task=item["task"], name=item["id"], model=model,
                           extra={**control, "eval": True}, files=files)
        sessions[item["id"]] = s
    runner = Runner(ws, log=lambda m: None)
    runner.limits["max_concurrent_sessions"] = cfg["concurrency"]
    failure: list[BaseException] = []

    def run():
        try:
            runner.run(once=True)
        except BaseException as exc:  # reported after the progress loop
            failure.append(exc)

    t = threading.Thread(target=run, name="primefs-eval-runner", daemon=True)
    t.start()
    finished: set[str] = set()
    while t.is_alive():
        t.join(0.5)
        for iid, s in sessions.items():
            if iid not in finished and s.reload().get("status") in ("idle", "done", "failed", "stopped") \
                    and not runner.busy(s.id):
                finished.add(iid)
                if progress:
                    progress(1)
    if failure:
        raise failure[0]
    if cfg.get("refine"):  # one refinement per item session, after all items ran
        runner.bell.stopping = False  # run() has returned; model calls for refine are wanted again
        for s in sessions.values():
            runner.refine(s.id)
    index = UsageIndex(ws.sessions)
    rows = []
    for item in items:
        s = sessions[item["id"]]
        meta = s.reload()
        ok = meta.get("status") in ("idle", "done") and meta.get("stop_reason") in ("answered", "done")
        answer = s.read_result() if ok else None
        score = float(bench.score(answer, item["expected"])) if answer is not None else 0.0
        rows.append(_row(item, answer, score, index.tree(s.id), index.tree(s.id)["wall_s"],
                         meta.get("stop_reason") or meta.get("status"), s.id))
    if progress:
        progress(len(items) - len(finished))
    return rows


def summarize(bench_name: str, rows: list[dict], oracle: bool) -> dict:
    def med(key):
        return statistics.median(r[key] for r in rows) if rows else 0

    return {"benchmark": bench_name, "oracle": oracle, "items": len(rows),
            "mean_score": round(statistics.fmean(r["score"] for r in rows), 6) if rows else 0.0,
            "total": {k: sum(r[k] for r in rows) for k in ("calls", "input_tokens", "output_tokens", "cost_usd", "wall_s")},
            "median": {k: med(k) for k in ("calls", "input_tokens", "output_tokens", "cost_usd", "wall_s")},
            "stop_reasons": {r: sum(1 for x in rows if x["stop_reason"] == r) for r in {x["stop_reason"] for x in rows}},
            "primefs_version": __version__}
