"""`primefs serve`: the web view of a workspace (primefs/web/, docs/web.md)."""
from __future__ import annotations

import errno
import ipaddress
import os
import re
import secrets
import socket
import threading
from pathlib import Path

import click

from primefs.cli.options import workspace, ws_option
from primefs.errors import PrimefsError
from primefs.store.fsutil import read_regular, write_atomic


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def bind(host: str, port: int) -> socket.socket:
    """The listening socket, made here so that port 0 can pick a free port and a busy one is one line."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise PrimefsError(f"--host {host}: {exc.strerror}") from None
    family, _, _, _, addr = infos[0]
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(addr)
    except OSError as exc:
        sock.close()
        why = "is in use (another server?); pick another with --port, or --port 0 for any free one" \
            if exc.errno == errno.EADDRINUSE else exc.strerror
        raise PrimefsError(f"cannot listen on {host}:{port}: it {why}" if exc.errno == errno.EADDRINUSE
                           else f"cannot listen on {host}:{port}: {why}") from None
    sock.listen(128)
    sock.set_inheritable(True)
    return sock


def access_token(ws, new: bool = False) -> str:
    """The token of the URL: kept in the runtime folder (this user's only, hidden from sandboxed kernels)
    so that a restarted `serve` takes the pages still open back; `new` makes another one."""
    path = ws.runtime / "serve-token"
    if not new:
        try:
            token = read_regular(path).strip()
            if re.fullmatch(r"[A-Za-z0-9_-]{32}", token):
                return token
        except OSError:
            pass
    token = secrets.token_urlsafe(24)
    write_atomic(path, token + "\n", durable=False)
    os.chmod(path, 0o600)
    return token


@click.command("serve")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on (loopback unless "
              "--allow-remote).")
@click.option("--port", type=click.IntRange(0, 65535), default=8765, show_default=True,
              help="Port to listen on (0: any free port).")
@click.option("--allow-remote", is_flag=True, help="Allow a --host that is not a loopback address.")
@click.option("--new-token", is_flag=True, help="Make a new access token: pages opened with the old one are refused.")
@click.option("--openai", "openai", is_flag=True, help="Also serve an OpenAI-compatible API under /v1 (each chat "
              "completion a session; docs/openai-endpoint.md).")
@click.option("--evals", "eval_dirs", multiple=True, type=click.Path(file_okay=False), metavar="DIR",
              help="Also list eval runs under DIR (repeatable; default: eval-runs/ in the workspace and here).")
@ws_option
@click.pass_context
def serve(ctx, host, port, allow_remote, new_token, openai, eval_dirs):
    """A web view of the workspace: the session tree live, sessions, usage, harness, eval runs.

    Prints the page's URL with its access token; Ctrl-C stops. See docs/web.md.
    """
    ws = workspace(ctx)
    if not is_loopback(host) and not allow_remote:
        raise PrimefsError(f"--host {host} is not a loopback address: anyone who can reach it and learns the token "
                           "can mail and stop your agents; add --allow-remote if you mean it")
    try:
        import uvicorn

        from primefs.web.app import make_app
        from primefs.web.security import loopback_hosts
    except ImportError as exc:
        raise PrimefsError(f"the web view needs its extra ({exc.name} is missing): pip install 'primefs[web]'") from None
    roots = [Path(d).resolve() for d in eval_dirs]
    for default in (ws.root / "eval-runs", Path.cwd() / "eval-runs"):
        if default.resolve() not in roots:
            roots.append(default.resolve())
    sock = bind(host, port)
    port = sock.getsockname()[1]
    token = access_token(ws, new_token)
    app = make_app(ws, token, port=port, allowed_hosts=None if allow_remote else loopback_hosts(host, port),
                   eval_roots=roots, openai=openai)
    # read the workspace now, while the URL is being opened: a big one takes seconds the first time
    threading.Thread(target=app.state.pf.index.refresh, kwargs={"force": True}, daemon=True).start()
    shown = f"[{host}]" if ":" in host else host
    click.echo(f"primefs web view of {ws.root}: http://{shown}:{port}/?token={token}", nl=True)
    if openai:
        click.echo(f"OpenAI-compatible API: base_url http://{shown}:{port}/v1, api_key {token}", nl=True)
    click.echo("Ctrl-C stops", err=True)
    stopping = app.state.pf.stopping

    class Server(uvicorn.Server):
        def handle_exit(self, sig, frame):  # live streams end now, not after the graceful timeout
            stopping.set()
            super().handle_exit(sig, frame)

    config = uvicorn.Config(app, log_level="warning", access_log=False, timeout_graceful_shutdown=2,
                            lifespan="off")
    try:
        Server(config).run(sockets=[sock])
    except KeyboardInterrupt:  # uvicorn raises the Ctrl-C again once it has stopped: a normal end
        pass
    finally:
        stopping.set()
        sock.close()
