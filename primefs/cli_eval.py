"""`primefs eval`: run a benchmark (or its oracle) and print a summary table."""
from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

import click
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from .cliopts import ws_option
from .errors import PrimefsError


@click.command("eval")
@click.argument("bench", required=False)
@click.option("--model", "-m", help="Model for every item (alias or litellm id).")
@click.option("--n", "n", type=int, help="How many items (default 5).")
@click.option("--seed", type=int, help="Seed of the item generator (default 0).")
@click.option("--config", "config", type=click.Path(exists=True, dir_okay=False),
              help="eval.yaml fixing model, limits, budgets, end conditions, refine, concurrency, seed.")
@click.option("--out", type=click.Path(file_okay=False), help="Output folder (default eval-runs/<bench>-<time>).")
@click.option("--concurrency", "-k", type=int, help="Items running at once (default 2).")
@click.option("--oracle", is_flag=True, help="Score the benchmark's reference solver: no model at all.")
@click.option("--list", "list_", is_flag=True, help="List the benchmarks of all installed plugins.")
@click.option("--json", "as_json", is_flag=True, help="With --list: JSON. Otherwise print summary.json.")
@ws_option
@click.pass_context
def eval_cmd(ctx, bench, model, n, seed, config, out, concurrency, oracle, list_, as_json):
    """Run N items of benchmark BENCH as root sessions; write results.jsonl and summary.json.

    The items run in a fresh workspace inside the output folder, or with -w in that workspace
    (its primefs.yaml is not changed: the eval's model and limits go into each item's session)."""
    from .evaluate import load_config, run_eval
    from .plugins import benchmarks, plugin_manager
    from .workspace import find_workspace

    ws_dir = (ctx.obj or {}).get("workspace")
    ws = find_workspace(ws_dir) if ws_dir else None
    if list_:
        found = benchmarks(plugin_manager(ws.root if ws else None))
        if as_json:
            click.echo(json.dumps([{"name": k, "description": b.description} for k, b in sorted(found.items())],
                                  indent=2))
        else:
            for k, b in sorted(found.items()):
                click.echo(f"{k}: {b.description}")
        return
    cfg = load_config(config, {"model": model, "n": n, "seed": seed, "concurrency": concurrency})
    bench = bench or cfg.get("benchmark")
    if not bench:
        raise PrimefsError("name a benchmark (see `primefs eval --list`)")
    out_dir = Path(out or f"eval-runs/{bench}-{datetime.now():%Y%m%d-%H%M%S}")
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=Console(stderr=True), transient=False) as bar:
        task = bar.add_task(f"{bench}{' (oracle)' if oracle else ''}", total=cfg["n"])
        summary = run_eval(bench, cfg, out_dir, oracle=oracle, workspace=ws,
                           progress=lambda k: bar.advance(task, k))
    if as_json:
        click.echo(json.dumps(summary, indent=2))
        return
    table = Table(title=f"{bench}: {summary['items']} items, mean score {summary['mean_score']:.3f}", box=None,
                  header_style="bold")
    for col in ("", "calls", "input tokens", "output tokens", "cost $", "wall s"):
        table.add_column(col, justify="right")
    for label in ("total", "median"):
        u = summary[label]
        table.add_row(label, f"{u['calls']:g}", f"{u['input_tokens']:,.0f}", f"{u['output_tokens']:,.0f}",
                      f"{u['cost_usd']:.4f}", f"{u['wall_s']:.2f}")
    Console(highlight=False).print(table)
    click.echo(f"stop reasons: {summary['stop_reasons']}")
    click.echo(f"results: {out_dir / 'results.jsonl'}  summary: {out_dir / 'summary.json'}")
