"""Cached prompt tokens: reported by a real OpenAI-compatible server, read through litellm, priced as the
provider prices them, counted in history, summaries, `usage`, the web view, traces and budgets."""
from __future__ import annotations

import json

import pytest
from conftest import cli, configure, run_once, use_server

from primefs.index.accounting import UsageIndex
from primefs.store.goals import write_goal
from primefs.store.session import list_sessions
from primefs.tracing import spans as tracing


def only(ws, name):
    (s,) = [s for s in list_sessions(ws.sessions) if s.name == name]
    return s


def priced(ws, server):
    """The default model is the local server, under a name litellm has prices for (cache reads too)."""
    ws = use_server(ws, server)
    models = dict(ws.config["models"])
    models["fake"] = {**models["fake"], "model": "openai/gpt-4o-mini"}
    return configure(ws, models=models)


def test_cached_tokens_are_counted_apart_and_priced_as_cache_reads(ws, server):
    full = {"input_tokens": 1000, "output_tokens": 10}
    hit = {**full, "cached_tokens": 800}
    write = {**full, "cache_creation_input_tokens": 300}
    server.set_script({"rules": [{"match": "^Cache", "replies": [
        {"code": "x = 1", "usage": full}, {"code": "x = 2", "usage": hit}, {"code": "x = 3", "usage": write},
        {"text": "done", "usage": hit}]}]})
    ws = priced(ws, server)
    write_goal(ws, "Cache me", name="c")
    run_once(ws)
    s = only(ws, "c")
    calls = s.events("model_call")
    assert [c.get("cache_read_tokens", 0) for c in calls] == [0, 800, 0, 800]
    assert [c.get("cache_write_tokens", 0) for c in calls] == [0, 0, 300, 0]
    assert all(c["input_tokens"] == 1000 and c["cost_known"] for c in calls)
    # litellm's price for gpt-4o-mini: a cached input token costs half of an uncached one
    assert calls[1]["cost_usd"] == pytest.approx(calls[0]["cost_usd"] - 800 * 0.15e-6 / 2, rel=1e-6)

    data = json.loads(cli(ws, "usage", "c", "--json").stdout)
    for part in ("own", "tree"):
        u = data[part]
        assert (u["input_tokens"], u["cache_read_tokens"], u["cache_write_tokens"]) == (4000, 1600, 300)
        assert u["cost_usd"] == pytest.approx(sum(c["cost_usd"] for c in calls))
    table = cli(ws, "usage", "c").stdout
    assert "cached r/w" in table and "1,600/300" in table
    shown = cli(ws, "log", "c").stdout
    assert "1,000 in (800 cached)" in shown and "1,000 in (300 cache writes)" in shown
    assert UsageIndex(ws.sessions).tree(s.id)["cache_read_tokens"] == 1600


def test_the_endpoint_the_web_view_and_traces_show_cached_tokens(ws, server):
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    server.set_script({"rules": [{"match": "^Cache", "replies": [
        {"text": "done", "usage": {"input_tokens": 500, "output_tokens": 5, "cached_tokens": 400}}]}]})
    ws = priced(ws, server)
    write_goal(ws, "Cache once", name="c")
    exporter = InMemorySpanExporter()
    tracing.install(tracing.make_provider(span_exporter=exporter))
    try:
        run_once(ws)
    finally:
        tracing.reset()
    (chat,) = [sp.attributes for sp in exporter.get_finished_spans() if sp.name.startswith("chat ")]
    assert chat["gen_ai.usage.input_tokens"] == 500 and chat["gen_ai.usage.cache_read.input_tokens"] == 400
    assert chat["gen_ai.usage.cache_creation.input_tokens"] == 0

    from test_web import client

    page = client(ws).get("/usage").text
    assert "cached r/w" in page and "400/0" in page
    s = only(ws, "c")
    assert "500 in (400 cached, 0 cache writes)" in client(ws).get(f"/s/{s.id}").text

    from primefs.web.openai import usage

    u = UsageIndex(ws.sessions).tree(s.id)
    assert usage(u)["prompt_tokens_details"] == {"cached_tokens": 400}


@pytest.mark.parametrize("counting, calls", [("all", 3), ("uncached", 13)])
def test_a_token_budget_counts_cache_reads_unless_told_not_to(ws, server, counting, calls):
    # 100 tokens a call, 80 of them cache reads: a budget of 250 holds 3 calls counting all, 13 without reads
    usage = {"input_tokens": 90, "output_tokens": 10, "cached_tokens": 80}
    server.set_script({"rules": [{"match": "^Spend", "replies": [{"code": "x = 1", "usage": usage}] * 30}]})
    ws = use_server(ws, server, limits={"loop_repeat": 0, "loop_window": 0, "max_steps_per_turn": 100,
                                        "budget_tokens": counting})
    write_goal(ws, "Spend", name="spend", extra={"budget": {"tokens": 250}})
    run_once(ws)
    s = only(ws, "spend")
    assert s.meta["stop_reason"] == "budget:tokens" and len(s.events("model_call")) == calls


def test_an_unknown_way_of_counting_is_an_error_naming_the_limit(ws):
    (ws.goals / "g.md").write_text("---\nlimits: {budget_tokens: some}\n---\nx\n")
    r = cli(ws, "status")
    assert "limit budget_tokens must be one of all, uncached, not 'some'" in r.stderr
