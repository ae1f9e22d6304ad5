"""One session from the command line: `ask` (a goal, its answer), `wait`, `result`, `exec`, `kernel`.

Exit codes (docs/cli.md): 0 the session ended without failure (idle or done), 3 it failed or was
stopped, 124 `--timeout` passed first; 1 a mistake (unknown session, no runner for exec, ...).
"""
from __future__ import annotations

import sys
import threading
import time

import click

from primefs.cli.options import emit, json_option, workspace, ws_option
from primefs.errors import PrimefsError
from primefs.index.db import find_session
from primefs.store.session import Session
from primefs.views.console import echo, err

FAILED_EXIT, TIMEOUT_EXIT = 3, 124


def outcome(s: Session) -> dict:
    m = s.reload()
    return {"session": s.id, "name": m.get("name"), "status": m.get("status"), "stop_reason": m.get("stop_reason"),
            "error": m.get("error"), "result": s.read_result()}


def finish(ctx, s: Session, as_json: bool) -> None:
    """Print the answer (stdout) or why there is none (stderr); exit 0, or 3 if it failed or was stopped."""
    out = outcome(s)
    failed = out["status"] in ("failed", "stopped")
    if as_json:
        emit(True, out, "")
    else:
        if out["result"] is not None:
            echo(out["result"].rstrip("\n"))
        if failed or out["result"] is None:
            why = f" ({out['stop_reason']})" if out["stop_reason"] else ""
            err().print(f"{s.name} is {out['status']}{why}" + (f": {out['error']}" if out["error"] else ""),
                      markup=False, soft_wrap=True)
    ctx.exit(FAILED_EXIT if failed else 0)


timeout_option = click.option("--timeout", type=click.FloatRange(min=0), metavar="S",
                              help="Give up after S seconds (exit code 124); default: wait as long as it takes.")


@click.command()
@click.argument("session")
@timeout_option
@json_option
@ws_option
@click.pass_context
def wait(ctx, session, timeout, as_json):
    """Wait until SESSION (id or name) has ended its work (idle, done, failed or stopped, with no mail
    waiting), then print its result. Exit code: 0 ended well, 3 failed or stopped, 124 timed out."""
    from primefs.api import Workspace
    from primefs.errors import Timeout
    from primefs.store.control import lock_held

    ws = workspace(ctx)
    started = time.monotonic()
    try:
        handle = Workspace(ws.root).session(session)
    except PrimefsError:  # `primefs goal --name X && primefs wait X`: its goal may not be taken yet
        goal = _waiting_goal(ws, session)
        if goal is None:
            raise
        if not lock_held(ws) and not _keep_alive(ws, None):
            err().print(f"note: no runner is running: {goal} waits for one (primefs up)", markup=False)
        try:
            handle = Workspace(ws.root).taken(goal, timeout=timeout, run=False)
        except Timeout as exc:
            err().print(f"error: {exc}", markup=False)
            ctx.exit(TIMEOUT_EXIT)
    if not handle.ended and not lock_held(ws) and not _keep_alive(ws, None):
        err().print("note: no runner is running: waiting for one to start (primefs up)", markup=False)
    left = None if timeout is None else max(0.0, timeout - (time.monotonic() - started))
    try:
        handle.wait(left, run=False)
    except Timeout:
        err().print(f"error: {handle.name} is still {handle.status} after {timeout:g} s", markup=False)
        ctx.exit(TIMEOUT_EXIT)
    finish(ctx, handle.session, as_json)


@click.command()
@click.argument("session")
@json_option
@ws_option
@click.pass_context
def result(ctx, session, as_json):
    """Print SESSION's result (its result.md): the answer of its last turn that gave one."""
    ws = workspace(ctx)
    s = find_session(ws.sessions, session)
    out = outcome(s)
    if out["result"] is None and not as_json:
        raise PrimefsError(f"{s.name} has no result yet (status: {out['status']})")
    emit(as_json, out, (out["result"] or "").rstrip("\n"))


@click.command()
@click.argument("text")
@click.option("--model", "-m", help="Model: an alias from primefs.yaml or a litellm model id.")
@click.option("--context", "-c", "context", multiple=True, metavar="FILE",
              help="A file inside the workspace handed to the agent as `context` (repeatable).")
@click.option("--verbose", "-v", is_flag=True, help="Show the steps as they happen (on stderr).")
@click.option("--keep-alive", "keep_alive", type=click.FloatRange(min=0), metavar="S",
              help="With no runner up, start one in the background that stays up until it has had no work for "
                   "S seconds, so the next ask finds it warm (0: run in this process; default: keep_alive_s "
                   "in primefs.yaml, else 0).")
@timeout_option
@json_option
@ws_option
@click.pass_context
def ask(ctx, text, model, context, verbose, keep_alive, timeout, as_json):
    """Ask TEXT and print the answer: a goal, run until its session answers. TEXT '-' reads stdin.

    With a runner up (primefs up), it does the work; otherwise one runs in this process until the
    answer is there (other goals it picks up meanwhile go on at the next runner start), or, with
    --keep-alive S, one starts in the background and stays up for the next asks.
    Exit code: 0 answered, 3 failed or stopped, 124 timed out.
    """
    from pathlib import Path

    from primefs.api import Workspace
    from primefs.errors import Timeout
    from primefs.store.control import lock_held

    ws = workspace(ctx)
    if text == "-":
        text = sys.stdin.read()
    resident = lock_held(ws) or _keep_alive(ws, keep_alive)
    deadline = None if timeout is None else time.monotonic() + timeout
    try:
        handle = Workspace(ws.root).submit(text, model=model, context=[Path(c) for c in context] or None,
                                           timeout=timeout)
    except Timeout as exc:
        err().print(f"error: {exc}", markup=False)
        ctx.exit(TIMEOUT_EXIT)
    stop = threading.Event()
    if verbose:
        from primefs.cli.live import follow

        threading.Thread(target=follow, args=(handle.session, err(), stop), kwargs={"header": False},
                         daemon=True).start()
    try:
        handle.wait(None if deadline is None else max(0.0, deadline - time.monotonic()))
    except Timeout:
        if resident:
            err().print(f"error: no answer within {timeout:g} s ({handle.name} goes on under the runner: "
                        f"primefs wait {handle.id})", markup=False)
        else:  # the runner of this process stops with it: the turn is cut off, not going on
            err().print(f"error: no answer within {timeout:g} s: {handle.name}'s turn was cut off; it goes on when "
                        f"a runner starts (primefs up), and primefs wait {handle.id} then waits for it", markup=False)
        ctx.exit(TIMEOUT_EXIT)
    finally:
        stop.set()
    finish(ctx, handle.session, as_json)


def _keep_alive(ws, seconds: float | None) -> bool:
    """With no runner up: start a keep-alive runner for `seconds` (None: `keep_alive_s` of primefs.yaml;
    0: none). True once a runner is up."""
    from primefs.cli.daemon import keep_alive

    seconds = ws.config.get("keep_alive_s", 0) if seconds is None else seconds
    return bool(seconds) and keep_alive(ws, seconds)


def _waiting_goal(ws, name: str) -> str | None:
    """The goal file a session named `name` will come from (its file name or `name:`), if one waits."""
    from primefs.store.goals import goal_listing, parse_goal

    files, _ = goal_listing(ws)
    for path in files:
        try:
            if path.stem == name or parse_goal(ws, path).name == name:
                return path.relative_to(ws.root).as_posix()
        except PrimefsError:
            continue
    return None


@click.command("exec")
@click.argument("session")
@click.argument("code")
@json_option
@ws_option
@click.pass_context
def exec_cmd(ctx, session, code, as_json):
    """Run CODE in SESSION's live kernel and print what it printed. CODE '-' reads stdin.

    It runs between the steps of a turn (or at once when none runs; an idle session's kernel is
    started, with its variables restored), and is recorded in the session's history as the user's.
    The model is not told; `primefs send` it a message if it should know. Needs a running runner.
    Exit code: 0, or 1 when the code raised (the error is printed on stderr).
    """
    from primefs.runner.liverequests import BUSY_WAIT_S
    from primefs.store.control import ask_runner

    ws = workspace(ctx)
    s = find_session(ws.sessions, session)
    if code == "-":
        code = sys.stdin.read()
    limits = ws.limits(s.meta.get("limits") or {})
    reply = ask_runner(ws, {"op": "exec", "session": s.id, "code": code}, limits.cell_timeout_s + BUSY_WAIT_S + 60)
    if as_json:
        emit(True, reply, "")
    else:
        if reply.get("output"):
            echo(reply["output"], nl=not reply["output"].endswith("\n"))
        if reply.get("error"):
            err().print(reply["error"], markup=False, soft_wrap=True)
        if reply.get("timed_out"):
            err().print("error: the code timed out (limits.cell_timeout_s) and was interrupted", markup=False)
    ctx.exit(1 if reply.get("error") or reply.get("timed_out") else 0)


@click.command("kernel")
@click.argument("session")
@json_option
@ws_option
@click.pass_context
def kernel_cmd(ctx, session, as_json):
    """Print a connection file for SESSION's live kernel: `jupyter console --existing FILE` (pip install
    jupyter-console) then works in it, alongside the agent. Off unless primefs.yaml has
    `kernel_connect: true`: whoever can read the file can run code as you (docs/cli.md)."""
    from primefs.store.control import ask_runner

    ws = workspace(ctx)
    s = find_session(ws.sessions, session)
    reply = ask_runner(ws, {"op": "kernel", "session": s.id}, 120.0)
    emit(as_json, {"session": s.id, **reply}, reply["connection_file"])
    if not as_json:
        err().print(f"jupyter console --existing {reply['connection_file']}", markup=False, soft_wrap=True)
