"""What every CLI module shares: the `-w/--workspace` option and finding the workspace from it."""
from __future__ import annotations

import click

from .workspace import find_workspace


def _set_workspace(ctx, _param, value):
    if value:
        ctx.ensure_object(dict)["workspace"] = value
    return value


# `-w` works before or after the subcommand: `primefs -w DIR status` and `primefs status -w DIR`.
ws_option = click.option("-w", "--workspace", metavar="DIR", expose_value=False, callback=_set_workspace,
                         is_eager=True, help="Workspace folder (see `primefs --help`).")


def workspace(ctx: click.Context):
    return find_workspace((ctx.obj or {}).get("workspace"))
