"""Reading commands: `primefs status`, `primefs log`, `primefs usage`."""
from __future__ import annotations

import json
from collections import Counter

import click

from primefs.cli.options import print_table, workspace, write_json_array, ws_option
from primefs.errors import PrimefsError
from primefs.index.accounting import Forest, UsageIndex, tops, tree_order, tree_texts
from primefs.index.database import RECORD_KEYS
from primefs.index.db import Index, find_session
from primefs.store import fastjson
from primefs.store.control import lock_held
from primefs.store.fsutil import read_json_dict
from primefs.store.session import subtree
from primefs.store.summary import CACHE_FIELDS, META
from primefs.views.console import err, out
from primefs.views.sessions import FINISHED_TREES, Row, arrange, table, unread_trees


STATUS_COLUMNS = ("id", *META, "turns", "result", "usage", "broken")  # what session_record reads of a row
LIGHT_COLUMNS = ("id", "parent", "broken", "status", "goal")  # what folding and goal_problems need (Forest: 3 first)


def broken_record(sid: str, why: str, usage: dict) -> dict:
    """A broken session's record: shown as broken, with why; its history still counts."""
    return {"id": sid, "name": None, "parent": None, "depth": 0, "status": "broken", "stop_reason": None,
            "error": why, "model": None, "goal": None, "created": None, "updated": None, "turns": None,
            "result": None, "node": None, "approval": None, "usage": usage, "tree_usage": usage}


def session_record(index: UsageIndex, sid: str) -> dict:
    if sid in index.broken:
        return broken_record(sid, index.broken[sid], index.own[sid])
    row = index.sessions[sid].row  # (STATUS_COLUMNS: META, turns, result; turns and result: resumed, not new)
    record = {k: row[k] for k in RECORD_KEYS}
    record["depth"] = record["depth"] or 0
    record["usage"], record["tree_usage"] = index.own[sid], index.tree(sid)
    return record


# status --json: each session's record but its usage is as the index keeps it (database.RECORD, text: a dict per
# session and its encoding cost a second at 50,000 sessions); its usage is printed as stored where it is compact
# and current (json_status), and the tree usage of sessions with children as the index keeps it (Index.kept_trees)
JSON_COLUMNS = (*LIGHT_COLUMNS, "record", "usage")
CACHE_MARK = f'"{CACHE_FIELDS[0]}"'
CUT = ',"interrupted":true'


def in_order(ws, index: Forest, session: str | None) -> tuple[list[str], str | None]:
    """Every session in tree order, or only SESSION's tree (and its root id)."""
    shown = tree_order(index)
    if not session:
        return shown, None
    root = find_session(ws.sessions, session).id
    wanted = set(subtree(index.children, root))
    return [sid for sid in shown if sid in wanted], root


def json_status(ws, session: str | None) -> tuple[list[str], list[tuple]]:
    """`status --json` (of SESSION's tree, if given): each session's record as a line of JSON, and the rows of
    every session (JSON_COLUMNS, LIGHT_COLUMNS first: for goal_problems). Usage is parsed only where a tree sum
    is made: of a session with children that changed below since the index kept its sum; a leaf's tree usage is
    its own."""
    with Index(ws.root) as db:
        version = db.data_version()  # (before the rows are read: a sum made from them is kept only if still true)
        table = db.sync(columns=JSON_COLUMNS, raw=True)
        forest, rows = Forest(table), {r[0]: r for r in table}
        own: dict = {}

        def load(ids: list[str]) -> dict:  # (their usage is parsed; of other sessions it is printed as stored)
            own.update((sid, row["usage"]) for sid, row in db.rows(ids, columns=("id", "usage")).items())
            return own

        shown, _ = in_order(ws, forest, session)
        kept = db.kept_trees()
        trees, made, dropped = tree_texts(forest, shown, kept, load)
        if not session and (made or dropped or "" in kept.values()):
            db.keep_trees(made, dropped, version)  # (of every tree only: what changed elsewhere stays marked)
        # a usage is printed as stored if compact and with cached tokens counted; not so if stored by an earlier
        # primefs: then parsed, and dumped as Index.rows gives it
        unprinted = {sid for sid in shown if sid in forest.broken or not (u := rows[sid][6])
                     or CACHE_MARK not in u or '": ' in u}
        if unprinted:
            load(sorted(unprinted))
    interrupted = not lock_held(ws)  # cut off mid-turn by a runner that stopped: not at work now
    lines = []
    for sid in shown:
        _, _, broken, status, _, record, mine = rows[sid]
        if broken:
            lines.append(fastjson.dumps(broken_record(sid, broken, own[sid])))
            continue
        if sid in unprinted:
            mine = fastjson.dumps(own[sid])
        cut = CUT if interrupted and status == "running" else ""
        lines.append(f'{record[:-1]},"usage":{mine},"tree_usage":{trees.get(sid, mine)}{cut}}}')
    return lines, table


def folded(ws) -> tuple[UsageIndex, list, list[tuple]]:
    """`status` as it folds (no --all, SESSION or --json), at any number of sessions: the light rows of every
    session say which trees it shows; only their sessions are read whole. Returns the usage index of those,
    the display order (an id, or a Row standing for a tree folded into the "+N older trees" line unread),
    and the light rows of every session (LIGHT_COLUMNS, for goal_problems)."""
    with Index(ws.root) as db:
        light = db.sync(columns=LIGHT_COLUMNS, raw=True)
        every, status = Forest(light), {r[0]: r[3] for r in light}
        trees = [(top, subtree(every.children, top)) for top in tops(every)]
        counts = [(top, Counter("broken" if m in every.broken else status[m] for m in members))
                  for top, members in trees]
        unread = unread_trees(counts, FINISHED_TREES)
        read = [sid for top, members in trees if top not in unread for sid in members]
        index = UsageIndex(rows=db.rows(read, columns=STATUS_COLUMNS) if read else {})
    shown: list = []
    for (top, members), (_, c) in zip(trees, counts):
        shown += [Row(id=top, name=top, parent=None, status=status[top], counts=c)] if top in unread else members
    return index, shown, light


def goal_problems(ws, light: list[tuple]) -> list[str]:
    """Broken harness files, and goals not yet picked up: waiting, or broken (with file and line). `light`: the
    index's rows of every session, LIGHT_COLUMNS first."""
    from primefs.harness.entries import Harness
    from primefs.plugins import end_conditions, plugin_manager
    from primefs.runner.intake import REJECTED
    from primefs.store.goals import goal_listing, parse_goal
    from primefs.store.session import broken_goal_line

    taken = {r[4] for r in light if not r[2]}
    taken |= {broken_goal_line(ws.sessions / r[0] / "session.yaml") for r in light if r[2]}
    conditions = None
    with Index(ws.root) as db:  # with a runner up, which sessions have a harness folder is known: no stat of each
        holders = db.harness_sessions()
    problems = [f"error: harness file skipped: {e.problem}"
                for e in Harness(ws).list(all_sessions=True, holders=holders) if e.problem]
    problems += [f"error: session broken: {r[2]}" for r in light if r[2]]
    files, strays = goal_listing(ws)
    problems += [f"error: {stray}" for stray in strays]
    running = lock_held(ws)
    refused = read_json_dict(ws.state / REJECTED) if running else {}
    for path in files:
        rel = path.relative_to(ws.root).as_posix()
        if rel in taken:
            continue
        seen = refused.get(rel)
        try:
            if isinstance(seen, dict) and seen.get("mtime") == path.stat().st_mtime:
                problems.append(f"error: rejected by the runner: {seen.get('error')}")
                continue
        except OSError:
            continue
        if conditions is None:
            conditions = end_conditions(plugin_manager(ws.root))
        try:
            parse_goal(ws, path, conditions)
            problems.append(f"{rel}: " + ("new, the runner takes it within seconds" if running else
                                          "waiting for a runner (start one: primefs up)"))
        except PrimefsError as exc:
            problems.append(f"error: {exc}")
    return problems



def status_row(r: dict) -> Row:
    tu = r["tree_usage"]
    said = r["stop_reason"] in (None, "", r["status"]) or r["status"] in ("done", "running")
    label = r["status"] + ("" if said else f" ({r['stop_reason']})")
    if r.get("interrupted"):
        label = "interrupted"
    elif r.get("approval"):
        label = f"waiting: approval {r['approval']}"
    detail = r["error"] if r["status"] in ("failed", "broken") else (r["result"] or r["goal"] or "")
    return Row(id=r["id"], name=r["name"] or r["id"], parent=r["parent"], status=r["status"], label=label,
               turns=r["turns"], tokens=tu["input_tokens"] + tu["output_tokens"], cost=tu["cost_usd"],
               detail=detail or "", node=r.get("node"))


@click.command()
@click.argument("session", required=False)
@click.option("-a", "--all", "show_all", is_flag=True, help="Every session; without it, finished children are "
              f"folded into a count under their parent, and finished trees but the newest {FINISHED_TREES} into "
              "one line.")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list, one object per session.")
@ws_option
@click.pass_context
def status(ctx, session, show_all, as_json):
    """The sessions as trees (SESSION: one session and its whole subtree): status, turns, tokens and
    cost of each tree, the result; then goals not running yet, and files that are broken.

    Trees with a session at work come first; finished children are folded into a count (a failed one
    stays visible), and older finished trees into one line, unless --all or SESSION is given. Tokens
    and cost include all descendants.
    """
    ws = workspace(ctx)
    if as_json:
        lines, light = json_status(ws, session)
        write_json_array(lines)
        for p in [] if session else goal_problems(ws, light):
            if p.startswith("error:"):
                err().print(p, markup=False, soft_wrap=True)
        return
    if show_all or session:
        index = UsageIndex(ws.sessions, columns=STATUS_COLUMNS)
        shown, root = in_order(ws, index, session)
        light = [tuple(r.get(k) for k in LIGHT_COLUMNS) for r in index.rows.values()]
    else:
        index, shown, light = folded(ws)
        root = None
    records = [session_record(index, sid) for sid in shown if isinstance(sid, str)]
    if not lock_held(ws):  # cut off mid-turn by a runner that stopped: not at work now
        for r in records:
            if r["status"] == "running":
                r["interrupted"] = True
    problems = [] if session else goal_problems(ws, light)
    console = out()
    if records:
        by_id = {r["id"]: status_row(r) for r in records}
        items = arrange([by_id[x] if isinstance(x, str) else x for x in shown], fold=not show_all, root=root,
                        trees=FINISHED_TREES)
        width = console.width if console.is_terminal else max(console.width, 160)  # piped: ids and whole names
        print_table(table(items, width, last="goal / result"), width)
    else:
        console.print("no sessions yet")
    for line in notes(records):
        console.print(line, markup=False, soft_wrap=True)
    for p in problems:
        (err() if p.startswith("error:") else console).print(p, markup=False, soft_wrap=True)


MAX_ERRORS = 10


def notes(records: list[dict]) -> list[str]:
    """What the table cuts short or cannot say: each failure's whole error, sessions that resume."""
    failed = [r for r in records if r["status"] in ("failed", "broken") and r["error"]]
    lines = [f"error: {r['name'] or r['id']} ({r['id']}): {r['error']}" for r in failed[-MAX_ERRORS:]]
    if len(failed) > MAX_ERRORS:
        lines.insert(0, f"{len(failed)} sessions failed; the last {MAX_ERRORS}:")
    cut = sum(1 for r in records if r.get("interrupted"))
    if cut:
        lines.append(f"{cut} session{'s were' if cut > 1 else ' was'} interrupted (no runner is running): "
                     "the turn goes on where it stopped when a runner starts (primefs up)")
    return lines


@click.command()
@click.argument("session")
@click.option("-n", "--count", "last", type=int, default=None, metavar="N",
              help="Only the last N events (with -f: of those already there).")
@click.option("-f", "--follow", "follow_", is_flag=True, help="Keep printing new events as they are appended "
              "(Ctrl-C stops, exit 0).")
@click.option("--new", "only_new", is_flag=True, help="With -f: none of the events already there, only new ones.")
@click.option("--json", "as_json", is_flag=True, help="Print the raw events, one JSON object per line.")
@ws_option
@click.pass_context
def log(ctx, session, last, follow_, only_new, as_json):
    """Show a session's history (SESSION: id or name; also an archived session's).

    Piped or redirected it is a faithful transcript (plain text as recorded, nothing wrapped); on a
    terminal it has colours, and prose is wrapped to the width (code and output never are).
    """

    from primefs.cli.live import follow_events
    from primefs.index.archived import find_readable
    from primefs.index.db import session_names

    ws = workspace(ctx)
    s = find_readable(ws, session)  # in sessions/, else in an archive
    names = session_names(ws.sessions)
    if last is not None and last < 0:
        raise PrimefsError("-n must be 0 or more")
    if s.dir is None:  # archived: its history no longer changes
        if follow_:
            raise PrimefsError(f"{s.id} is archived ({s.place}): its history no longer changes; drop -f")
        events = s.events()
        events = events[-last:] if last else ([] if last == 0 else events)
        if as_json:
            for e in events:
                click.echo(json.dumps(e, ensure_ascii=False))
        else:
            from primefs.views.events import print_events

            print_events(out(), s, events, names)
        return
    follow_events(s, out(), names=names, last=last, keep=follow_, only_new=only_new,
                  as_json=as_json)


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
    from rich.table import Table

    table = Table(box=None, header_style="bold")
    table.add_column("")
    cached = data["tree"]["cache_read_tokens"] or data["tree"]["cache_write_tokens"]  # a column only if any
    for f in ("calls", "input_tokens", *(["cached r/w"] if cached else []), "output_tokens", "cost_usd", "wall_s"):
        table.add_column(f, justify="right")
    for label in ("own", "tree"):
        u = data[label]
        table.add_row(label, str(u["calls"]), f"{u['input_tokens']:,}",
                      *([f"{u['cache_read_tokens']:,}/{u['cache_write_tokens']:,}"] if cached else []),
                      f"{u['output_tokens']:,}", f"{u['cost_usd']:.6f}", f"{u['wall_s']:.2f}")
    print_table(table)
    tools = data["tree"]["tools"]
    if tools:
        console = out()
        console.print("tool calls (tree):", highlight=False)
        for name, t in sorted(tools.items()):
            console.print(f"  {name}: {t['calls']} call(s), {t['errors']} failed, {t['seconds']:.2f} s", highlight=False)
    if data["tree"]["cost_unknown_calls"]:
        err().print(f"note: {data['tree']['cost_unknown_calls']} call(s) had no known price; counted as $0",
                    highlight=False)


def _usage_tree(index: UsageIndex, root: str) -> None:
    from rich.tree import Tree

    def label(sid: str) -> str:
        o, t = index.own[sid], index.tree(sid)
        name = index.sessions[sid].meta.get("name") if sid in index.sessions else "(broken: see primefs status)"
        return (f"[bold]{sid}[/bold] {name} - own: {o['calls']} calls, {o['input_tokens'] + o['output_tokens']:,} "
                f"tokens, ${o['cost_usd']:.4f} | total: {t['calls']} calls, "
                f"{t['input_tokens'] + t['output_tokens']:,} tokens, ${t['cost_usd']:.4f}")

    top = Tree(label(root))
    stack = [(root, top)]
    while stack:
        sid, node = stack.pop()
        for child in sorted(index.children.get(sid, [])):
            stack.append((child, node.add(label(child))))
    print_table(top, 100_000)  # piped: one line per session, never wrapped
