"""OpenTelemetry: live spans from a real runner, the same spans replayed from history, OTLP by env."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from click.testing import CliRunner
from conftest import configure, run_once

from primefs import tracing
from primefs.accounting import UsageIndex
from primefs.cli import main
from primefs.goals import write_goal
from primefs.session import list_sessions

pytest.importorskip("opentelemetry.sdk")
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter  # noqa: E402

# root: one cell spawns two children and waits for both; each child calls llm() from a cell, then answers
SCRIPT = """
rules:
  - match: "^sub"
    replies:
      - code: "print(llm('say hi'))"
      - text: "child answer"
  - match: "say hi"
    replies:
      - text: "hi"
default:
  - code: "hs = [rlm('sub task %d' % i) for i in range(2)]\\nprint([h.wait() for h in hs])"
  - text: "done: both"
"""


@pytest.fixture
def tree_ws(ws):
    (ws.root / "script.yaml").write_text(SCRIPT)
    ws = configure(ws, model="scripted/script.yaml", limits={"max_concurrent_sessions": 4})
    write_goal(ws, "fan out to two children", name="root")
    return ws


@pytest.fixture
def memory():
    exporter = InMemorySpanExporter()
    tracing.install(tracing.make_provider(span_exporter=exporter))
    yield exporter
    tracing.reset()


def shape(spans) -> Counter:
    """(span name, parent's name) pairs: the tree's shape, whatever the ids."""
    by_id = {s.context.span_id: s for s in spans}
    return Counter((s.name, by_id[s.parent.span_id].name if s.parent else None) for s in spans)


def token_sums(spans) -> tuple[int, int]:
    calls = [s for s in spans if s.attributes.get("gen_ai.operation.name") == "chat"]
    return (sum(s.attributes.get("gen_ai.usage.input_tokens", 0) for s in calls),
            sum(s.attributes.get("gen_ai.usage.output_tokens", 0) for s in calls))


def check_tree(spans, ws) -> None:
    sessions = {s.name: s for s in list_sessions(ws.sessions)}
    root = sessions["root"]
    by_id = {s.context.span_id: s for s in spans}
    turns = [s for s in spans if s.attributes["gen_ai.operation.name"] == "invoke_agent"]
    assert sorted(s.attributes["gen_ai.agent.name"] for s in turns) == ["root", "root.1", "root.2"]
    root_turn = next(s for s in turns if s.attributes["gen_ai.agent.id"] == root.id)
    assert root_turn.parent is None and root_turn.attributes["primefs.turn.outcome"] == "idle"
    # every span is in the root turn's trace: the children's turns hang under the cell that spawned them
    assert {s.context.trace_id for s in spans} == {root_turn.context.trace_id}
    spawning_cell = next(s for s in spans if s.name == "execute_tool python"
                         and s.attributes["primefs.session.id"] == root.id)
    assert spawning_cell.parent.span_id == root_turn.context.span_id
    for child in (s for s in turns if s is not root_turn):
        assert child.parent.span_id == spawning_cell.context.span_id
        assert child.attributes["primefs.session.parent"] == root.id
        llm = [s for s in spans if s.attributes.get("primefs.purpose") == "llm"
               and s.attributes["primefs.session.id"] == child.attributes["gen_ai.agent.id"]]
        assert len(llm) == 1 and by_id[llm[0].parent.span_id].name == "execute_tool python"  # llm() from a cell
    chat = [s for s in spans if s.attributes["gen_ai.operation.name"] == "chat"]
    assert len(chat) == 2 + 2 * 3
    assert all(s.attributes["gen_ai.request.model"] == "scripted/script.yaml" for s in chat)
    assert all(s.attributes["gen_ai.provider.name"] == "scripted" and s.kind.name == "CLIENT" for s in chat)
    tree = UsageIndex(ws.sessions).tree(root.id)  # what `primefs usage root` says
    assert token_sums(spans) == (tree["input_tokens"], tree["output_tokens"]) and tree["input_tokens"] > 0


def test_live_spans_follow_the_session_tree_and_replay_gives_the_same(tree_ws, memory):
    run_once(tree_ws)
    live = memory.get_finished_spans()
    check_tree(live, tree_ws)
    # `primefs trace` replays the finished history into the same tree
    out = CliRunner().invoke(main, ["-w", str(tree_ws.root), "trace", "root", "--json"])
    assert out.exit_code == 0, out.output
    rows = [json.loads(line) for line in out.output.splitlines()]
    assert len(rows) == len(live)
    exporter = InMemorySpanExporter()
    provider = tracing.make_provider(span_exporter=exporter)
    from primefs.tracereplay import replay

    counts = replay(tree_ws, [s.id for s in list_sessions(tree_ws.sessions) if s.name == "root"][0],
                    provider.get_tracer("test"))
    replayed = exporter.get_finished_spans()
    check_tree(replayed, tree_ws)
    assert shape(replayed) == shape(live)
    assert counts["traces"] == 1 and counts["spans"] == len(live) and counts["unfinished"] == 0
    # replayed spans carry the recorded times: a child's turn lies inside the cell that waited for it
    cell = next(s for s in replayed if s.name == "execute_tool python" and s.parent
                and s.attributes["primefs.session.id"] == rows[0]["attributes"]["gen_ai.agent.id"])
    kids = [s for s in replayed if s.parent and s.parent.span_id == cell.context.span_id]
    assert kids and all(cell.start_time <= k.start_time <= k.end_time <= cell.end_time for k in kids)


def test_tracing_is_off_without_otel_variables(ws, monkeypatch):
    for key in list(os.environ):
        if key.startswith("OTEL_"):
            monkeypatch.delenv(key)
    assert tracing.exporters_from_env() == []
    assert tracing.exporters_from_env({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://x:4318"}) == ["otlp"]
    assert tracing.exporters_from_env({"OTEL_TRACES_EXPORTER": "console,otlp"}) == ["console", "otlp"]
    assert tracing.exporters_from_env({"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "x"}) == []
    assert tracing.exporters_from_env({"OTEL_SDK_DISABLED": "true", "OTEL_TRACES_EXPORTER": "otlp"}) == []
    # a whole run with tracing off never imports opentelemetry
    (ws.root / "script.yaml").write_text("- code: print(6 * 7)\n- text: '42'\n")
    write_goal(configure(ws, model="scripted/script.yaml"), "six times seven", name="m")
    code = ("import sys; from primefs.workspace import Workspace; from primefs.runner import Runner; "
            f"Runner(Workspace({str(ws.root)!r}), log=lambda m: None).run(once=True); "
            "print(sorted(m for m in sys.modules if m.startswith('opentelemetry')))")
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
    assert "42" in next(s for s in list_sessions(ws.sessions)).read_result()
    r = CliRunner().invoke(main, ["-w", str(ws.root), "trace", "m"], env={"OTEL_TRACES_EXPORTER": ""})
    assert r.exit_code == 1 and "tracing is not configured" in r.output


class Collector:
    """An OTLP/HTTP endpoint on loopback that decodes what it receives."""

    def __init__(self):
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

        spans, lock = [], threading.Lock()

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers["Content-Length"]))
                req = ExportTraceServiceRequest.FromString(body)
                with lock:
                    for rs in req.resource_spans:
                        res = {a.key: a.value.string_value for a in rs.resource.attributes}
                        for ss in rs.scope_spans:
                            for sp in ss.spans:
                                attrs = {a.key: (a.value.string_value or a.value.int_value) for a in sp.attributes}
                                spans.append({"name": sp.name, "path": self.path, "resource": res, "attrs": attrs,
                                              "parent": sp.parent_span_id.hex() or None})
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.end_headers()

            def log_message(self, *a):
                pass

        self.spans = spans
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


def test_otlp_export_configured_by_the_environment_live_and_replayed(tree_ws):
    collector = Collector()
    try:
        env = {**{k: v for k, v in os.environ.items() if not k.startswith("OTEL_")},
               "OTEL_EXPORTER_OTLP_ENDPOINT": collector.url, "OTEL_SERVICE_NAME": "pf-test",
               "NO_PROXY": "127.0.0.1", "no_proxy": "127.0.0.1"}
        pf = [sys.executable, "-m", "primefs", "-w", str(tree_ws.root)]
        out = subprocess.run(pf + ["run", "--once", "-q"], capture_output=True, text=True, env=env, timeout=180)
        assert out.returncode == 0, out.stderr
        live = list(collector.spans)  # the batch is flushed when the runner exits
        assert len(live) == 3 + 8 + 3  # turns, model calls, cells
        assert {s["path"] for s in live} == {"/v1/traces"}
        assert {s["resource"]["service.name"] for s in live} == {"pf-test"}
        tree = UsageIndex(tree_ws.sessions).tree(next(s.id for s in list_sessions(tree_ws.sessions) if s.name == "root"))
        assert sum(s["attrs"].get("gen_ai.usage.input_tokens", 0) for s in live) == tree["input_tokens"]
        collector.spans.clear()
        out = subprocess.run(pf + ["trace", "root"], capture_output=True, text=True, env=env, timeout=120)
        assert out.returncode == 0, out.stderr
        assert "14 spans in 1 trace(s) from 3 session(s)" in out.stdout
        assert Counter(s["name"] for s in collector.spans) == Counter(s["name"] for s in live)
    finally:
        collector.close()
    # nobody listening: one clear line, no traceback
    env["OTEL_EXPORTER_OTLP_ENDPOINT"], env["OTEL_EXPORTER_OTLP_TIMEOUT"] = collector.url, "1"
    out = subprocess.run(pf + ["trace", "root"], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 1 and "could not be exported" in out.stderr and "Traceback" not in out.stderr
