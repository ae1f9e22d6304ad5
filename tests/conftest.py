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
os.environ["PRIMEFS_CHECK_EVENTS"] = "1"  # every event written in a test (runners too) is checked against store/events.py
sys.path.insert(0, str(Path(__file__).parent))

from hypothesis import settings as hypothesis_settings  # noqa: E402
from openai_server import ScriptServer  # noqa: E402

from primefs import hookimpl  # noqa: E402
from primefs.plugins import plugin_manager, providers  # noqa: E402
from primefs.providers.base import ModelError, ModelReply  # noqa: E402
from primefs.runner.agent import Agent  # noqa: E402
from primefs.runner.bell import Bell  # noqa: E402
from primefs.runner.core import Runner  # noqa: E402
from primefs.runner.tree import SessionTree  # noqa: E402
from primefs.store import trust  # noqa: E402
from primefs.store.control import lock_held  # noqa: E402
from primefs.store.frontmatter import dump_yaml, load_yaml  # noqa: E402
from primefs.store.session import Session, create_session, list_sessions  # noqa: E402
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


def cli(*args, cwd=None, env=None, input=None, timeout: float = 120, clean: bool = True):
    """`primefs [-w WS] ARGS` as a user runs it: a process of its own, 200 columns, no PRIMEFS_WORKSPACE
    (unless `env` gives one). A Workspace as the first argument becomes `-w WS`; without one the cwd or
    the env decides, as for a user. `env` adds to (or overrides) the test's environment. `clean`: no traceback
    in stderr, whatever went wrong (primefs says an error in one line); False where the code the test runs is
    meant to raise (`primefs exec`)."""
    ws, args = (args[0], args[1:]) if args and isinstance(args[0], Workspace) else (None, args)
    full_env = {**os.environ, "COLUMNS": "200", **(env or {})}
    if "PRIMEFS_WORKSPACE" not in (env or {}):
        full_env.pop("PRIMEFS_WORKSPACE", None)
    where = ["-w", str(ws.root)] if ws is not None else []
    r = subprocess.run([*PRIMEFS, *where, *args], cwd=cwd, env=full_env, input=input, capture_output=True, text=True,
                       timeout=timeout)
    if clean:
        assert "Traceback" not in r.stderr, r.stderr
    return r


def by_name(ws) -> dict[str, Session]:
    """The workspace's sessions by name (a Workspace, or the folder of one)."""
    return {s.name: s for s in list_sessions((ws.root if isinstance(ws, Workspace) else Path(ws)) / "sessions")}


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


class Output:
    """A child process's stream, read as it is written (a thread): a test waits for what it says, not
    for a time. `text` so far; `wait(s)` until it holds s."""

    def __init__(self, stream):
        self.chunks: list[bytes] = []
        self.thread = threading.Thread(target=lambda: self.chunks.extend(iter(lambda: os.read(stream.fileno(), 4096),
                                                                              b"")), daemon=True)
        self.thread.start()

    @property
    def text(self) -> str:
        return b"".join(self.chunks).decode(errors="replace")

    def wait(self, what: str, timeout: float = 60.0) -> str:
        wait_for(lambda: what in self.text, timeout, repr(what))
        return self.text


def wait_for(pred, timeout: float = 60.0, what: str = "condition"):
    """Poll until pred() is truthy; return its value (tests of things that happen in other threads)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = pred()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


# -- unit tests (tests/unit/): the runner's parts without a runner ---------------------------------------
class MockProvider:
    """An in-process model in the style of simonw/llm's MockModel: the test queues its replies (`enqueue`),
    every call is kept in `history` as (messages, tools, settings). It serves model ids `mock/...` (or an
    alias with `provider: mock`) and is registered as a plugin registers a provider (`mock_providers`).
    A reply is text, a ModelReply, an exception (raised), or a function of the call's settings that returns
    one of these (to see `_cancel`, call `_progress`, or block). With nothing queued the call fails."""

    name = "mock"

    def __init__(self):
        self.history: list[tuple[list, list | None, dict]] = []
        self._queue: list = []
        self._lock = threading.Lock()

    def matches(self, model_id: str) -> bool:
        return model_id.startswith("mock/")

    def enqueue(self, *replies) -> None:
        with self._lock:
            self._queue.extend(replies)

    def complete(self, messages, tools, settings) -> ModelReply:
        with self._lock:
            self.history.append((messages, tools, settings))
            reply = self._queue.pop(0) if self._queue else ModelError("nothing queued for the mock model",
                                                                      retryable=False)
        if not isinstance(reply, BaseException) and callable(reply):
            reply = reply(settings)
        if isinstance(reply, BaseException):
            raise reply
        if isinstance(reply, str):  # usage as a provider counts it: words in, words out
            words = sum(len(str(m.get("content") or "").split()) for m in messages)
            reply = ModelReply(text=reply, input_tokens=words, output_tokens=len(reply.split()), cost_known=True,
                               model=settings["model"])
        return reply


class _MockProviderPlugin:
    def __init__(self, provider: MockProvider):
        self.provider = provider

    @hookimpl
    def register_providers(self, register):
        register(self.provider)


@pytest.fixture
def mock_model() -> MockProvider:
    return MockProvider()


def mock_providers(ws: Workspace, mock: MockProvider) -> list:
    """The providers a runner of `ws` finds (plugins.providers), with `mock` registered by a plugin first."""
    pm = plugin_manager(ws.root)
    pm.register(_MockProviderPlugin(mock), name="tests-mock-provider")
    return providers(pm)


def new_session(ws: Workspace, tree: SessionTree, name: str, parent: Session | None = None,
                model: str = "mock/model", task: str | None = None, **extra) -> Session:
    """A session as intake or rlm() makes it (its files on disk), linked into `tree`. `extra`: session.yaml
    keys (budget, end_conditions, autonomous, limits, ...)."""
    s = create_session(ws.sessions, task=task or f"the task of {name}", name=name, model=model,
                       parent=parent.id if parent else None, depth=parent.meta["depth"] + 1 if parent else 0,
                       extra=extra)
    tree.put(s)
    tree.link(s.id, s.meta.get("parent"))
    return s


def agent_of(ws: Workspace, tree: SessionTree, session: Session, *, post=None, bell=None, gateway=None,
             cls=None) -> Agent:
    """The session's real Agent, with no kernel host: nothing in a unit test starts a kernel."""
    return (cls or Agent)(session, ws=ws, tree=tree, gateway=gateway, post=post, host=None, bell=bell or Bell())


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
