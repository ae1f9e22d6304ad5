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
from conftest import configure, run_once, sigkill_runner_when, use_server

from primefs.tracing import spans as tracing
from primefs.index.accounting import UsageIndex
from primefs.cli.main import main
from primefs.cli.trace import span_record
from primefs.store.goals import write_goal
from primefs.store.session import list_sessions

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


def fan_out(ws):
    """The goal `root` (SCRIPT), model alias `fast`, not run yet: 3 turns, 8 model calls, 3 cells."""
    (ws.root / "script.yaml").write_text(SCRIPT)
    ws = configure(ws, model="fast", models={"fast": {"model": "scripted/script.yaml"}},
                   limits={"max_concurrent_sessions": 4})
    write_goal(ws, "fan out to two children", name="root")
    return ws


@pytest.fixture
def tree_ws(ws):
    return fan_out(ws)


@pytest.fixture
def memory():
    exporter = InMemorySpanExporter()
    tracing.install(tracing.make_provider(span_exporter=exporter))
    yield exporter
    tracing.reset()


def replayed(ws, name: str = "root") -> list:
    """The spans `primefs trace NAME` makes, caught in memory."""
    from primefs.tracing.replay import replay

    exporter = InMemorySpanExporter()
    provider = tracing.make_provider(span_exporter=exporter)
    replay(ws, next(s.id for s in list_sessions(ws.sessions) if s.name == name), provider.get_tracer("test"))
    return exporter.get_finished_spans()


def records(spans) -> list[dict]:
    return sorted((span_record(s) for s in spans), key=lambda r: r["span_id"])


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
    # the model id the alias `fast` resolved to, on turns and calls alike; the alias on the turn
    assert {s.attributes["gen_ai.request.model"] for s in chat + turns} == {"scripted/script.yaml"}
    assert {s.attributes["gen_ai.response.model"] for s in chat} == {"scripted/script.yaml"}
    assert {s.attributes["primefs.session.model"] for s in turns} == {"fast"}
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
    again = replayed(tree_ws)
    check_tree(again, tree_ws)
    assert shape(again) == shape(live)
    # replayed spans carry the recorded times: a child's turn lies inside the cell that waited for it
    cell = next(s for s in again if s.name == "execute_tool python" and s.parent
                and s.attributes["primefs.session.id"] == rows[0]["attributes"]["gen_ai.agent.id"])
    kids = [s for s in again if s.parent and s.parent.span_id == cell.context.span_id]
    assert kids and all(cell.start_time <= k.start_time <= k.end_time <= cell.end_time for k in kids)


def test_live_spans_are_the_spans_the_replay_makes_ids_included(tree_ws, memory):
    """Live and replayed spans are made from the same events by the same functions: equal ids, parents,
    times and attributes; and a history gives the same spans at every replay (exporting twice adds none)."""
    run_once(tree_ws)
    live = records(memory.get_finished_spans())
    first, second = records(replayed(tree_ws)), records(replayed(tree_ws))
    assert first == second
    assert first == live
    assert len({r["span_id"] for r in live}) == len(live) == 14


def test_response_model_is_what_the_provider_said_live_and_replayed(ws, server, memory):
    ws = use_server(ws, server)  # alias `fake`: openai/test-model through litellm, over HTTP
    write_goal(ws, "say hello", name="hello")
    run_once(ws)
    live = records(memory.get_finished_spans())
    assert records(replayed(ws, "hello")) == live
    (turn,) = [r["attributes"] for r in live if r["name"] == "invoke_agent hello"]
    (chat,) = [r["attributes"] for r in live if r["name"].startswith("chat ")]
    assert turn["gen_ai.request.model"] == chat["gen_ai.request.model"] == "openai/test-model"
    assert turn["primefs.session.model"] == "fake" and chat["gen_ai.provider.name"] == "openai"
    assert chat["gen_ai.response.model"] == "test-model"  # as the server named it


def test_hand_written_numbers_are_counted_as_primefs_usage_counts_them(ws, server, memory):
    """A history line written by hand with a string or NaN where a count goes: the replay's span and its
    totals count it as nothing (as `primefs usage` does), and nothing fails."""
    from primefs.tracing.replay import replay

    ws = use_server(ws, server)
    write_goal(ws, "say hello", name="hello")
    run_once(ws)
    (s,) = list_sessions(ws.sessions)
    with open(s.dir / "history.jsonl", "a") as f:
        f.write(json.dumps({"type": "model_call", "ts": 1e9, "model": "m", "input_tokens": "many",
                            "output_tokens": float("nan"), "cost_usd": "free", "attempt": "2", "latency_s": None})
                + "\n")
    chats = [r["attributes"] for r in records(replayed(ws, "hello")) if r["name"] == "chat m"]
    assert chats == [chats[0]] and chats[0]["gen_ai.usage.input_tokens"] == 0 and chats[0]["primefs.cost_usd"] == 0
    counts = replay(ws, s.id, tracing.make_provider(span_exporter=InMemorySpanExporter()).get_tracer("t"))
    usage = json.loads(CliRunner().invoke(main, ["-w", str(ws.root), "usage", "hello", "--json"]).output)["tree"]
    assert (counts["input_tokens"], counts["output_tokens"]) == (usage["input_tokens"], usage["output_tokens"]) > (0, 0)


def test_a_cell_cut_off_by_a_killed_runner_is_replayed(ws):
    """SIGKILL mid-cell: no `cell` event ever says it ended. The replay still shows it, cut off at its runner's
    last event (the llm() call it made), before and after a new runner resumes the turn, with the same ids."""
    (ws.root / "s.yaml").write_text(
        "rules:\n"
        "  - match: '^Long'\n"
        "    replies:\n"
        "      - code: \"print(llm('say hi'))\\nimport time\\ntime.sleep(60)\"\n"
        "      - text: recovered\n"
        "  - match: 'say hi'\n"
        "    replies:\n"
        "      - text: hi\n")
    ws = configure(ws, model="scripted/s.yaml")
    write_goal(ws, "Long job", name="long")
    sigkill_runner_when(ws, lambda: any(len(s.events("model_call")) == 2 for s in list_sessions(ws.sessions)))
    (s,) = list_sessions(ws.sessions)

    def spans():
        by_name = {}
        for sp in replayed(ws, "long"):
            by_name.setdefault(sp.name, []).append(sp)
        return by_name

    killed = spans()
    (cell,) = killed["execute_tool python"]
    (turn,) = killed["invoke_agent long"]
    llm_call = s.events("model_call")[1]
    assert cell.attributes["primefs.cell.unfinished"] is True and cell.attributes["gen_ai.tool.call.id"] == "call_0"
    assert turn.attributes["primefs.turn.unfinished"] is True and cell.parent.span_id == turn.context.span_id
    assert cell.start_time == int(round(s.events("assistant")[0]["ts"] * 1e9))
    assert cell.end_time == turn.end_time == int(round(llm_call["ts"] * 1e9))
    (llm_span,) = [sp for sp in killed["chat scripted/s.yaml"] if sp.attributes["primefs.purpose"] == "llm"]
    assert llm_span.parent.span_id == cell.context.span_id
    run_once(ws)  # a new runner: the cell is said interrupted, the turn resumed and answered
    assert s.reload()["status"] == "idle"
    resumed = spans()
    (again,) = [sp for sp in resumed["execute_tool python"] if sp.attributes.get("primefs.cell.unfinished")]
    assert span_record(again) == span_record(cell)  # the restart's own events are not the dead runner's
    old, new = sorted(resumed["invoke_agent long"], key=lambda sp: sp.start_time)
    assert span_record(old) == span_record(turn)
    assert new.attributes["primefs.turn.resumed"] is True and new.attributes["primefs.turn.outcome"] == "idle"


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
    code = ("import sys; from primefs.store.workspace import Workspace; from primefs.runner.core import Runner; "
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
                                              "parent": sp.parent_span_id.hex() or None,
                                              "ids": (sp.trace_id.hex(), sp.span_id.hex())})
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
        exports = []
        for _ in range(2):  # exported twice: the same ids, the ones the runner gave them live
            out = subprocess.run(pf + ["trace", "root"], capture_output=True, text=True, env=env, timeout=120)
            assert out.returncode == 0, out.stderr
            assert "14 spans in 1 trace(s) from 3 session(s)" in out.stdout
            exports.append(sorted((s["ids"], s["parent"], s["name"]) for s in collector.spans))
            collector.spans.clear()
        assert exports[0] == exports[1] == sorted((s["ids"], s["parent"], s["name"]) for s in live)
    finally:
        collector.close()
    # nobody listening: one clear line, no traceback
    env["OTEL_EXPORTER_OTLP_ENDPOINT"], env["OTEL_EXPORTER_OTLP_TIMEOUT"] = collector.url, "1"
    out = subprocess.run(pf + ["trace", "root"], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 1 and "could not be exported" in out.stderr and "Traceback" not in out.stderr
