"""`primefs eval report RUN_DIR...`: a Markdown table and PNG plots over one or more eval runs.

Rows are grouped by (benchmark, model, mode). Per group: items, mean score with a 95% confidence
interval (Student's t over the item scores, clipped to [0, 1]), tokens, cost and wall time per item,
total cost, and failures counted by stop reason; RLM minus direct on paired items; a benchmark x
mode table. Plots: score against tokens, cost and context length, one colour per group (items faint,
group means bold).
"""
from __future__ import annotations

import json
import math
import os
import statistics
from pathlib import Path

from primefs.errors import PrimefsError
from primefs.eval.record import read_run

OK_REASONS = {"answered", "done", "oracle"}  # anything else is a failure, counted by its stop reason
# two-sided 95% Student's t by degrees of freedom; between entries the smaller df is used (wider interval)
T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228,
       12: 2.179, 15: 2.131, 20: 2.086, 25: 2.060, 30: 2.042, 40: 2.021, 60: 2.000, 120: 1.980}
PLOTS = {"tokens": ("score_vs_tokens.png", "tokens per item (input + output, whole session tree)"),
         "cost_usd": ("score_vs_cost.png", "cost per item (USD)"),
         "context_chars": ("score_vs_context.png", "context length (characters)")}


def t95(df: int) -> float:
    return T95[max(k for k in T95 if k <= df)] if df < 120 else 1.960


def mean_ci(scores: list[float], bounds: tuple[float, float] = (0.0, 1.0)) -> tuple[float, float | None, float | None]:
    """The mean and its 95% interval, clipped to `bounds` (scores 0-1; differences of scores -1 to 1)."""
    m = statistics.fmean(scores)
    if len(scores) < 2:
        return m, None, None
    half = t95(len(scores) - 1) * statistics.stdev(scores) / math.sqrt(len(scores))
    return m, max(bounds[0], m - half), min(bounds[1], m + half)


def model_label(record: dict) -> str:
    model = record.get("model")
    if not model:
        return "-"
    head, _, rest = str(model).partition("/")
    return f"{head}/{Path(rest).name}" if head == "scripted" and rest else str(model)


def load_groups(run_dirs: list[Path]) -> list[dict]:
    groups: dict[tuple, dict] = {}
    for run in run_dirs:
        record, rows = read_run(run)
        for r in rows:
            key = (record.get("benchmark"), model_label(record), r["mode"])
            g = groups.setdefault(key, {"benchmark": key[0], "model": key[1], "mode": key[2], "runs": [], "rows": []})
            if str(run) not in g["runs"]:
                g["runs"].append(str(run))
            g["rows"].append({**r, "tokens": r.get("input_tokens", 0) + r.get("output_tokens", 0)})
    if not groups:
        raise PrimefsError("no results in the given runs")
    return [groups[k] for k in sorted(groups, key=lambda k: tuple(str(x) for x in k))]


def stats(g: dict) -> dict:
    rows = g["rows"]
    mean, low, high = mean_ci([r["score"] for r in rows])
    failures: dict[str, int] = {}
    for r in rows:
        if r.get("stop_reason") not in OK_REASONS:
            failures[str(r.get("stop_reason"))] = failures.get(str(r.get("stop_reason")), 0) + 1
    return {"benchmark": g["benchmark"], "model": g["model"], "mode": g["mode"], "items": len(rows),
            "mean_score": round(mean, 4), "ci95": [round(low, 4), round(high, 4)] if low is not None else None,
            "tokens_per_item": round(statistics.fmean(r["tokens"] for r in rows), 1),
            "cost_usd": round(sum(r.get("cost_usd", 0.0) for r in rows), 6),
            "cost_usd_per_item": round(statistics.fmean(r.get("cost_usd", 0.0) for r in rows), 6),
            "wall_s_per_item": round(statistics.fmean(r.get("wall_s", 0.0) for r in rows), 2),
            "context_chars_mean": round(statistics.fmean(r.get("context_chars") or 0 for r in rows)),
            "cut_items": sum(1 for r in rows if r.get("cut_chars")),
            "failures": dict(sorted(failures.items())), "runs": g["runs"]}


def markdown_table(table: list[dict]) -> str:
    lines = ["| benchmark | model | mode | items | mean score (95% CI) | tokens/item | cost $ | cost $/item "
             "| wall s/item | failures (stop reason) | context chars (mean) | cut to window |",
             "|---|---|---|---:|---|---:|---:|---:|---:|---|---:|---:|"]
    for s in table:
        ci = f" ({s['ci95'][0]:.2f}-{s['ci95'][1]:.2f})" if s["ci95"] else ""
        fails = ", ".join(f"{k}: {v}" for k, v in s["failures"].items()) or "none"
        cut = f"{s['cut_items']} of {s['items']}" if s["mode"] == "direct" else "-"
        lines.append(f"| {s['benchmark']} | {s['model']} | {s['mode']} | {s['items']} | {s['mean_score']:.3f}{ci} "
                     f"| {s['tokens_per_item']:,.0f} | {s['cost_usd']:.4f} | {s['cost_usd_per_item']:.4f} "
                     f"| {s['wall_s_per_item']:.2f} | {fails} "
                     f"| {s['context_chars_mean']:,} | {cut} |")
    return "\n".join(lines)


def paired(groups: list[dict]) -> list[dict]:
    """RLM minus direct per benchmark and model, on the items both modes ran (same id and content)."""
    by = {(g["benchmark"], g["model"], g["mode"]): g for g in groups}
    out = []
    for (bench, model, mode), g in by.items():
        other = by.get((bench, model, "direct"))
        if mode != "rlm" or other is None:
            continue
        direct = {(r["id"], r.get("item_sha")): r["score"] for r in other["rows"]}
        diffs = [r["score"] - direct[k] for r in g["rows"] if (k := (r["id"], r.get("item_sha"))) in direct]
        if not diffs:
            continue
        mean, low, high = mean_ci(diffs, (-1.0, 1.0))
        out.append({"benchmark": bench, "model": model, "pairs": len(diffs), "rlm_minus_direct": round(mean, 4),
                    "ci95": [round(low, 4), round(high, 4)] if low is not None else None,
                    "rlm_better": sum(d > 0 for d in diffs), "direct_better": sum(d < 0 for d in diffs)})
    return out


def paired_table(pairs: list[dict]) -> str:
    lines = ["| benchmark | model | paired items | RLM - direct (95% CI) | RLM better | direct better |",
             "|---|---|---:|---|---:|---:|"]
    for p in pairs:
        ci = f" ({p['ci95'][0]:+.2f} to {p['ci95'][1]:+.2f})" if p["ci95"] else ""
        lines.append(f"| {p['benchmark']} | {p['model']} | {p['pairs']} | {p['rlm_minus_direct']:+.3f}{ci} "
                     f"| {p['rlm_better']} | {p['direct_better']} |")
    return "\n".join(lines)


def paper_table(table: list[dict]) -> str:
    """The RLM paper's form: a row per model and mode, a column per benchmark, score and cost per item."""
    benches = sorted({s["benchmark"] for s in table})
    cells = {(s["model"], s["mode"], s["benchmark"]): s for s in table}
    lines = ["| model · mode | " + " | ".join(benches) + " |", "|---|" + "---|" * len(benches)]
    for model, mode in sorted({(s["model"], s["mode"]) for s in table}):
        row = []
        for b in benches:
            s = cells.get((model, mode, b))
            row.append(f"{100 * s['mean_score']:.1f} (${s['cost_usd_per_item']:.4f})" if s else "-")
        lines.append(f"| {model} · {mode} | " + " | ".join(row) + " |")
    return "\n".join(lines)


def plot(groups: list[dict], key: str, path: Path) -> None:
    os.environ.setdefault("MPLBACKEND", "Agg")  # files only, never a window
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    _, xlabel = PLOTS[key]
    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=110)
    xs_all = [r.get(key) or 0 for g in groups for r in g["rows"]]
    for i, g in enumerate(groups):
        color = f"C{i % 10}"
        label = f"{g['benchmark']} · {g['model']} · {g['mode']}"
        xs = [r.get(key) or 0 for r in g["rows"]]
        ys = [r["score"] + (i - (len(groups) - 1) / 2) * 0.012 for r in g["rows"]]  # groups side by side
        ax.scatter(xs, ys, s=14, alpha=0.35, color=color)
        if key == "context_chars":  # mean score at each context length: a curve
            by_x: dict[float, list[float]] = {}
            for r in g["rows"]:  # items of one size differ by a few characters: 2 significant digits
                by_x.setdefault(float(f"{r.get(key) or 0:.2g}"), []).append(r["score"])
            pts = sorted((x, statistics.fmean(v)) for x, v in by_x.items())
            ax.plot([p[0] for p in pts], [p[1] for p in pts], "-o", color=color, label=label, ms=5)
        else:  # the group's mean, with its confidence interval
            mean, low, high = mean_ci([r["score"] for r in g["rows"]])
            yerr = [[mean - low], [high - mean]] if low is not None else None
            ax.errorbar([statistics.fmean(xs)], [mean], yerr=yerr, fmt="o", ms=8, color=color, capsize=4,
                        label=label)
    positive = [x for x in xs_all if x > 0]
    if positive and len(positive) == len(xs_all) and max(positive) / min(positive) > 10:
        ax.set_xscale("log")
    ax.set_ylim(-0.08, 1.08)
    ax.set_xlabel(xlabel + (" - all 0 (local or scripted model)" if key == "cost_usd" and not any(xs_all) else ""))
    ax.set_ylabel("score")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="best")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def write_report(run_dirs: list[Path], out: Path) -> dict:
    """report.md, report.json and the three PNGs in `out`; returns the report (table and files)."""
    groups = load_groups(run_dirs)
    table = [stats(g) for g in groups]
    out.mkdir(parents=True, exist_ok=True)
    files = []
    for key, (name, _) in PLOTS.items():
        plot(groups, key, out / name)
        files.append(name)
    md = markdown_table(table)
    pairs = paired(groups)
    runs = sorted({r for s in table for r in s["runs"]})
    text = ["# Eval report", "", md, "",
            "Mean score with a 95% confidence interval (Student's t over item scores, clipped to 0-1); "
            "tokens (input + output) and wall time are per item, over each item's whole session tree; "
            "cost is the total and per item. Failures: items whose last turn did not answer, by stop reason. "
            "Cut to window: direct items whose context was cut to fit the model's input window.", "",
            *(["## RLM minus direct, on the same items", "", paired_table(pairs), "",
               "Per item, the RLM score minus the direct score of the same item (same id and content); the mean "
               "with a 95% confidence interval (Student's t over the differences, clipped to -1..1).", ""]
              if pairs else []),
            "## Benchmark x mode", "", paper_table(table), "",
            "Score x 100 (the mean) and cost per item in USD, in the form of the RLM paper's tables.", "",
            *[f"![{n[:-4].replace('_', ' ')}]({n})" for n in files], "", "Runs:",
            *[f"- `{r}`" for r in runs], ""]
    (out / "report.md").write_text("\n".join(text), encoding="utf-8")
    report = {"table": table, "paired": pairs, "markdown": md, "paired_markdown": paired_table(pairs) if pairs else "",
              "paper_markdown": paper_table(table), "files": [str(out / f) for f in ["report.md", *files]]}
    (out / "report.json").write_text(json.dumps(report, indent=2), encoding="utf-8")
    return report
