"""`primefs eval`: benchmark items run as RLM sessions and/or direct prompts, scored, with exact
tree usage per item.

Everything that changes a result comes from one config (file and flags): model and provider
settings, limits, budgets, end conditions, autonomy, refine, concurrency, seed, mode, benchmark
parameters. It is written to the output folder with the resolved model settings (secrets removed),
package and plugin versions and the workspace's git commit, so `--rerun` can repeat it.
"""
from __future__ import annotations

import json
import shutil
import statistics
import threading
import time
from dataclasses import replace
from pathlib import Path

from primefs import __version__
from primefs.errors import PrimefsError
from primefs.eval.direct import run_direct, slots
from primefs.eval.items import FileBenchmark, bench_items, context_chars, find_benchmark, item_sha, plugin_source
from primefs.eval.judge import Judge, check_judge
from primefs.eval.record import differences, is_local, models_record, package_versions, read_run, scrub
from primefs.index.accounting import UsageIndex
from primefs.plugins import end_conditions, plugin_manager
from primefs.store.frontmatter import dump_yaml, load_yaml
from primefs.store.gitops import git
from primefs.store.session import context_files, create_session
from primefs.store.settings import FINISHED, check_budget, check_end_conditions, check_limits
from primefs.store.workspace import Workspace, init_workspace

CONFIG_KEYS = {"benchmark", "n", "seed", "model", "models", "limits", "budget", "end_conditions", "autonomous",
               "refine", "concurrency", "mode", "params", "scorer", "judge"}
DEFAULTS = {"seed": 0, "concurrency": 2, "refine": False, "autonomous": False, "mode": "rlm"}
DEFAULT_N = 5  # items of a generator; a file: benchmark runs all its lines
MODES = {"rlm": ("rlm",), "direct": ("direct",), "both": ("rlm", "direct")}


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
    params = {**(cfg.get("params") or {}), **(overrides.pop("params", None) or {})}
    cfg.update({k: v for k, v in overrides.items() if v is not None})
    for key in ("n", "seed", "concurrency"):
        if key == "n" and cfg.get("n") is None:
            continue
        if not isinstance(cfg[key], int) or isinstance(cfg[key], bool) or cfg[key] < (0 if key == "seed" else 1):
            raise PrimefsError(f"eval config: {key} must be a {'non-negative' if key == 'seed' else 'positive'} integer")
    if cfg["mode"] not in MODES:
        raise PrimefsError(f"eval config: mode must be one of {', '.join(MODES)}, not {cfg['mode']!r}")
    if not isinstance(params, dict) or any(isinstance(v, (dict, list)) for v in params.values()):
        raise PrimefsError("eval config: params is a mapping of names to plain values, e.g. {chars: 1000000}")
    cfg["params"] = params
    if cfg.get("budget") is not None:
        cfg["budget"] = check_budget(cfg["budget"], "eval config")
    return cfg


def prepare_workspace(out: Path, cfg: dict, given: Workspace | None,
                      around: Workspace | None = None) -> tuple[Workspace, str]:
    """The workspace and the model the items use. A fresh workspace gets the model aliases of the
    workspace the command runs in (`around`, if any), then the eval's own, in its primefs.yaml; a given
    one is left as it is (its aliases must already be there)."""
    if given is None:
        ws = init_workspace(out / "workspace")
        aliases = _aliases_of(around) if around is not None else {}
        aliases.update(cfg.get("models") or {})
        if aliases:
            conf = load_yaml(ws.root / "primefs.yaml")
            conf.setdefault("models", {}).update(aliases)
            (ws.root / "primefs.yaml").write_text(dump_yaml(conf))
            ws = Workspace(ws.root)
    else:
        ws = given
        if cfg.get("models"):
            raise PrimefsError("with -w, define model aliases in the workspace's primefs.yaml, not in the eval config")
    model = cfg.get("model") or ws.config.get("model") or "local"  # the eval's choice, not $PRIMEFS_MODEL
    if given is None:
        model = copy_scripts_in(ws, model)
    ws.resolve_model(model)  # a bad model fails here, before any item runs
    return ws, model


def _aliases_of(ws: Workspace) -> dict:
    """A workspace's model aliases, their script paths made absolute (copy_scripts_in copies them)."""
    aliases = json.loads(json.dumps(ws.config.get("models") or {}))
    for alias in aliases.values():
        if not isinstance(alias, dict):
            continue
        for key, prefix in (("script", ""), ("model", "scripted/")):
            value = alias.get(key)
            if isinstance(value, str) and value.startswith(prefix) and (key == "script" or prefix):
                path = Path(value[len(prefix):]).expanduser()
                alias[key] = prefix + str(path if path.is_absolute() else ws.root / path)
    return aliases


def copy_scripts_in(ws: Workspace, model: str) -> str:
    """Script files of scripted models must be inside the workspace: a fresh eval workspace gets a
    copy of each one named from outside (the model id and aliases are rewritten to the copy)."""
    import shutil

    def inside(given: str) -> str:
        src = Path(given).expanduser()
        if not src.is_absolute() or src.resolve().is_relative_to(ws.root):
            return given
        if not src.is_file():
            raise PrimefsError(f"script file not found: {given}")
        dest = ws.root / "scripts" / src.name
        dest.parent.mkdir(exist_ok=True)
        shutil.copyfile(src, dest)
        return dest.relative_to(ws.root).as_posix()

    conf = load_yaml(ws.root / "primefs.yaml")
    changed = False
    for alias in (conf.get("models") or {}).values():
        if isinstance(alias, dict):
            for key, prefix in (("script", ""), ("model", "scripted/")):
                value = alias.get(key)
                if isinstance(value, str) and value.startswith(prefix) and (key == "script" or prefix):
                    new = prefix + inside(value[len(prefix):])
                    changed |= new != value
                    alias[key] = new
    if changed:
        (ws.root / "primefs.yaml").write_text(dump_yaml(conf))
        ws.__dict__.pop("config", None)  # read again
    return "scripted/" + inside(model[len("scripted/"):]) if model.startswith("scripted/") else model


def _set_up(bench_name, cfg, out, oracle, workspace, plugins_from, progress, setup=None):
    """The benchmark, its items and the workspace and model they run on; PrimefsError for a mistake."""
    plugin_ws, how = (workspace, "given with -w") if workspace is not None else plugins_from
    pm = plugin_manager(plugin_ws.root if plugin_ws else None)
    bench = find_benchmark(bench_name, pm, plugin_ws, how, scorer=cfg.get("scorer"))
    check_judge(bench, cfg.get("judge"), oracle)
    if cfg.get("end_conditions") is not None:
        cfg["end_conditions"] = check_end_conditions(cfg["end_conditions"], "eval config", end_conditions(pm))
    if cfg.get("n") is None and not isinstance(bench, FileBenchmark):
        cfg["n"] = DEFAULT_N
    items = bench_items(bench, cfg.get("n"), cfg["seed"], cfg.get("params") or {})
    modes = ("oracle",) if oracle else MODES[cfg["mode"]]
    if progress:
        progress(0, total=len(items) * len(modes))
    ws, model = (None, None) if oracle else prepare_workspace(out, cfg, workspace, around=plugin_ws)
    if setup is not None and ws is not None:
        setup(ws)  # e.g. a gate's harness, before any item runs
    judge = Judge(ws, cfg["judge"]) if cfg.get("judge") else None
    return ws, model, bench, pm, items, modes, judge


def run_eval(bench_name: str, cfg: dict, out: Path, *, oracle: bool = False, workspace: Workspace | None = None,
             plugins_from: tuple = (None, "none found"), progress=None, extra_record: dict | None = None,
             setup=None) -> dict:
    """Run the items (per mode) and write config.yaml, results.jsonl and summary.json to `out`.
    `plugins_from`: (workspace, how it was found) whose plugins/*.py are loaded when no `workspace`
    is given (items then run in a fresh one); `progress(k)` is told of items done."""
    made = not out.exists()
    out.mkdir(parents=True, exist_ok=True)
    try:
        ws, model, bench, pm, items, modes, judge = _set_up(bench_name, cfg, out, oracle, workspace, plugins_from,
                                                            progress, setup)
    except PrimefsError:
        if made:  # nothing ran: no half-made run folder is left behind
            shutil.rmtree(out, ignore_errors=True)
        raise
    if ws is not None:
        check_limits(cfg.get("limits") or {}, "eval config")
    commit = git(ws.root, "rev-parse", "HEAD", check=False).stdout.strip() if ws else None
    models = models_record(ws, model)
    recorded_cfg = dict(cfg)
    if cfg.get("models"):
        recorded_cfg["models"] = scrub(cfg["models"], "models")[0]
    record = {**recorded_cfg, "benchmark": bench_name, "oracle": oracle, "model": model, "primefs_version": __version__,
              "workspace_commit": commit, "workspace": str(ws.root) if ws else None,
              "workspace_given": workspace is not None, **models,
              "versions": package_versions(is_local(models["model_settings"])),
              "benchmark_source": plugin_source(pm, bench), **(extra_record or {})}
    (out / "config.yaml").write_text(dump_yaml(record))
    rows = []
    for mode in modes:
        if mode == "oracle":
            rows += _run_oracle(bench, items, progress)
        elif mode == "direct":
            rows += _run_direct(ws, model, bench, items, cfg, progress, judge)
        else:
            rows += _run_sessions(ws, model, bench, items, cfg, progress, judge)
    with open(out / "results.jsonl", "w") as f:
        for r in rows:
            f.write(json.dumps(r, default=str) + "\n")
    summary = summarize(bench_name, rows, oracle, cfg["mode"])
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    return summary


def rerun_eval(run_dir: Path, out: Path, *, workspace: Workspace | None = None, plugins_from: tuple = (None, ""),
               progress=None) -> tuple[dict, dict, list[str]]:
    """Repeat a run from its config.yaml: (summary, differences, notes). Its workspace if it was given
    one and still exists (or `workspace`), else a fresh one with the recorded resolved aliases."""
    record, old_rows = read_run(run_dir)
    cfg = load_config(None, {k: record[k] for k in CONFIG_KEYS if record.get(k) is not None})
    notes = []
    if workspace is None and record.get("workspace_given"):
        if record.get("workspace") and (Path(record["workspace"]) / "primefs.yaml").is_file():
            workspace = Workspace(Path(record["workspace"]))
        else:
            notes.append(f"the run's workspace {record.get('workspace')} is gone: a fresh one is used")
    if workspace is None:
        cfg["models"] = {k: v for k, v in (record.get("resolved_models") or {}).items() if "error" not in v}
    else:
        cfg.pop("models", None)
    if record.get("removed_keys") and workspace is None:
        notes.append(f"not recorded, so not used: {', '.join(record['removed_keys'])} (give keys with "
                     "api_key_env, or rerun with -w in a workspace that has them)")
    summary = run_eval(record["benchmark"], cfg, out, oracle=bool(record.get("oracle")), workspace=workspace,
                       plugins_from=plugins_from, progress=progress,
                       extra_record={"rerun_of": str(Path(run_dir).resolve())})
    new_record, new_rows = read_run(out)
    diff = differences(record, new_record, old_rows, new_rows)
    (out / "rerun.json").write_text(json.dumps({"rerun_of": str(Path(run_dir).resolve()), "notes": notes,
                                                "differences": diff}, indent=2))
    return summary, diff, notes


def _row(item, mode, answer, score, usage=None, stop_reason=None, session=None, **extra) -> dict:
    u = usage or {}
    return {"id": item["id"], "mode": mode, "score": score, "expected": item["expected"], "answer": answer,
            "calls": u.get("calls", 0), "input_tokens": u.get("input_tokens", 0),
            "output_tokens": u.get("output_tokens", 0), "cost_usd": u.get("cost_usd", 0.0),
            "wall_s": round(u.get("wall_s", 0.0), 3), "stop_reason": stop_reason, "session": session,
            "context_chars": context_chars(item), "item_sha": item_sha(item), **extra}


def _run_oracle(bench, items, progress) -> list[dict]:
    rows = []
    for item in items:
        started = time.monotonic()
        answer = bench.oracle(item)
        rows.append(_row(item, "oracle", answer, float(bench.score(answer, item["expected"])),
                         {"wall_s": time.monotonic() - started}, "oracle"))
        if progress:
            progress(1)
    return rows


def _control(cfg) -> dict:
    """What goes into each item's session.yaml: budget, end conditions, limits, autonomy."""
    control = {k: cfg[k] for k in ("budget", "end_conditions") if cfg.get(k)}
    if cfg.get("limits"):
        control["limits"] = cfg["limits"]  # per item session; the workspace config stays as it is
    if cfg.get("autonomous"):
        control["autonomous"] = True
    return control


def _score(bench, item, answer, mode, judge: Judge | None, judged: list) -> float:
    if answer is None:
        return 0.0
    if judge is None:
        return float(bench.score(answer, item["expected"]))
    try:
        return float(bench.score(answer, item["expected"], judge=judge.asker(item["id"], mode, judged)))
    except ValueError as exc:  # the plugin cannot read the judge's reply
        raise PrimefsError(f"benchmark {bench.name}, item {item['id']} ({mode}): {exc}") from None


def _scored_rows(ws, bench, items, sessions, mode, judge: Judge | None = None) -> list[dict]:
    """A row per item from its session: the answer if its last turn answered, usage of its tree; with a
    judge, the judge's sessions and their usage (`judge_*`), apart from the item's."""
    scored = []
    for item in items:
        s = sessions[item["id"]]
        meta = s.reload()
        ok = meta.get("status") in ("idle", "done") and meta.get("stop_reason") in ("answered", "done")
        answer = s.read_result() if ok else None
        judged: list[str] = []
        scored.append((item, s, meta, answer, _score(bench, item, answer, mode, judge, judged), judged))
    index = UsageIndex(ws.sessions)  # after the judges' sessions were made
    rows = []
    for item, s, meta, answer, score, judged in scored:
        extra = {}
        if mode == "direct":
            extra = {k: (meta.get("direct") or {}).get(k) for k in ("context_sent_chars", "cut_chars", "window_tokens")}
        if judge is not None:
            used = [index.tree(j) for j in judged]
            extra.update(judge=judge.alias, judge_sessions=judged,
                         **{f"judge_{k}": sum(u.get(k, 0) for u in used) for k in ("calls", "input_tokens",
                                                                                   "output_tokens", "cost_usd")})
        rows.append(_row(item, mode, answer, score, index.tree(s.id), meta.get("stop_reason") or meta.get("status"),
                         s.id, **extra))
    return rows


def _run_direct(ws: Workspace, model: str, bench, items, cfg, progress, judge=None) -> list[dict]:
    sessions = run_direct(ws, model, items, cfg, _control(cfg), progress)
    return _scored_rows(ws, bench, items, sessions, "direct", judge)


def _run_sessions(ws: Workspace, model: str, bench, items, cfg, progress, judge=None) -> list[dict]:
    from primefs.runner.core import Runner

    sessions = {}
    for item in items:
        ctx = item.get("context")
        files = context_files(ctx)
        s = create_session(ws.sessions, task=item["task"], name=item["id"], model=model,
                           extra={**_control(cfg), "eval": True, "eval_mode": "rlm"}, files=files)
        sessions[item["id"]] = s
    runner = Runner(ws, log=lambda m: None)
    runner.limits = replace(runner.limits, max_concurrent_sessions=slots(ws.resolve_model(model), cfg["concurrency"]))
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
            if iid not in finished and s.reload().get("status") in FINISHED \
                    and not runner.scheduler.busy(s.id):
                finished.add(iid)
                if progress:
                    progress(1)
    if failure:
        raise failure[0]
    if cfg.get("refine"):  # one refinement per item session, after all items ran
        runner.bell.stopping = False  # run() has returned; model calls for refine are wanted again
        for s in sessions.values():
            runner.refine(s.id)
    if progress:
        progress(len(items) - len(finished))
    return _scored_rows(ws, bench, items, sessions, "rlm", judge)


SUMMED = ("calls", "input_tokens", "output_tokens", "cost_usd", "wall_s")


def _aggregate(rows: list[dict]) -> dict:
    def med(key):
        return statistics.median(r[key] for r in rows) if rows else 0

    return {"items": len(rows),
            "mean_score": round(statistics.fmean(r["score"] for r in rows), 6) if rows else 0.0,
            "total": {k: round(sum(r[k] for r in rows), 10) for k in SUMMED},
            "median": {k: med(k) for k in SUMMED},
            "stop_reasons": {r: sum(1 for x in rows if x["stop_reason"] == r) for r in {x["stop_reason"] for x in rows}}}


def summarize(bench_name: str, rows: list[dict], oracle: bool, mode: str = "rlm") -> dict:
    """The whole run, and each mode on its own (`by_mode`). `items` counts items, not rows."""
    by_mode = {}
    for r in rows:
        by_mode.setdefault(r["mode"], []).append(r)
    return {"benchmark": bench_name, "oracle": oracle, "mode": "oracle" if oracle else mode,
            **_aggregate(rows), "items": len({r["id"] for r in rows}),
            "by_mode": {m: _aggregate(rs) for m, rs in by_mode.items()}, "primefs_version": __version__}
