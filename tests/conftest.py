"""Shared fixtures: real workspaces (real git), a real scripted HTTP model server, real kernels."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ["PRIMEFS_LOAD_PLUGINS"] = os.environ.get("PRIMEFS_TEST_PLUGINS", "0")
sys.path.insert(0, str(Path(__file__).parent))

from hypothesis import settings as hypothesis_settings  # noqa: E402
from openai_server import ScriptServer  # noqa: E402

from primefs.store import trust  # noqa: E402
from primefs.store.control import lock_held  # noqa: E402
from primefs.store.frontmatter import dump_yaml, load_yaml  # noqa: E402
from primefs.runner.core import Runner  # noqa: E402
from primefs.store.session import list_sessions  # noqa: E402
from primefs.store.workspace import Workspace, init_workspace  # noqa: E402

# The suite's fuzz tests give the same examples every run, so a red CI is reproducible; exploring new ones
# is bench/fuzz.py's job (or HYPOTHESIS_PROFILE=explore pytest tests/test_fuzz.py).
hypothesis_settings.register_profile("suite", derandomize=True, database=None)
hypothesis_settings.register_profile("explore")
hypothesis_settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "suite"))


@pytest.fixture
def ws(tmp_path, monkeypatch) -> Workspace:
    monkeypatch.delenv("PRIMEFS_MODEL", raising=False)
    monkeypatch.delenv("PRIMEFS_WORKSPACE", raising=False)
    return init_workspace(tmp_path / "ws")


@pytest.fixture
def server():
    with ScriptServer([{"text": "hello"}]) as srv:
        yield srv


def configure(ws: Workspace, **changes) -> Workspace:
    """Edit primefs.yaml (round trip) and return a fresh Workspace that reads it. The test is the person:
    what it writes is trusted (its mcp_servers, a sandbox turned off)."""
    path = ws.root / "primefs.yaml"
    data = load_yaml(path)
    for key, value in changes.items():
        if isinstance(value, dict) and isinstance(data.get(key), dict):
            data[key].update(value)
        else:
            data[key] = value
    path.write_text(dump_yaml(data))
    fresh = Workspace(ws.root)
    trust.trust(fresh, ["primefs.yaml"])
    return fresh


def use_server(ws: Workspace, srv: ScriptServer, *, tool_mode="native", stream=False, limits=None) -> Workspace:
    """Point the workspace's default model at the scripted server through litellm."""
    alias = {"model": "openai/test-model", "api_base": srv.url, "api_key": "none", "tool_mode": tool_mode}
    if stream:
        alias["stream"] = True
    lim = {"model_retry_backoff_s": 0.01, "cell_timeout_s": 20}
    lim.update(limits or {})
    return configure(ws, model="fake", models={"fake": alias}, limits=lim)


PRIMEFS = [sys.executable, "-m", "primefs"]


def cli(ws, *args, timeout=60):
    """`primefs ARGS -w WS` as a user runs it (a process of its own, 200 columns)."""
    env = {**os.environ, "COLUMNS": "200"}
    env.pop("PRIMEFS_WORKSPACE", None)
    return subprocess.run([*PRIMEFS, *args, "-w", str(ws.root)], capture_output=True, text=True,
                          timeout=timeout, env=env)


def session_named(ws, name):
    return next((s for s in list_sessions(ws.sessions) if s.meta.get("name") == name), None)


def answered_under_a_runner(ws, name: str, task: str, answer: str):
    """`primefs up`, then goal NAME (TASK) taken and idle with ANSWER as its result: its session."""
    assert cli(ws, "up").returncode == 0
    (ws.goals / f"{name}.md").write_text(task)
    s = wait_for(lambda: session_named(ws, name), what="session")
    wait_for(lambda: s.read_result() == answer and s.reload()["status"] == "idle", what="idle")
    return s


@pytest.fixture
def scripted(ws):
    def setup(script: str):
        (ws.root / "script.yaml").write_text(script)
        return configure(ws, model="scripted/script.yaml")
    return setup


@pytest.fixture
def daemon_cleanup(ws):
    """Whatever happens in the test, no runner outlives it."""
    yield
    if lock_held(ws):
        pid = int((ws.state / "runner.lock").read_text().split()[0])
        os.kill(pid, signal.SIGKILL)
        wait_for(lambda: not lock_held(ws), 10, "runner killed")


def run_once(ws: Workspace) -> list[str]:
    lines: list[str] = []
    Runner(ws, log=lines.append).run(once=True)
    return lines


class BackgroundRunner:
    """`primefs run` (watching) in a thread, for tests of reactions to new files."""

    def __init__(self, ws: Workspace):
        self.lines: list[str] = []
        self.runner = Runner(ws, log=self.lines.append)
        self.thread = threading.Thread(target=self.runner.run, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.runner.stop()
        self.thread.join(30)


def sigkill_runner_when(ws: Workspace, pred, what: str = "condition") -> None:
    """Start `primefs run` as a process, wait until pred() (and half a second more), then SIGKILL it."""
    log = ws.root.parent / "killed-runner.log"  # beside the workspace: what it said, if the wait fails
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "primefs", "-w", str(ws.root), "run"],
                                stdout=out, stderr=subprocess.STDOUT)
    try:
        try:
            wait_for(pred, what=what)
        except AssertionError as exc:
            alive = "still running" if proc.poll() is None else f"exited with {proc.returncode}"
            raise AssertionError(f"{exc}; the runner ({alive}) said:\n{log.read_text()[-3000:]}") from None
        time.sleep(0.5)
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    finally:
        if proc.poll() is None:
            proc.kill()


def wait_for(pred, timeout: float = 60.0, what: str = "condition"):
    """Poll until pred() is truthy; return its value (tests of things that happen in other threads)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = pred()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


# -- tests marked `netns` (browser, Ray and Phoenix tests) ------------------------------------------------
# They run only where `make test` runs them: inside a network namespace with nothing but loopback
# (`unshare -n` / `unshare -rn`, then `ip link set lo up`), with PRIMEFS_NETNS_TESTS=1. Elsewhere they
# are skipped, so a plain `pytest` never starts a browser with a way out to the network.
NETNS_ENV = "PRIMEFS_NETNS_TESTS"


def loopback_only() -> bool:
    import socket

    return [name for _, name in socket.if_nameindex()] == ["lo"]


def pytest_collection_modifyitems(config, items):
    marked = [item for item in items if "netns" in item.keywords]
    if not marked:
        return
    if os.environ.get(NETNS_ENV) == "1":
        if not loopback_only():
            raise pytest.UsageError(f"{NETNS_ENV}=1 but this network namespace has more than loopback; "
                                    "run these tests through `make test` (or `make test-browser`)")
        return
    skip = pytest.mark.skip(reason="browser, Ray or Phoenix test: `make test` runs it in a loopback-only network "
                                   f"namespace ({NETNS_ENV}=1)")
    for item in marked:
        item.add_marker(skip)
