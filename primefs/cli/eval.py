"""`primefs eval`: run a benchmark (its oracle, RLM sessions, direct prompts), repeat a run, report on runs."""
from __future__ import annotations

import json
import os
from datetime import datetime
from pathlib import Path

import click
from rich.table import Table

from primefs.cli.options import progress_bar, print_table, ws_option
from primefs.errors import PrimefsError


def plugin_workspace(ctx) -> tuple:
    """(workspace, how it was found) whose plugins/*.py are loaded, found as every command finds it;
    outside any workspace (None, where we looked): eval needs none."""
    from primefs.store.workspace import find_workspace

    ws_dir = (ctx.obj or {}).get("workspace")
    if ws_dir:
        return find_workspace(ws_dir), "given with -w"
    if os.environ.get("PRIMEFS_WORKSPACE"):
        return find_workspace(None), "from $PRIMEFS_WORKSPACE"
    try:
        ws = find_workspace(None)
        return ws, f"found from {Path.cwd()} upward"
    except PrimefsError:
        return None, f"no workspace found from {Path.cwd()} upward, and PRIMEFS_WORKSPACE is not set"


def _params(pairs) -> dict:
    from ruamel.yaml import YAML

    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise PrimefsError(f"bad --param {pair!r}: use KEY=VALUE, e.g. --param chars=1000000")
        out[key] = YAML(typ="safe").load(value) if value else ""  # 5000 -> int, true -> bool, text -> str
    return out


class EvalCommand(click.Command):
    """`primefs eval report RUN…` goes to the report command; anything else is a run."""

    def make_context(self, info_name, args, parent=None, **extra):
        if args[:1] == ["report"]:
            return report_cmd.make_context(f"{info_name} report", args[1:], parent=parent, **extra)
        return super().make_context(info_name, args, parent=parent, **extra)


@click.command("eval", cls=EvalCommand)
@click.argument("bench", required=False)
@click.option("--model", "-m", help="Model for every item (alias or litellm id).")
@click.option("--items", "-n", "n", type=int, help="How many items (default 5; a file: benchmark: all its lines).")
@click.option("--n", "n_old", type=int, hidden=True)  # the old spelling of --items
@click.option("--seed", type=int, help="Seed of the item generator (default 0).")
@click.option("--mode", type=click.Choice(["rlm", "direct", "both"]),
              help="rlm: sessions with a kernel (default); direct: one prompt with the context; both: each item both ways.")
@click.option("--param", "params", multiple=True, metavar="KEY=VALUE",
              help="A benchmark parameter, e.g. --param chars=10000000 (needle), --param lines=5000 (repeatable).")
@click.option("--scorer", help="For file: benchmarks: exact (default), contains, number, f1-set, or a benchmark's name.")
@click.option("--judge", metavar="ALIAS",
              help="A model (alias or litellm id) judging the answers, for benchmarks scored by one (aa-lcr).")
@click.option("--config", "config", type=click.Path(exists=True, dir_okay=False),
              help="eval.yaml fixing model, limits, budgets, end conditions, refine, concurrency, seed, mode.")
@click.option("--out", type=click.Path(file_okay=False), help="Output folder (default eval-runs/<bench>-<time>).")
@click.option("--concurrency", "-k", type=int, help="Items running at once (default 2).")
@click.option("--oracle", is_flag=True, help="Score the benchmark's reference solver: no model at all.")
@click.option("--rerun", type=click.Path(exists=True, file_okay=False),
              help="Repeat the run in this folder from its config.yaml and say what differs.")
@click.option("--list", "list_", is_flag=True, help="List the benchmarks of all installed plugins.")
@click.option("--json", "as_json", is_flag=True, help="With --list: JSON. Otherwise print summary.json.")
@ws_option
@click.pass_context
def eval_cmd(ctx, bench, model, n, n_old, seed, mode, params, scorer, judge, config, out, concurrency, oracle, rerun,
             list_, as_json):
    """Run N items of benchmark BENCH (a plugin's, or file:ITEMS.jsonl) and score them; write
    config.yaml, results.jsonl and summary.json. `primefs eval report RUN…` reports on runs.

    The items run in a fresh workspace inside the output folder, or with -w in that workspace
    (its primefs.yaml is not changed: the eval's model and limits go into each item's session)."""
    from primefs.eval.run import load_config, rerun_eval, run_eval
    from primefs.plugins import benchmarks, plugin_manager

    plugin_ws, how = plugin_workspace(ctx)
    ws = plugin_ws if how == "given with -w" else None
    if list_:
        found = benchmarks(plugin_manager(plugin_ws.root if plugin_ws else None))
        if as_json:
            click.echo(json.dumps([{"name": k, "description": b.description} for k, b in sorted(found.items())],
                                  indent=2))
        else:
            for k, b in sorted(found.items()):
                click.echo(f"{k}: {b.description}")
        return
    if rerun:
        if bench or config or any(v is not None for v in (model, n, n_old, seed, mode, scorer, judge, concurrency)) \
                or params or oracle:
            raise PrimefsError("--rerun takes its settings from the run's config.yaml: give only --out, -w, --json")
        out_dir = Path(out or f"{rerun.rstrip('/')}-rerun-{datetime.now():%Y%m%d-%H%M%S}")
        with progress_bar(f"rerun of {rerun}") as progress:
            summary, diff, notes = rerun_eval(Path(rerun), out_dir, workspace=ws, plugins_from=(plugin_ws, how),
                                              progress=progress)
        _show(summary, out_dir, as_json, extra={"differences": diff, "notes": notes})
        if not as_json:
            from primefs.eval.record import describe

            for line in notes:
                click.echo(f"note: {line}")
            click.echo("differences from the original run:")
            for line in describe(diff):
                click.echo(f"  {line}")
        return
    cfg = load_config(config, {"model": model, "n": n if n is not None else n_old, "seed": seed, "mode": mode,
                               "concurrency": concurrency, "scorer": scorer, "judge": judge,
                               "params": _params(params)})
    bench = bench or cfg.get("benchmark")
    if not bench:
        raise PrimefsError("name a benchmark (see `primefs eval --list`), or file:ITEMS.jsonl")
    safe = bench.replace("file:", "file-").replace("/", "_")
    out_dir = Path(out or f"eval-runs/{Path(safe).stem if bench.startswith('file:') else safe}-"
                          f"{datetime.now():%Y%m%d-%H%M%S}")
    with progress_bar(f"{bench}{' (oracle)' if oracle else ''}") as progress:
        summary = run_eval(bench, cfg, out_dir, oracle=oracle, workspace=ws, plugins_from=(plugin_ws, how),
                           progress=progress)
    _show(summary, out_dir, as_json)


def _show(summary: dict, out_dir: Path, as_json: bool, extra: dict | None = None) -> None:
    if as_json:
        click.echo(json.dumps({**summary, **(extra or {})}, indent=2))
        return
    modes = summary["by_mode"]
    title = f"{summary['benchmark']}: {summary['items']} items"
    if len(modes) == 1:
        title += f", mean score {summary['mean_score']:.3f}"
    table = Table(title=title, box=None, header_style="bold")
    for col in ("", "mean score", "calls", "input tokens", "output tokens", "cost $", "wall s"):
        table.add_column(col, justify="right")
    for mode, agg in modes.items():
        for label in ("total", "median"):
            u = agg[label]
            table.add_row(f"{mode} {label}", f"{agg['mean_score']:.3f}" if label == "total" else "",
                          f"{u['calls']:g}", f"{u['input_tokens']:,.0f}", f"{u['output_tokens']:,.0f}",
                          f"{u['cost_usd']:.4f}", f"{u['wall_s']:.2f}")
    print_table(table)
    for mode, agg in modes.items():
        click.echo(f"stop reasons ({mode}): {agg['stop_reasons']}")
    click.echo(f"results: {out_dir / 'results.jsonl'}  summary: {out_dir / 'summary.json'}")


@click.command("report")
@click.argument("runs", nargs=-1, required=True, type=click.Path(exists=True, file_okay=False))
@click.option("--out", type=click.Path(file_okay=False),
              help="Report folder (default RUN/report for one run, else eval-reports/report-<time>).")
@click.option("--json", "as_json", is_flag=True, help="Print the table as JSON instead of Markdown.")
def report_cmd(runs, out, as_json):
    """Report on eval runs: a Markdown table per benchmark, model and mode (mean score with a 95%
    confidence interval, tokens, cost, wall time, failures by stop reason), RLM minus direct on paired
    items, a benchmark x mode table, and PNG plots of score against tokens, cost and context length.
    Writes report.md, report.json and the PNGs; prints the tables."""
    from primefs.eval.report import write_report

    out_dir = Path(out) if out else (Path(runs[0]) / "report" if len(runs) == 1
                                     else Path(f"eval-reports/report-{datetime.now():%Y%m%d-%H%M%S}"))
    report = write_report([Path(r) for r in runs], out_dir)
    if as_json:
        click.echo(json.dumps(report, indent=2))
        return
    click.echo(report["markdown"])
    if report["paired_markdown"]:
        click.echo("\nRLM minus direct, on the same items:\n" + report["paired_markdown"])
    click.echo("\nBenchmark x mode (score x 100, cost per item):\n" + report["paper_markdown"])
    click.echo(f"\nreport: {out_dir / 'report.md'}  plots: " + ", ".join(Path(f).name for f in report["files"][1:]))
