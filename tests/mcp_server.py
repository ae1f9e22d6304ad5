"""An MCP server for the tests, written with the official SDK: `python tests/mcp_server.py` (stdio) or
`python tests/mcp_server.py --http PORT` (streamable HTTP on 127.0.0.1:PORT/mcp)."""
import os
import sys
import time

from mcp.server.mcpserver import MCPServer

server = MCPServer("calc")


@server.tool()
def add(a: int, b: int = 1) -> int:
    """Add two whole numbers."""
    return a + b


@server.tool()
def secret() -> str:
    """The SECRET this server was started with (from primefs.yaml, `${VAR}` expanded)."""
    return os.environ.get("SECRET", "(none)")


@server.tool()
def crash() -> str:
    """Say why on stderr, then end this server's process at once."""
    print("calc: crashing on purpose", file=sys.stderr, flush=True)
    os._exit(3)


@server.tool()
def nap(seconds: float) -> str:
    """Sleep, then answer."""
    time.sleep(seconds)
    return "awake"


@server.tool()
async def wedge(path: str) -> str:
    """Write this server's pid to `path`, then block its event loop (nothing else answers); were it ever
    to get past that, it would write `path`.late."""
    with open(path, "w") as f:
        f.write(str(os.getpid()))
    time.sleep(600)
    with open(path + ".late", "w") as f:
        f.write("ran after all")
    return "unwedged"


@server.tool()
def big(n: int) -> str:
    """A text of n characters."""
    return "x" * n


if __name__ == "__main__":
    if sys.argv[1:2] == ["--http"]:
        server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[2]))
    else:
        server.run()
