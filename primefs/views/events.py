"""History events as people read them (`primefs log`, `log -f`, `attach`, `run -v`).

Piped or redirected, the output is a faithful transcript: plain text exactly as recorded, no colour,
no line breaks added. On a terminal: colours, and prose wrapped to the width; code and cell output
are never wrapped (the terminal folds long lines, the text stays as it was).
"""
from __future__ import annotations

import json
import re
import threading
from datetime import datetime
from pathlib import Path

from rich.console import Console
from rich.text import Text

from primefs.store.session import Session
from primefs.views import console


def _ts(e: dict) -> str:
    try:
        return datetime.fromtimestamp(float(e.get("ts", 0))).strftime("%H:%M:%S")
    except (TypeError, ValueError, OverflowError, OSError):
        return "??:??:??"


def code_of(call: dict) -> str:
    try:
        return json.loads(call.get("arguments") or "{}").get("code", "")
    except (ValueError, AttributeError):
        return str(call.get("arguments") or "")


def fields(e: dict) -> str:
    """An event of a type we have no words for, as its fields (`key: value, ...`, values as JSON)."""
    rest = {k: v for k, v in e.items() if k not in ("ts", "type", "n")}
    return ", ".join(f"{k}: {v if isinstance(v, str) else json.dumps(v, default=str)}" for k, v in rest.items())


def restored_text(e: dict) -> str:
    """What a `restored` event says came back from the snapshot, and what did not."""
    back = ", ".join(e.get("restored", []) + [f"{m} (module)" for m in e.get("modules", [])]) or "nothing"
    missing = e.get("failed", []) + e.get("skipped", [])
    return back + (f"; not restored: {', '.join(missing)}" if missing else "")


# Events shown as one line: type -> (label, style, rest) of EventPrinter.head
ONE_LINE = {
    "notice": lambda e: ("notice", "yellow", e["text"]),
    "turn_start": lambda e: (f"turn {e['turn']} {'resumed' if e.get('resumed') else 'started'}", "dim", ""),
    "budget": lambda e: ("budget", "red", f"{e['reason']}: {e['detail']}"),
    "heartbeat_set": lambda e: ("heartbeat set", "yellow", f"{e['id']} {e['schedule']}: {e['prompt']}"),
    "kernel_connect": lambda e: (f"kernel connection file handed to the {e.get('by', 'user')}", "yellow",
                                 e.get("file", "")),
    "approval_request": lambda e: (f"waits for approval {e['approval']}", "bold yellow",
                                   f"{e.get('what')} ({e.get('why')}): primefs approve / deny (in attach: "
                                   f"/approve {e['approval']} or /deny {e['approval']} REASON)"),
    "approval": lambda e: (f"approval {e['approval']} {e.get('verdict')}",
                           "green" if e.get("verdict") == "approved" else "yellow",
                           f"by {e.get('by')} ({e.get('via')})" + (f": {e['reason']}" if e.get("reason") else "")),
}


class EventPrinter:
    def __init__(self, out: Console | None = None, names: dict[str, str] | None = None):
        self.out = out or console.out()
        self.names = names or {}
        self.streamed = ""  # text of the reply shown as it streamed (its `assistant` event shows the rest)
        self.mid_line = False  # streamed text ended without a newline
        self.tag = ""  # printed before each label: the session, when several are shown together
        self.said_error: str | None = None  # the last error text shown (a failed call carries it thrice)

    def who(self, sid: str) -> str:
        return f"{sid} ({self.names[sid]})" if sid in self.names else str(sid)

    # -- output primitives ------------------------------------------------------------------------
    def head(self, e: dict, label: str, style: str, rest: str = "") -> None:
        """One line: time, a coloured label, then text (wrapped on a terminal, as is when piped)."""
        self.end_line()
        line = Text(_ts(e) + " ", style="dim")
        if self.tag:
            line.append(self.tag + " ", style="bold")
        line.append(label, style=style)
        if rest:
            line.append(" " + rest)
        self.out.print(line, soft_wrap=not self.out.is_terminal)

    def end_line(self) -> None:
        if self.mid_line:
            self.out.print()
            self.mid_line = False

    def prose(self, text: str) -> None:
        if text:
            self.out.print(Text(text), soft_wrap=not self.out.is_terminal)

    def verbatim(self, text: str, style: str = "") -> None:
        """Code and output: never wrapped by us."""
        if text:
            self.out.print(Text(text.rstrip("\n"), style=style if self.out.is_terminal else ""), soft_wrap=True)

    # -- events -----------------------------------------------------------------------------------
    def header(self, session) -> None:
        try:
            self.out.print(Text.assemble((session.id, "bold"), f" ({session.name}) status: {session.status}"),
                           soft_wrap=True)
        except Exception as exc:  # noqa: BLE001 - a broken session.yaml: its history is still shown
            self.out.print(Text.assemble((session.id, "bold"), (" broken: ", "red"), str(exc)), soft_wrap=True)

    def events(self, events: list[dict]) -> None:
        for e in events:
            try:
                self.event(e)
            except Exception:  # noqa: BLE001 - an event written by hand or by another version: shown raw
                self.verbatim(json.dumps(e, ensure_ascii=False, default=str))

    def event(self, e: dict) -> None:
        t = e.get("type")
        if t in ONE_LINE:
            self.head(e, *ONE_LINE[t](e))
            return
        method = getattr(self, f"_{t}", None)
        if method is None:
            self.head(e, str(t), "dim", fields(e))
        else:
            method(e)

    def _task(self, e):
        self.head(e, "task", "bold cyan")
        self.prose(e["text"])

    def _message(self, e):
        how = f" (read by {e['read_by']})" if e.get("read_by") else ""
        self.head(e, f"{e['kind']} from {self.who(e['from'])}{how}", "bold cyan")
        self.prose(e["text"])

    def _model_call(self, e):
        cost = f", ${e['cost_usd']:.6f}" if e.get("cost_known") else ", cost unknown"
        self.head(e, f"model {e['model']} ({e['purpose']})", "dim",
                  f"{e['input_tokens']:,} in{cached_text(e)}, {e['output_tokens']:,} out, {e['latency_s']:.2f} s{cost}")

    def _step(self, e):
        """The model is asked for the next step (`run -v` only: never in history)."""
        self._end_stream()
        self.head(e, f"step {e['step']} of {e['of']}", "dim", f"asking {e['model']} ...")

    def _model_error(self, e):
        self._end_stream()
        retry = f", retry in {e['retry_in_s']:g} s" if e.get("retry_in_s") else ""
        self.head(e, f"model error (attempt {e['attempt']}{retry})", "red", e["error"])
        self.said_error = e["error"]

    def _delta(self, e):
        """A piece of a reply as it streams (`attach`, `log -f`, `run -v`; never in history.jsonl)."""
        if not self.mid_line:  # a new line: say whose text this is
            self.head(e, "assistant" + (" (cont.)" if self.streamed else ""), "bold green")
        self.streamed += e["text"]
        self.out.print(Text(e["text"], style="green" if self.out.is_terminal else ""), end="", soft_wrap=True)
        self.out.file.flush()
        self.mid_line = True

    def _end_stream(self, text: str = "") -> bool:
        """The streamed reply is complete: show what the stream had not shown yet. False if the stream
        did not show the start of `text` (then the whole reply is printed as usual)."""
        streamed, self.streamed = self.streamed, ""
        shown = bool(streamed) and text.startswith(streamed)
        if shown and text[len(streamed):]:
            self.out.print(Text(text[len(streamed):]), end="", soft_wrap=True)
            self.mid_line = True
        self.end_line()
        return shown

    def _assistant(self, e):
        text, at = e.get("text") or "", 0
        if self._end_stream(text):
            text = ""  # shown as it streamed; its tool calls follow
        else:
            self.head(e, "assistant", "bold green")
        for m in re.finditer(r"```[^\n]*\n.*?```", text, re.DOTALL):  # fenced code: never wrapped
            self.prose(text[at:m.start()].strip("\n"))
            self.verbatim(m.group(0), "cyan")
            at = m.end()
        self.prose(text[at:].strip("\n"))
        for call in e.get("calls") or []:
            if call.get("name") == "python":
                self.verbatim(code_of(call), "cyan")
            else:
                self.verbatim(f"[call of {call.get('name')}: {call.get('arguments')}]", "cyan")

    def _cell(self, e):
        extra = []
        if e.get("timed_out"):
            extra.append("timed out")
        if e.get("restarted"):
            extra.append("kernel restarted")
        took = f" {e['elapsed_s']:.2f} s" if e.get("elapsed_s") is not None else ""
        self.head(e, "output", "magenta", (took + (f" ({', '.join(extra)})" if extra else "")).strip())
        self.verbatim(e.get("shown", ""))

    def _result(self, e):
        self.head(e, "result", "bold")
        self.prose(e["text"])

    def _status(self, e):
        why = f" ({e['stop_reason']})" if e.get("stop_reason") else ""
        self.head(e, "status", "blue", f"{e.get('previous')} -> {e['status']}{why}")
        if e.get("error") and not self._said(e["error"]):
            self.prose(str(e["error"]))

    def _warning(self, e):
        self.head(e, "warning", "yellow", e["text"])

    def _error(self, e):
        self.head(e, "error", "red", "(the model error above)" if self._said(e["error"]) else e["error"])

    def _said(self, text) -> bool:
        """The same error text was just shown (a failed model call: its last attempt, the turn's error,
        the failed status all carry it): once is enough."""
        said = self.said_error == text
        self.said_error = text
        return said

    def _spawn(self, e):
        agent = f" as {e['agent']}" if e.get("agent") else ""
        self.head(e, "spawned", "bold yellow", f"{e['child']} ({e['name']}){agent}, model {e['model']}: {e['task']}")

    def _sent(self, e):
        to = ", ".join(self.who(x) for x in e["to"])
        self.head(e, f"sent {e['kind']} to {e['target']}", "yellow", f"({to}): {e['text']}")

    def _bad_mail(self, e):
        self.head(e, "bad mail", "red", f"{e['file']}: {e['error']}")

    def _compaction(self, e):
        self.head(e, "compaction", "yellow", f"events up to n={e['upto_n']} ({e['replaced']}) replaced by a summary "
                                             f"({e['tokens_before']:,} tokens before):")
        self.prose(e["summary"])

    def _compaction_done(self, e):
        self.head(e, "compaction done", "dim", f"{e['tokens_after']:,} tokens after")

    def _kernel(self, e):
        how = f" ({e['reason']})" if e.get("reason") else ""
        where = f", pid {e['pid']}" if e.get("pid") else ""
        node = f" on {e['node']}" if e.get("node") not in (None, "local") else ""
        took = f", {e['start_s']:.2f} s" if e.get("start_s") is not None else ""
        self.head(e, f"kernel {e['event']}", "dim", f"{how}{where}{node}{took}".lstrip(", "))

    def _restored(self, e):
        if e.get("error"):
            self.head(e, "restore failed", "red", e["error"])
            return
        self.head(e, "restored", "dim", restored_text(e))

    def _snapshot(self, e):
        if e.get("error"):
            self.head(e, f"snapshot ({e['reason']}) failed", "red", e["error"])
        else:
            self.head(e, f"snapshot ({e['reason']})", "dim", f"{e['saved']} saved, {e['bytes']:,} bytes; left out: "
                                                             f"{', '.join(e.get('skipped') or []) or 'nothing'}")

    def _turn_end(self, e):
        why = f" ({e['stop_reason']})" if e.get("stop_reason") else ""
        self.head(e, f"turn {e['turn']} ended", "dim", f"{e['outcome']} in {e['elapsed_s']:.2f} s, status "
                                                      f"{e.get('status')}{why}")


    def _end_conditions(self, e):
        marks = ", ".join(f"{r['name']} {'passed' if r['passed'] else 'FAILED'}" for r in e.get("results", []))
        self.head(e, "end conditions", "yellow", marks)
        self.verbatim(e.get("report") or "")

    def _done_refused(self, e):
        self.head(e, "done() refused", "yellow")
        self.verbatim(e.get("report") or "")

    def _harness(self, e):
        commit = f", commit {str(e['commit'])[:10]}" if e.get("commit") else ", no change"
        self.head(e, f"harness {e['op']}", "yellow", f"{e['kind']}/{e['name']} ({e['scope']}){commit}")

    def _refine(self, e):
        if e.get("error"):
            self.head(e, "refine failed", "red", e["error"])
            return
        self.head(e, "refine", "yellow", f"{len(e['applied'])} applied, {len(e['rejected'])} rejected")
        for a in e["applied"]:
            self.prose(f"  {a['op']} {a['kind']}/{a['name']}: {a['commit']}  ({a.get('intent')})")
        for r in e["rejected"]:
            self.prose(f"  rejected {r['edit']}: {r['reason']}")

    def _exec(self, e):
        took = f" {e['elapsed_s']:.2f} s" if e.get("elapsed_s") is not None else ""
        self.head(e, f"exec by {e.get('by', 'user')}", "bold magenta", took.strip())
        self.verbatim(e.get("code") or "", "cyan")
        self.verbatim((e.get("output") or "") + (("\n" + e["error"]) if e.get("error") else ""))

    def _tool_call(self, e):
        failed = f": {e['error']}" if e.get("error") else ""
        self.head(e, f"tool {e['name']}", "red" if failed else "dim", f"{e['duration_s']:.2f} s{failed}")


class Narrator:
    """`primefs run -v`: what every session of this runner does, as it happens (a livefeed listener):
    each session's events and streamed replies, each line tagged with the session's name."""

    def __init__(self, out: Console, sessions_dir: Path):
        self.out, self.dir = out, sessions_dir
        self.printers: dict[str, EventPrinter] = {}
        self.current: str | None = None
        self.lock = threading.Lock()  # sessions' turns run in threads of their own

    def __call__(self, sid: str, e: dict) -> None:
        with self.lock:
            printer = self.printers.get(sid)
            if printer is None:
                printer = self.printers[sid] = EventPrinter(self.out)
                try:
                    printer.tag = Session(self.dir / sid).name
                except Exception:  # noqa: BLE001 - a broken session.yaml: its id will do
                    printer.tag = sid
            if self.current != sid and self.current in self.printers:
                self.printers[self.current].end_line()  # another session's stream was mid-line
            self.current = sid
            printer.events([e])

    def say(self, line) -> None:
        """A line of the runner's own log (stderr), never in the middle of a streamed reply."""
        with self.lock:
            if self.current in self.printers:
                self.printers[self.current].end_line()
            self.out.file.flush()
            console.err().print(line, soft_wrap=True)


def print_events(out: Console, session, events: list[dict], names: dict[str, str] | None = None,
                 header: bool = True) -> None:
    printer = EventPrinter(out, names)
    if header:
        printer.header(session)
    printer.events(events)


def cached_text(e: dict) -> str:
    """" (800 cached, 300 cache writes)": what of a model call's input came from (or went to) the prompt
    cache; "" for the calls that had none."""
    parts = [f"{e[k]:,} {what}" for k, what in (("cache_read_tokens", "cached"), ("cache_write_tokens", "cache writes"))
             if isinstance(e.get(k), int) and e[k]]
    return f" ({', '.join(parts)})" if parts else ""
