"""HTML from templates (primefs/web/templates, autoescaped): pages, table rows, timeline events.

Events are rendered on the server only, for the first page and for the live stream alike, so the
page's script just inserts what it is sent. An event a template cannot render (a hand-edited or
future history line) is shown as its raw JSON, never an error page.
"""
from __future__ import annotations

import json
import time
from pathlib import Path

from jinja2 import Environment, FileSystemLoader, select_autoescape
from markupsafe import Markup, escape

from primefs.views.events import code_of, fields, restored_text
from primefs.views.when import human_age

TEMPLATES = Path(__file__).parent / "templates"


def _clock(ts) -> str:
    try:
        return time.strftime("%H:%M:%S", time.localtime(float(ts)))
    except (TypeError, ValueError):
        return ""


def _when(ts) -> str:
    try:
        return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(ts)))
    except (TypeError, ValueError):
        return ""


def _age(ts) -> str:
    try:
        return human_age(time.time() - float(ts))
    except (TypeError, ValueError):
        return ""


def _num(n) -> str:
    try:
        return f"{int(n):,}"
    except (TypeError, ValueError):
        return str(n)


def _usd(x) -> str:
    try:
        return f"{float(x):.4f}"
    except (TypeError, ValueError):
        return str(x)


def _short(text, n: int = 80) -> str:
    text = " ".join(str(text or "").split())
    return text if len(text) <= n else text[: n - 1] + "…"


def _pretty(value) -> str:
    return json.dumps(value, ensure_ascii=False, indent=1, default=str)


def make_env() -> Environment:
    env = Environment(loader=FileSystemLoader(str(TEMPLATES)), autoescape=select_autoescape(default=True),
                      trim_blocks=True, lstrip_blocks=True)
    env.filters.update(clock=_clock, when=_when, age=_age, num=_num, usd=_usd, short=_short, pretty=_pretty,
                       fields=fields, restored_text=restored_text)
    return env


def waiting_calls(events: list[dict]) -> tuple[int, list[dict]] | None:
    """The python calls of the last reply in `events` whose cells are not written yet: (the reply's
    place, [{"id", "code"}]). The runner runs a reply's calls in order, writing a cell for each."""
    for i in range(len(events) - 1, -1, -1):
        e = events[i]
        if isinstance(e, dict) and e.get("type") == "assistant":
            ran = sum(1 for c in events[i + 1:] if isinstance(c, dict) and c.get("type") == "cell")
            calls = e.get("calls") if isinstance(e.get("calls"), list) else []
            return i, [{"id": str(c.get("id") or ""), "code": code_of(c)} for c in calls[ran:]
                       if isinstance(c, dict) and c.get("name") == "python"]
    return None


class Renderer:
    def __init__(self):
        self.env = make_env()
        module = self.env.get_template("_event.html").module
        self._event, self._pending = module.event, module.pending

    def page(self, template: str, /, **ctx) -> str:
        return self.env.get_template(template).render(**ctx)

    def events(self, events: list[dict], names: dict[str, str], running: bool | None = None) -> Markup:
        """`running` is given when `events` end the history (a live page or stream): the last reply's
        python calls that have no cell yet are shown as cells to come, with their code and, if the session
        runs (True), a running sign; each cell, once written, takes its place (app.js)."""
        waiting = waiting_calls(events) if running is not None else None
        out = []
        for i, e in enumerate(events):
            try:
                out.append(str(self._event(e, names)))
            except Exception:  # a line we cannot render still shows what it holds
                out.append(f'<div class="ev ev-raw"><pre>{escape(_pretty(e))}</pre></div>')
            if waiting and waiting[0] == i:
                out.extend(str(self._pending(call, running)) for call in waiting[1])
        return Markup("".join(out))
