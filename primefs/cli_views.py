"""Reading commands: `primefs status`, `primefs log`, `primefs usage`."""
from __future__ import annotations

import json
import sys
import time

import click
from rich.console import Console
from rich.table import Table

from .accounting import UsageIndex, tree_order
from .cliopts import workspace, ws_option
from .errors import PrimefsError
from .goals import goal_listing, parse_goal
from .session import find_session

err = Console(stderr=True, highlight=False)


def _short(text: str | None, n: int = 60) -> str:
    if not text:
        return ""
    text = " ".join(text.split())
    return text if len(text) <= n else text[: n - 1] + "…"


def session_record(index: UsageIndex, sid: str) -> dict:
    if sid in index.broken:  # shown as broken, with why; its history still counts
        return {"id": sid, "name": None, "parent": None, "depth": 0, "status": "broken", "stop_reason": None,
                "error": index.broken[sid], "model": None, "goal": None, "created": None, "updated": None,
                "turns": None, "result": None, "node": None, "usage": index.own[sid], "tree_usage": index.tree(sid)}
    s = index.sessions[sid]
    m = s.meta
    return {"id": s.id, "name": m.get("name"), "parent": m.get("parent"), "depth": m.get("depth") or 0,
            "status": m.get("status"), "stop_reason": m.get("stop_reason"), "error": m.get("error"),
            "model": m.get("model"), "goal": m.get("goal"), "created": m.get("created"),
            "updated": m.get("updated"), "turns": s.row["turns"], "result": s.row["result"],
            "node": m.get("node"),  # the Ray node of its kernel (None: this machine)
            "usage": index.own[sid], "tree_usage": index.tree(sid)}


def goal_problems(ws, index: UsageIndex) -> list[str]:
    """Broken harness files, and goals not yet picked up: waiting, or broken (with file and line)."""
    from .harness import Harness
    from .plugins import end_conditions, plugin_manager
    from .session import broken_goal_line

    taken = {s.meta.get("goal") for s in index.sessions.values()}
    taken |= {broken_goal_line(ws.sessions / sid / "session.yaml") for sid in index.broken}
    conditions = None
    problems = [f"error: harness file skipped: {e.problem}" for e in Harness(ws).list(all_sessions=True) if e.problem]
    problems += [f"error: session broken: {p}" for p in index.problems]
    files, strays = goal_listing(ws)
    problems += [f"error: {stray}" for stray in strays]
    for path in files:
        rel = path.relative_to(ws.root).as_posix()
        if rel in taken:
            continue
        if conditions is None:
            conditions = end_conditions(plugin_manager(ws.root))
        try:
            parse_goal(ws, path, conditions)
            problems.append(f"{rel}: waiting for a runner")
        except PrimefsError as exc:
            problems.append(f"error: {exc}")
    return problems


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list, one object per session.")
@ws_option
@click.pass_context
def status(ctx, as_json):
    """Show every session (as a tree) with status, turns, tokens and cost, and goals not yet running."""
    ws = workspace(ctx)
    index = UsageIndex(ws.sessions)
    records = [session_record(index, sid) for sid in tree_order(index)]
    problems = goal_problems(ws, index)
    if as_json:
        click.echo(json.dumps(records, indent=2, default=str))
        for p in problems:
            if p.startswith("error:"):
                err.print(p, markup=False, soft_wrap=True)
        return
    out = Console(highlight=False)
    if records:
        table = Table(box=None, header_style="bold")
        table.add_column("session", no_wrap=True)
        table.add_column("name", max_width=24, overflow="ellipsis")
        table.add_column("status", no_wrap=True)
        nodes = any(r["node"] for r in records)  # kernels on Ray nodes: where each session's runs
        if nodes:
            table.add_column("node", no_wrap=True)
        for col in ("turns", "tokens", "cost $"):
            table.add_column(col, justify="right", no_wrap=True)
        table.add_column("goal / result", overflow="fold", ratio=1)
        for r in records:
            tu = r["tree_usage"]
            state = r["status"] + (f" ({r['stop_reason']})" if r["stop_reason"] and r["status"] != "done" else "")
            detail = r["error"] if r["status"] in ("failed", "broken") else (r["result"] or r["goal"] or "")
            where = [r["node"] or "local"] if nodes else []
            table.add_row("  " * int(r["depth"] or 0) + r["id"], r["name"] or "", state, *where,
                          str(r["turns"] or "?"), f"{tu['input_tokens'] + tu['output_tokens']:,}",
                          f"{tu['cost_usd']:.4f}", _short(detail))
        out.print(table)
    else:
        out.print("no sessions yet")
    for p in problems:
        (err if p.startswith("error:") else out).print(p, markup=False, soft_wrap=True)


@click.command()
@click.argument("session")
@click.option("--json", "as_json", is_flag=True, help="Print the raw events, one JSON object per line.")
@click.option("-f", "--follow", "follow_", is_flag=True, help="Keep printing new events as they are appended "
              "(Ctrl-C stops).")
@ws_option
@click.pass_context
def log(ctx, session, as_json, follow_):
    """Show a session's history (SESSION: id or name)."""
    from .archived import find_readable
    from .logview import print_events

    ws = workspace(ctx)
    s = find_readable(ws, session)  # in sessions/, else in an archive
    if follow_ and s.dir is None:
        raise PrimefsError(f"{s.id} is archived ({s.place}): its history no longer changes; drop -f")
    from .session import session_names

    names = session_names(ws.sessions)
    if not follow_:
        if as_json:
            for e in s.events():
                click.echo(json.dumps(e, ensure_ascii=False))
        else:
            print_events(Console(highlight=False), s, s.events(), names)
        return
    from .live import HistoryReader, follow

    try:
        if not as_json:
            follow(s, Console(highlight=False), names=names)
        reader = HistoryReader(s.dir / "history.jsonl")
        while True:  # raw events as they are appended, one JSON object per line
            for e in reader.read():
                click.echo(json.dumps(e, ensure_ascii=False))
            sys.stdout.flush()
            time.sleep(0.2)
    except KeyboardInterrupt:
        pass


@click.command()
@click.argument("session")
@click.option("--json", "as_json", is_flag=True, help='Print {"session", "own", "tree"}.')
@click.option("--tree", "as_tree", is_flag=True, help="Print every descendant with its own and total figures.")
@ws_option
@click.pass_context
def usage(ctx, session, as_json, as_tree):
    """Tokens, calls, cost and time of a session, and of it with all its descendants."""
    ws = workspace(ctx)
    s = find_session(ws.sessions, session)
    index = UsageIndex(ws.sessions, root=s.id)
    data = {"session": s.id, "own": index.own[s.id], "tree": index.tree(s.id)}
    if as_json:
        click.echo(json.dumps(data, indent=2))
        return
    if as_tree:
        _usage_tree(index, s.id)
        return
    table = Table(box=None, header_style="bold")
    table.add_column("")
    for f in ("calls", "input_tokens", "output_tokens", "cost_usd", "wall_s"):
        table.add_column(f, justify="right")
    for label in ("own", "tree"):
        u = data[label]
        table.add_row(label, str(u["calls"]), f"{u['input_tokens']:,}", f"{u['output_tokens']:,}",
                      f"{u['cost_usd']:.6f}", f"{u['wall_s']:.2f}")
    Console(highlight=False).print(table)
    tools = data["tree"]["tools"]
    if tools:
        out = Console(highlight=False)
        out.print("tool calls (tree):", highlight=False)
        for name, t in sorted(tools.items()):
            out.print(f"  {name}: {t['calls']} call(s), {t['errors']} failed, {t['seconds']:.2f} s", highlight=False)
    if data["tree"]["cost_unknown_calls"]:
        err.print(f"note: {data['tree']['cost_unknown_calls']} call(s) had no known price; counted as $0",
                  highlight=False)


def _usage_tree(index: UsageIndex, root: str) -> None:
    from rich.tree import Tree

    def label(sid: str) -> str:
        o, t = index.own[sid], index.tree(sid)
        name = index.sessions[sid].meta.get("name")
        return (f"[bold]{sid}[/bold] {name} - own: {o['calls']} calls, {o['input_tokens'] + o['output_tokens']:,} "
                f"tokens, ${o['cost_usd']:.4f} | total: {t['calls']} calls, "
                f"{t['input_tokens'] + t['output_tokens']:,} tokens, ${t['cost_usd']:.4f}")

    top = Tree(label(root))
    stack = [(root, top)]
    while stack:
        sid, node = stack.pop()
        for child in sorted(index.children.get(sid, [])):
            stack.append((child, node.add(label(child))))
    Console(highlight=False).print(top)
