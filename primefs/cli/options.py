"""What CLI modules share: the `-w/--workspace` option and finding the workspace from it; `--ray`."""
from __future__ import annotations

import json

import click

from primefs.errors import PrimefsError
from primefs.store.workspace import find_workspace
from primefs.views.console import echo, err, out

RAY_FROM_CONFIG = "<hosts>"  # `--ray` without an address


def _set_workspace(ctx, _param, value):
    if value:
        ctx.ensure_object(dict)["workspace"] = value
    return value


# `-w` works before or after the subcommand: `primefs -w DIR status` and `primefs status -w DIR`.
ws_option = click.option("-w", "--workspace", metavar="DIR", expose_value=False, callback=_set_workspace,
                         is_eager=True, help="Workspace folder (see `primefs --help`).")


json_option = click.option("--json", "as_json", is_flag=True, help="Print the outcome as JSON (for scripts).")


def emit(as_json: bool, data, text: str) -> None:
    """A command's outcome: `data` as JSON with --json, else `text` (skipped when empty)."""
    if as_json:
        click.echo(json.dumps(data, indent=1, default=str))
    elif text:
        echo(text)  # (it may hold what a session wrote)


def write_json_array(lines: list[str], chunk: int = 2000) -> None:
    """A JSON array of these items (each JSON text) to stdout, an item a line, a chunk at a time: one 36 MB string
    made and printed whole (status --json at 50,000 sessions) took ~0.1 s more. (color: JSON has no escape
    sequences to strip, and looking for them in every chunk costs.)"""
    if not lines:
        click.echo("[]")
        return
    click.echo("[", color=True)
    for i in range(0, len(lines), chunk):
        click.echo((",\n" if i else "") + ",\n".join(lines[i:i + chunk]), nl=False, color=True)
    click.echo("\n]", color=True)


def print_table(renderable, width: int | None = None) -> None:
    """Print a table (or text) to stdout: fitted to a terminal; piped, `width` columns (default: the
    console's) with no padding left at the ends of lines."""

    console = out()
    if console.is_terminal:
        console.print(renderable)
        return
    if width:
        console.width = width
    with console.capture() as cap:
        console.print(renderable, soft_wrap=True)
    click.echo("\n".join(line.rstrip() for line in cap.get().splitlines()))


def workspace(ctx: click.Context):
    return find_workspace((ctx.obj or {}).get("workspace"))


# `run --ray ADDRESS` and `up --ray ADDRESS`: kernels on a Ray cluster (docs/scale-out.md)
ray_option = click.option(
    "--ray", "ray", metavar="ADDRESS", is_flag=False, flag_value=RAY_FROM_CONFIG, default=None,
    help="Run the kernels on the nodes of a Ray cluster at ADDRESS (HOST:PORT; 'auto': the one `ray start` made "
         "here; 'local': start one here; none: `hosts:` in primefs.yaml, else auto). Every node needs the "
         "workspace mounted at the same path (docs/scale-out.md).")


# `run --idle-exit S` and `up --idle-exit S`: a runner that stops once it has had no work for S seconds
idle_exit_option = click.option(
    "--idle-exit", "idle_exit", type=click.FloatRange(min=0), default=None, metavar="S",
    help="Stop once no session has had work for S seconds (no running or queued turn, no goal being read, "
         "no request in hand); default: keep running.")


def ray_address(ws, value: str | None) -> str | None:
    """The cluster address `--ray` asks for (None: no --ray)."""
    if value == RAY_FROM_CONFIG:
        return (ws.ray_host() or {}).get("address") or "auto"
    if value is not None and not value.strip():
        raise PrimefsError("--ray needs the address of a Ray cluster (HOST:PORT, auto or local)")
    return value


class progress_bar:
    """A progress bar on standard error for long work: `progress(0, total=N)` shows it once the items are
    known (a bad input fails before, as one line), `progress(k)` advances it."""

    def __init__(self, title: str):
        self.title, self.task, self.bar = title, None, None

    def __enter__(self):
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self.bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                            console=err(), transient=False)

        def progress(k, total=None):
            if self.task is None:
                self.bar.start()
                self.task = self.bar.add_task(self.title, total=total)
            elif total is not None:
                self.bar.update(self.task, total=total)
            self.bar.advance(self.task, k)
        return progress

    def __exit__(self, *exc):
        if self.task is not None:
            self.bar.stop()
