"""The traces in a real backend: Arize Phoenix receives them over OTLP/HTTP, live and replayed, and gives
them back through its own client, once each, with the ids and token counts primefs gives.

Marked `netns`: Phoenix's OTLP/gRPC receiver listens on every address, so `make test` runs this inside its
loopback-only network namespace. It needs the `phoenix` extra (`make install` has it).
"""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import urllib.request

import pytest
from conftest import wait_for
from test_tracing import fan_out

pytestmark = [pytest.mark.netns, pytest.mark.slow]
PROJECT = "primefs-test"
END = "end of the test's exports"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/healthz", timeout=2) as r:
            return r.status == 200
    except OSError:
        return False


@pytest.fixture
def phoenix(tmp_path):
    pytest.importorskip("phoenix.server.main")
    port = free_port()
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("OTEL_")},
           "PHOENIX_WORKING_DIR": str(tmp_path / "phoenix"), "PHOENIX_HOST": "127.0.0.1", "PHOENIX_PORT": str(port),
           "PHOENIX_GRPC_PORT": str(free_port()), "PHOENIX_TELEMETRY_ENABLED": "false",
           "PHOENIX_ALLOW_EXTERNAL_RESOURCES": "false"}
    log = open(tmp_path / "phoenix.log", "wb")
    proc = subprocess.Popen([sys.executable, "-m", "phoenix.server.main", "serve"], env=env, stdout=log,
                            stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: proc.poll() is not None or healthy(url), timeout=180, what="Phoenix to serve")
        assert proc.poll() is None, (tmp_path / "phoenix.log").read_text()[-3000:]
        yield url
    finally:
        proc.terminate()
        proc.wait(30)
        log.close()


def mark_the_end(url: str) -> None:
    """One more span, sent last: Phoenix inserts what it receives in order, so once this one can be
    read, everything sent before it has been taken (or dropped as a span it already had)."""
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor

    provider = TracerProvider(resource=Resource.create({"openinference.project.name": PROJECT}))
    provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(endpoint=url + "/v1/traces")))
    provider.get_tracer("test").start_span(END).end()
    provider.shutdown()


def test_phoenix_keeps_each_span_once_with_the_ids_and_tokens_primefs_gives(ws, phoenix):
    from phoenix.client import Client

    ws = fan_out(ws)
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("OTEL_")},
           "OTEL_EXPORTER_OTLP_ENDPOINT": phoenix, "OTEL_RESOURCE_ATTRIBUTES": f"openinference.project.name={PROJECT}"}

    def pf(*args) -> str:
        out = subprocess.run([sys.executable, "-m", "primefs", "-w", str(ws.root), *args], capture_output=True,
                             text=True, env=env, timeout=180)
        assert out.returncode == 0, out.stderr
        return out.stdout

    pf("run", "--once", "-q")  # live spans, flushed as the runner exits
    for _ in range(2):  # then the same spans twice more from the history
        assert "14 spans in 1 trace(s) from 3 session(s)" in pf("trace", "root")
    mark_the_end(phoenix)
    client = Client(base_url=phoenix)

    def taken():  # all of them, once the last one sent is there
        spans = client.spans.get_spans(project_identifier=PROJECT, limit=1000)
        return spans if any(s["name"] == END for s in spans) else None
    got = [s for s in wait_for(taken, what="Phoenix to take the spans") if s["name"] != END]
    expected = [json.loads(line) for line in pf("trace", "root", "--json").splitlines()]
    assert len(got) == len(expected) == 14  # three exports, each span once
    assert (sorted((s["context"]["trace_id"], s["context"]["span_id"], s.get("parent_id")) for s in got)
            == sorted((r["trace_id"], r["span_id"], r["parent_span_id"]) for r in expected))
    tree = json.loads(pf("usage", "root", "--json"))["tree"]
    chats = [flat(s["attributes"]) for s in got if s["name"].startswith("chat ")]
    assert (sum(a["gen_ai.usage.input_tokens"] for a in chats), sum(a["gen_ai.usage.output_tokens"] for a in chats)) \
        == (tree["input_tokens"], tree["output_tokens"]) and tree["calls"] == len(chats) == 8


def flat(attrs: dict, prefix: str = "") -> dict:
    """Phoenix gives attributes back nested by their dotted names: flat again."""
    out = {}
    for key, value in attrs.items():
        if isinstance(value, dict):
            out.update(flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out
