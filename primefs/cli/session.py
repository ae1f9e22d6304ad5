"""One session from the command line: `ask` (a goal, its answer), `wait`, `result`, `exec`, `kernel`.

Exit codes (docs/cli.md): 0 the session ended without failure (idle or done), 3 it failed or was
stopped, 124 `--timeout` passed first; 1 a mistake (unknown session, no runner for exec, ...).
"""
from __future__ import annotations

import sys
import threading
import time
from datetime import datetime, timezone

import click

from primefs.cli.options import emit, json_option, workspace, ws_option
from primefs.errors import PrimefsError
from primefs.index.db import find_session
from primefs.runner.intake import REJECTED
from primefs.store.fsutil import read_json_dict
from primefs.store.session import Session
from primefs.store.settings import FINISHED
from primefs.views.console import err


class TimedOut(PrimefsError):
    """--timeout passed before there was anything to wait for."""
FAILED_EXIT, TIMEOUT_EXIT = 3, 124


def ended(s: Session) -> bool:
    """The session has stopped working for now: a turn ended and no mail waits to start another."""
    from primefs.store.mail import new_files

    try:
        status = s.reload().get("status")
    except (PrimefsError, OSError):
        return False
    return status in FINISHED and not (status in ("idle", "done") and new_files(s.mail))


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
            click.echo(out["result"].rstrip("\n"))
        if failed or out["result"] is None:
            why = f" ({out['stop_reason']})" if out["stop_reason"] else ""
            err().print(f"{s.name} is {out['status']}{why}" + (f": {out['error']}" if out["error"] else ""),
                      markup=False, soft_wrap=True)
    ctx.exit(FAILED_EXIT if failed else 0)


def wait_until_ended(s: Session, timeout: float | None, stop: threading.Event | None = None) -> bool:
    deadline = None if timeout is None else time.monotonic() + timeout
    while not ended(s):
        if stop is not None and stop.is_set():
            return ended(s)
        if deadline is not None and time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True


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
    from primefs.store.control import lock_held

    ws = workspace(ctx)
    started = time.monotonic()
    try:
        s = find_session(ws.sessions, session)
    except PrimefsError:  # `primefs goal --name X && primefs wait X`: its goal may not be taken yet
        goal = _waiting_goal(ws, session)
        if goal is None:
            raise
        if not lock_held(ws):
            err().print(f"note: no runner is running: {goal} waits for one (primefs up)", markup=False)
        s = _or_timed_out(ctx, lambda: _session_of(ws, goal, "", timeout))
    if not ended(s) and not lock_held(ws):
        err().print("note: no runner is running: waiting for one to start (primefs up)", markup=False)
    left = None if timeout is None else max(0.0, timeout - (time.monotonic() - started))
    if not wait_until_ended(s, left):
        err().print(f"error: {s.name} is still {s.status} after {timeout:g} s", markup=False)
        ctx.exit(TIMEOUT_EXIT)
    finish(ctx, s, as_json)


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
@timeout_option
@json_option
@ws_option
@click.pass_context
def ask(ctx, text, model, context, verbose, timeout, as_json):
    """Ask TEXT and print the answer: a goal, run until its session answers. TEXT '-' reads stdin.

    With a runner up (primefs up), it does the work; otherwise one runs in this process until the
    answer is there (other goals it picks up meanwhile go on at the next runner start).
    Exit code: 0 answered, 3 failed or stopped, 124 timed out.
    """
    from primefs.store.control import lock_held
    from primefs.store.goals import write_goal

    ws = workspace(ctx)
    if text == "-":
        text = sys.stdin.read()
    started = datetime.now(timezone.utc)
    path = write_goal(ws, text, model=model, name=f"ask-{started:%Y%m%d-%H%M%S}-{started.microsecond // 1000:03d}",
                      context=list(context))
    rel = path.relative_to(ws.root).as_posix()
    if lock_held(ws):
        s = _or_timed_out(ctx, lambda: _session_of(ws, rel, f"{started:%y%m%d-%H%M%S}", timeout))
        stop = threading.Event()
        if verbose:
            from primefs.cli.live import follow

            threading.Thread(target=follow, args=(s, err(), stop),
                             kwargs={"header": False}, daemon=True).start()
        done = wait_until_ended(s, timeout)
        stop.set()
        if not done:
            err().print(f"error: no answer within {timeout:g} s ({s.name} goes on under the runner: primefs wait "
                      f"{s.id})", markup=False)
            ctx.exit(TIMEOUT_EXIT)
    else:
        s, done = _ask_here(ws, rel, f"{started:%y%m%d-%H%M%S}", timeout, verbose)
        if not done:  # the runner of this process stopped with it: the turn is cut off, not going on
            err().print(f"error: no answer within {timeout:g} s: {s.name}'s turn was cut off; it goes on when a runner "
                      f"starts (primefs up), and primefs wait {s.id} then waits for it", markup=False)
            ctx.exit(TIMEOUT_EXIT)
    finish(ctx, s, as_json)


def _or_timed_out(ctx, find) -> Session:
    try:
        return find()
    except TimedOut as exc:
        err().print(f"error: {exc}", markup=False)
        ctx.exit(TIMEOUT_EXIT)


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


def _session_of(ws, goal: str, since: str, timeout: float | None, alive=lambda: True) -> Session:
    """The session a runner made for `goal` (created after `since`, an id prefix)."""
    deadline = None if timeout is None else time.monotonic() + timeout
    seen: set[str] = set()
    while True:
        try:
            names = [n for n in ws.sessions.iterdir() if n.name >= since and n.name not in seen]
        except FileNotFoundError:
            names = []
        for d in sorted(names):
            s = Session(d)
            try:
                if s.meta.get("goal") == goal:
                    return s
                seen.add(d.name)
            except (PrimefsError, OSError):
                continue  # being written: looked at again
        refused = read_json_dict(ws.state / REJECTED).get(goal)
        if isinstance(refused, dict):
            raise PrimefsError(f"the runner rejected the goal: {refused.get('error')}")
        if not alive():
            raise PrimefsError(f"no runner took {goal} (see primefs status)")
        if deadline is not None and time.monotonic() > deadline:
            raise TimedOut(f"no runner took {goal} within {timeout:g} s (see primefs status)")
        time.sleep(0.1)


def _ask_here(ws, goal: str, since: str, timeout: float | None, verbose: bool) -> tuple[Session, bool]:
    """No runner is up: run one in this process until the goal's session has ended."""
    from primefs.runner.core import Runner
    from primefs.store import livefeed
    from primefs.views.events import Narrator

    narrator = Narrator(err(), ws.sessions) if verbose else None
    problems: list[str] = []

    def log(msg: str) -> None:
        if msg.startswith(("error", "goal error", "warning")):
            problems.append(msg)
            if narrator:
                narrator.say(msg)

    runner = Runner(ws, log=log)
    failure: list[BaseException] = []

    def run() -> None:
        try:
            runner.run(once=True)
        except BaseException as exc:  # noqa: BLE001 - reported by the waiting thread
            failure.append(exc)

    thread = threading.Thread(target=run, name="primefs-ask-runner", daemon=True)
    if narrator:
        livefeed.listen(narrator)
    thread.start()
    try:
        s = _session_of(ws, goal, since, timeout, alive=thread.is_alive)
        done = wait_until_ended(s, timeout, stop=_Ended(thread))
    except PrimefsError:
        if failure:
            raise failure[0] from None
        for p in problems:
            err().print(p, markup=False, soft_wrap=True)
        raise
    finally:
        runner.stop()
        thread.join()
        if narrator:
            livefeed.unlisten(narrator)
    return s, done


class _Ended:
    """An Event-like view of a thread: set once it has ended."""

    def __init__(self, thread: threading.Thread):
        self.thread = thread

    def is_set(self) -> bool:
        return not self.thread.is_alive()


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
            click.echo(reply["output"], nl=not reply["output"].endswith("\n"))
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
