"""The `primefs` command line. User mistakes print one line and exit non-zero, never a traceback."""
from __future__ import annotations

import re
import sys
from datetime import datetime
from pathlib import Path

import click

from primefs import __version__
from primefs.cli.options import emit, idle_exit_option, json_option, ray_address, ray_option, workspace, ws_option
from primefs.errors import PrimefsError
from primefs.store.workspace import init_workspace
from primefs.views.console import err, out


def escape(text: str) -> str:
    from rich.markup import escape as rich_escape

    return rich_escape(text)
TURN_LINE = re.compile(r"\S+ \(.*\): turn \d+ (started|resumed|ended)")
RUN_PROBLEMS = 3  # `run --once`: a session failed or a goal file was rejected (docs/cli.md, exit codes)


def _quiet_loop_teardown(unraisable, _default=sys.unraisablehook):
    """jupyter_client leaves one asyncio loop per worker thread; at interpreter exit their __del__ may
    find the selector already closed and print a traceback. Harmless: drop just that one."""
    obj = getattr(unraisable, "object", None)
    if isinstance(unraisable.exc_value, (ValueError, OSError)) and "BaseEventLoop.__del__" in repr(obj):
        return
    _default(unraisable)


sys.unraisablehook = _quiet_loop_teardown


# Commands that watch until Ctrl-C: for them Ctrl-C is the normal end (exit 0). Not `wait` and `ask`:
# cut short, they have no answer, and `primefs wait X && next` must not go on.
WATCHERS = {"run", "log", "tail", "attach", "agents", "serve", "acp"}


# Commands defined in the other modules of primefs/cli/: imported only when run (a command pays for its own imports only,
# which are most of the time of a `primefs status` or `primefs usage`).
LAZY = {
    "status": "views:status", "log": "views:log", "usage": "views:usage",
    "tools": "tools:tools_cmd", "harness": "harness:harness_group", "refine": "harness:refine_cmd",
    "eval": "eval:eval_cmd", "heartbeat": "heartbeat:heartbeat_group", "trace": "trace:trace_cmd",
    "serve": "web:serve", "logs": "logs:logs_cmd", "reindex": "logs:reindex_cmd",
    "archive": "archive:archive_cmd", "models": "info:models_cmd", "plugins": "info:plugins_cmd",
    "trust": "info:trust_cmd",
    "ask": "session:ask", "wait": "session:wait", "result": "session:result",
    "exec": "session:exec_cmd", "kernel": "session:kernel_cmd",
    "up": "daemon:up", "down": "daemon:down", "runner": "daemon:runner_cmd",
    "approve": "approvals:approve", "deny": "approvals:deny", "approvals": "approvals:approvals_cmd",
    "attach": "live:attach", "agents": "agents:agents", "tail": "live:follow_log", "acp": "acp:acp_cmd",
}


class Group(click.Group):
    def list_commands(self, ctx):
        return sorted(set(self.commands) | set(LAZY))

    def get_command(self, ctx, cmd_name):
        if cmd_name in LAZY and cmd_name not in self.commands:
            import importlib

            module, attr = LAZY[cmd_name].split(":")
            self.add_command(getattr(importlib.import_module(f"primefs.cli.{module}"), attr), cmd_name)
        return super().get_command(ctx, cmd_name)

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except PrimefsError as exc:
            err().print(f"[red]error:[/red] {escape(str(exc))}", markup=True, soft_wrap=True)
            sys.exit(1)
        except KeyboardInterrupt:  # never click's "Aborted!": watchers end with 0, anything else with 130
            sys.exit(0 if ctx.invoked_subcommand in WATCHERS else 130)
        except BrokenPipeError:  # (`| head`: click's own way, exit 1 without a word)
            raise
        except OSError as exc:  # what the machine refused (a full disk, no permission): said, not a traceback
            import os

            where = f": {exc.filename}" if exc.filename else ""
            err().print(f"[red]error:[/red] {escape(exc.strerror or str(exc))}{escape(where)}", markup=True,
                        soft_wrap=True)
            try:  # (output that could not be written is not tried again as the process ends)
                os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            except (OSError, ValueError):
                pass
            sys.exit(1)




@click.group(cls=Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("-w", "--workspace", "ws", metavar="DIR", help="Workspace folder (default: $PRIMEFS_WORKSPACE, "
              "else the current folder or the nearest parent holding primefs.yaml).")
@click.version_option(__version__, prog_name="primefs")
@click.pass_context
def main(ctx, ws):
    """primefs: recursive language-model agents on persistent kernels, where everything is a file.

    \b
    Typical use:
      primefs init myws && cd myws
      primefs goal "Find the three largest files under /usr/share"
      primefs run --once      # run until no session has work left
      primefs status          # what happened
    """
    ctx.ensure_object(dict)["workspace"] = ws


@main.command()
@click.argument("directory", default=".", type=click.Path(file_okay=False))
@click.option("--from", "source", type=click.Path(exists=True, file_okay=False),
              help="Copy this workspace template instead of the built-in one (e.g. example_workspace/).")
@json_option
def init(directory, source, as_json):
    """Create a new workspace in DIRECTORY (default: here) and make its first git commit."""
    ws = init_workspace(Path(directory), Path(source) if source else None)
    emit(as_json, {"workspace": str(ws.root)}, f"created workspace {ws.root}")


@main.command()
@click.argument("text")
@click.option("--model", "-m", help="Model for this goal: an alias from primefs.yaml or a litellm model id.")
@click.option("--name", help="Name of the goal and of its session (default: from the text).")
@click.option("--context", "-c", "context", multiple=True, metavar="FILE",
              help="A file inside the workspace handed to the agent as `context` (repeatable).")
@click.option("--limit", "limits", multiple=True, metavar="KEY=VALUE",
              help="Override a limit of primefs.yaml for this goal, e.g. --limit max_steps_per_turn=5.")
@click.option("--autonomous", is_flag=True, help="Keep taking turns until done(), the end conditions pass, "
              "or a budget runs out.")
@click.option("--budget", "budgets", multiple=True, metavar="KEY=VALUE",
              help="Budget over the whole session tree: turns, tokens, seconds or cost_usd (repeatable).")
@click.option("--end-condition", "conditions", multiple=True, metavar="NAME=ARG",
              help="E.g. --end-condition 'command=pytest -q' or --end-condition file_exists=report.md.")
@click.option("--heartbeat", metavar="SCHEDULE", help="Re-enter the session on a schedule: 'every 10m' or "
              "5 cron fields (prompt: --heartbeat-prompt).")
@click.option("--heartbeat-prompt", metavar="TEXT", help="The message each heartbeat delivers.")
@click.option("--tools", "tool_names", metavar="LIST", help="The tools the session gets: names or patterns, "
              "comma-separated ('word_count,calc_*'), 'all' (default) or 'none'.")
@click.option("--worktree", metavar="REPO", help="A git repository: the session works in its own worktree of "
              "it, on a new branch primefs/<id> (kernel-api.md, \"Worktrees\").")
@json_option
@ws_option
@click.pass_context
def goal(ctx, text, model, name, context, limits, autonomous, budgets, conditions, heartbeat, heartbeat_prompt,
         tool_names, worktree, as_json):
    """Add a goal: write goals/<name>.md for the runner to pick up. TEXT '-' reads standard input."""
    from primefs.store.settings import BUDGET_KEYS, check_budget

    ws = workspace(ctx)
    if text == "-":
        text = sys.stdin.read()
    extra: dict = {}
    if limits:
        extra["limits"] = parse_limits(limits)
    if autonomous:
        extra["autonomous"] = True
    if budgets:
        extra["budget"] = check_budget(_pairs(budgets, "--budget", BUDGET_KEYS, number=True), "--budget")
    if conditions:
        from primefs.plugins import end_conditions, plugin_manager
        from primefs.store.settings import check_end_conditions

        pairs = [c.partition("=") for c in conditions]
        if any(not sep or not name for name, sep, _ in pairs):
            raise PrimefsError("bad --end-condition: use NAME=ARG, e.g. 'command=pytest -q'")
        extra["end_conditions"] = check_end_conditions([{name: arg} for name, _, arg in pairs], "--end-condition",
                                                       end_conditions(plugin_manager(ws.root)))
    if heartbeat_prompt and not heartbeat:
        raise PrimefsError("--heartbeat-prompt needs --heartbeat SCHEDULE")
    if heartbeat:
        from primefs.store.heartbeat import from_spec

        spec = {"schedule": heartbeat, **({"prompt": heartbeat_prompt} if heartbeat_prompt else {})}
        from_spec(spec)  # a bad schedule fails here, not in the runner
        extra["heartbeat"] = spec
    if tool_names is not None:
        from primefs.tools.registry import check_selection

        selection = check_selection(tool_names, "--tools")
        extra["tools"] = "all" if selection is None else selection
    if worktree is not None:  # checked here (and again by the runner): a bad path fails now, not there
        from primefs.store.worktrees import check_repo

        check_repo(ws, worktree, "--worktree")
        extra["worktree"] = worktree
    from primefs.store.goals import write_goal

    path = write_goal(ws, text, model=model, name=name, context=list(context), extra=extra or None)
    rel = path.relative_to(ws.root).as_posix()
    notes = goal_notes(ws, model)
    for note in notes:
        err().print(f"[yellow]note:[/yellow] {escape(note)}", markup=True, soft_wrap=True)
    emit(as_json, {"goal": rel, "name": name or path.stem, "notes": notes}, rel)


@main.command()
@click.option("--once", is_flag=True, help="Exit when no session has work left (default: keep watching).")
@click.option("--quiet", "-q", is_flag=True, help="Print nothing while running.")
@click.option("--verbose", "-v", is_flag=True, help="Show each session's work as it happens: the model's "
              "text and code as they stream, each cell's output, messages, results.")
@idle_exit_option
@ray_option
@ws_option
@click.pass_context
def run(ctx, once, quiet, verbose, idle_exit, ray):
    """Run the agents in the foreground: pick up goals, deliver mail, run turns. Ctrl-C stops.

    With --once, the exit code says how it went: 0 when every session it ran ended without failure
    and every goal file was accepted, 3 otherwise (the work is still all done and recorded).
    """
    from primefs.eval import run_gate
    from primefs.runner.core import Runner
    from primefs.store import livefeed
    from primefs.views.events import Narrator

    ws = workspace(ctx)
    if quiet and verbose:
        raise click.UsageError("--quiet and --verbose exclude each other")
    if once and idle_exit is not None:
        raise click.UsageError("--once and --idle-exit exclude each other")
    from rich.text import Text

    narrator = Narrator(out(), ws.sessions) if verbose else None

    def log(msg: str) -> None:
        if quiet or (narrator and TURN_LINE.match(msg)):  # -v shows turns as events already
            return
        line = Text.assemble((f"{datetime.now():%H:%M:%S} ", "dim"), msg)
        narrator.say(line) if narrator else err().print(line, soft_wrap=True)

    if not once:  # a runner that may run for days: what malloc keeps of freed memory given back, its log kept small
        from primefs.cli.daemon import keep_log_small
        from primefs.runner.memory import keep_flat

        keep_flat()
        keep_log_small(ws)
    runner = Runner(ws, log=log, ray=ray_address(ws, ray))
    runner.turns.gate_runner = run_gate  # harness.gate: refinements agents ask for must pass their gate
    if narrator:
        livefeed.listen(narrator)
    try:
        runner.run(once=once, idle_exit_s=idle_exit)
    finally:
        if narrator:
            livefeed.unlisten(narrator)
    if once:
        outcome = runner.outcome()
        said = [f"{len(outcome['failed'])} session(s) failed: {', '.join(outcome['failed'])}"] if outcome["failed"] else []
        said += [f"goal file rejected: {rel}" for rel in outcome["rejected"]]
        for line in said:
            err().print(f"error: {line}", markup=False, soft_wrap=True)
        if said:
            ctx.exit(RUN_PROBLEMS)


def goal_notes(ws, model: str | None) -> list[str]:
    """What is worth saying when a goal is added: the model's key not set, no runner running."""
    from primefs.providers.models import key_problem
    from primefs.store.control import lock_held

    notes = []
    problem = key_problem(ws, model or ws.default_model())
    if problem:
        notes.append(problem)
    if not lock_held(ws):
        notes.append("no runner is running: start one (primefs up, or primefs run)")
    return notes


def _pairs(pairs, flag: str, known, number: bool = False) -> dict:
    """KEY=VALUE options -> dict, refusing unknown keys (and non-numbers when `number`)."""
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or key not in known:
            raise PrimefsError(f"bad {flag} {pair!r}: use KEY=VALUE with KEY one of {', '.join(known)}")
        if number:
            try:
                value = int(value) if value.strip().lstrip("-").isdigit() else float(value)
            except ValueError:
                raise PrimefsError(f"bad {flag} {pair!r}: {value!r} is not a number") from None
        out[key] = value
    return out


def parse_limits(pairs) -> dict:
    from primefs.store.settings import CHOICES, DEFAULT_LIMITS, check_limits

    words = [p for p in pairs if p.partition("=")[0] in CHOICES]  # e.g. snapshot=off
    limits = _pairs([p for p in pairs if p not in words], "--limit", DEFAULT_LIMITS, number=True)
    limits.update(_pairs(words, "--limit", CHOICES))
    check_limits(limits, "--limit")
    return limits


@main.command()
@click.argument("session")
@click.argument("text")
@json_option
@ws_option
@click.pass_context
def send(ctx, session, text, as_json):
    """Mail TEXT to SESSION (id or name) as `kind: user`; an idle or finished session takes a new turn
    (when a runner runs). TEXT '-' reads standard input.
    """
    from primefs.index.db import find_session
    from primefs.store.control import lock_held
    from primefs.store.mail import deliver

    ws = workspace(ctx)
    s = find_session(ws.sessions, session)
    if text == "-":
        text = sys.stdin.read()
    if not text.strip():
        raise PrimefsError("the message is empty")
    msg = deliver(s.mail, sender="user", to=s.id, kind="user", text=text)
    status, running = s.status, lock_held(ws)
    notes = []
    if status == "stopped":
        notes.append(f"{s.name} is stopped: it takes no more turns; the message stays in its mailbox")
    elif not running:
        notes.append("no runner is running: the message waits until one starts (primefs up)")
    for note in notes:
        err().print(f"[yellow]note:[/yellow] {escape(note)}", markup=True, soft_wrap=True)
    emit(as_json, {"message": msg.id, "session": s.id, "name": s.name, "status": status, "runner": running,
                   "notes": notes}, f"delivered {msg.id} to {s.id} ({s.name})")


@main.command()
@click.argument("session")
@click.option("--tree", is_flag=True, help="Also stop every descendant.")
@json_option
@ws_option
@click.pass_context
def stop(ctx, session, tree, as_json):
    """Stop SESSION (id or name): its running cell is interrupted and it takes no more turns."""
    from primefs.index.db import descendants, find_session
    from primefs.store.control import request_stop

    ws = workspace(ctx)
    s = find_session(ws.sessions, session)
    done = request_stop(ws, [s.id] + (descendants(ws, s.id) if tree else []))
    emit(as_json, [{"session": sid, "outcome": how} for sid, how in done],
         "\n".join(f"{sid}: {how}" for sid, how in done))


def program() -> None:
    """The `primefs` program: `main`, then what the interpreter's exit does for us (threads joined, atexit
    handlers, streams flushed), then an exit without its teardown of every module (~1 s once litellm is
    loaded: the last second of every `run --once` and `ask`)."""
    import atexit
    import os
    import threading

    try:
        main()
        code = 0
    except SystemExit as done:
        code = done.code
    for t in threading.enumerate():
        if t is not threading.main_thread() and not t.daemon:
            t.join()
    atexit._run_exitfuncs()
    if code is not None and not isinstance(code, int):  # as SystemExit("text") would: said, exit status 1
        print(code, file=sys.stderr)
        code = 1
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code or 0)


if __name__ == "__main__":
    program()
