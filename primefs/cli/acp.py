"""`primefs acp`: the workspace as an Agent Client Protocol agent on stdin/stdout (docs/acp.md)."""
from __future__ import annotations

import click

from primefs.cli.options import workspace, ws_option
from primefs.errors import PrimefsError


@click.command("acp")
@ws_option
@click.pass_context
def acp_cmd(ctx):
    """Speak the Agent Client Protocol on stdin/stdout, for editors (Zed) and other ACP clients: each ACP
    session a primefs session, each prompt a turn, cells as tool calls. Ends when stdin closes.

    Configure the client to run `primefs -w WORKSPACE acp`. See docs/acp.md.
    """
    ws = workspace(ctx)
    try:
        from primefs.api import acpagent
    except ImportError as exc:
        raise PrimefsError(f"primefs acp needs its extra ({exc.name} is missing): pip install 'primefs[acp]'") from None
    acpagent.main(ws.root)
