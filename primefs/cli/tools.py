"""`primefs tools`: every tool the plugins and MCP servers give kernels, and those that are broken."""
from __future__ import annotations

import json

import click
from rich.markup import escape

from primefs.cli.options import workspace, ws_option
from primefs.views.console import out


@click.command("tools")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list of {name, runs, plugin, signature, "
              "description, problem}.")
@ws_option
@click.pass_context
def tools_cmd(ctx, as_json):
    """List the tools code in a kernel can call as tools.NAME(...): where each runs (kernel or runner),
    the plugin or MCP server it comes from, its signature. MCP servers are listed as the running
    runner has them; with no runner, they are started to list theirs.

    Tools with a problem (a bad name, an import that fails, an MCP server that does not start) are
    listed with it and offered to no session. Exit code 0 even then; 1 for a bad primefs.yaml.
    """
    from primefs.plugins import plugin_manager
    from primefs.runner.toolbox import ToolBox, check_config
    from primefs.store.control import runner_state

    ws = workspace(ctx)
    check_config(ws)
    box = ToolBox(ws, plugin_manager(ws.root))
    runner = runner_state(ws)
    if runner["state"] is not None:  # its servers, as it has them: not another start that may go otherwise
        box.use_runners(runner["state"].get("mcp_tools") or [])
    else:
        box.start(background=False)
    try:
        found = box.all()
    finally:
        box.close()
    if as_json:
        click.echo(json.dumps([t.record() for t in found], indent=1))
        return
    console = out(soft_wrap=True)
    if not found:
        console.print("no tools: plugins register them with register_tools,\nand MCP servers go under mcp_servers: "
                      "in primefs.yaml")
    for t in found:
        if t.problem:
            console.print(f"[red]{escape(t.name)}[/red]  ({t.runs}, {escape(t.plugin)})  [red]error:[/red] "
                      f"{escape(t.problem)}")
            continue
        console.print(f"[bold]{escape(t.name)}[/bold]{escape(t.signature)}  [dim]({t.runs}, {escape(t.plugin)})[/dim]")
        if t.description:
            console.print(f"    {escape(t.description)}")
    if runner["state"] is not None and ws.config.get("mcp_servers"):
        console.print(f"[dim](MCP servers as the runner, pid {runner['pid']}, has them)[/dim]")
