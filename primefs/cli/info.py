"""What this workspace can use: `primefs models` and `primefs plugins`."""
from __future__ import annotations

import click
from rich.markup import escape
from rich.table import Table

from primefs.cli.options import emit, json_option, print_table, workspace, ws_option
from primefs.views.console import out


def _table(*columns: str) -> Table:
    t = Table(box=None, pad_edge=False, header_style="bold")
    for c in columns:
        t.add_column(c, overflow="fold")
    return t


@click.command("models")
@json_option
@ws_option
@click.pass_context
def models_cmd(ctx, as_json):
    """The models this workspace names: each alias of primefs.yaml (and the default model), what it
    resolves to, its tool mode, and whether its API key is set in this environment (* = default).

    A key is looked for as litellm would: the alias's api_key or api_key_env, else the provider's
    standard variable (OPENAI_API_KEY, ANTHROPIC_API_KEY, ...). Nothing is sent anywhere.
    """
    from primefs.providers.models import listing

    rows = listing(workspace(ctx))
    if as_json:
        emit(True, rows, "")
        return
    t = _table("name", "model", "tools", "key")
    for r in rows:  # an alias that does not resolve shows why in the key column
        t.add_row(("* " if r["default"] else "  ") + r["name"], r["model"] or "?", r["tool_mode"] or "",
                  r["key"] if r["model"] else r["problem"], style=None if r["key_ok"] else "yellow")
    print_table(t)


@click.command("plugins")
@json_option
@ws_option
@click.pass_context
def plugins_cmd(ctx, as_json):
    """The plugins loaded here: built-in ones, installed packages (entry point group `primefs`) and the
    workspace's plugins/*.py, each with where it came from and the hooks it implements; then any that
    failed to load, with why. PRIMEFS_LOAD_PLUGINS=0 turns the last two kinds off; a list of
    names (PRIMEFS_LOAD_PLUGINS=needle,mytools) loads only those."""
    import warnings

    from primefs.plugins import plugin_manager, plugin_report

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # failures are listed below, not warned about
        rows = plugin_report(plugin_manager(workspace(ctx).root))
    if as_json:
        emit(True, rows, "")
        return
    console = out()
    for r in rows:  # two lines each: paths are long, and the table stays readable at 80 columns
        what = ", ".join(r["hooks"]) if r["loaded"] else f"NOT LOADED: {r['error']}"
        console.print(f"{r['name']}  [dim]{r['kind']}[/dim]  " + escape(what), style=None if r["loaded"] else "red",
                  soft_wrap=not console.is_terminal)
        console.print(f"  {escape(r['source'])}", style="dim", soft_wrap=True)


@click.command("trust")
@click.argument("paths", nargs=-1)
@click.option("--all", "trust_all", is_flag=True, help="Trust everything listed as not trusted.")
@click.option("--revoke", is_flag=True, help="Forget the trust given to PATHS.")
@json_option
@ws_option
@click.pass_context
def trust_cmd(ctx, paths, trust_all, revoke, as_json):
    """What in this workspace can make the runner run something, or weaken a kernel's sandbox, and whether
    you have trusted it: workspace plugins (plugins/*.py), primefs.yaml's mcp_servers and a weaker
    `sandbox:`, goals with a weaker `sandbox:`. Each is used only as you trusted it: a file that appears
    or changes (a copied workspace, or one a kernel without a sandbox wrote) is not.

    \b
      primefs trust                     list them
      primefs trust plugins/x.py        trust this file as it is now (its content hash)
      primefs trust primefs.yaml        its mcp_servers and sandbox sections as they are now
      primefs trust --all               trust everything listed
      primefs trust --revoke PATH
    """
    from primefs.store import trust

    ws = workspace(ctx)
    if revoke:
        emit(as_json, {"revoked": trust.revoke(ws, list(paths))}, f"revoked: {', '.join(paths) or 'nothing'}")
        return
    if paths or trust_all:
        chosen = list(paths) or [r["path"] for r in trust.needing_trust(ws) if not r["trusted"]]
        done = trust.trust(ws, chosen) if chosen else []
        emit(as_json, {"trusted": done}, "trusted: " + (", ".join(done) or "nothing (everything was trusted)"))
        return
    rows = trust.needing_trust(ws)
    if as_json:
        emit(True, rows, "")
        return
    if not rows:
        click.echo("nothing here needs trust (no workspace plugins, MCP servers or weaker sandboxes)")
        return
    t = _table("path", "what", "trusted")
    for r in rows:
        t.add_row(r["path"], r["what"], "yes" if r["trusted"] else "no", style=None if r["trusted"] else "yellow")
    print_table(t)
