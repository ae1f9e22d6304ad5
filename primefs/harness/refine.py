"""Refine: one model call reads a session's recent events and the harness, and proposes edits.

Edits are validated (kind, name, operation; the base prompt and AGENTS.md are not harness
entries and cannot be edited; an entry changed since planning is rejected), then applied as
harness commits with `Primefs-Source: refine`, the evidence (event ids) and the intent.
"""
from __future__ import annotations

import hashlib
import json
import re
from typing import Callable

from primefs.errors import BudgetExhausted, PrimefsError, SessionStopping
from primefs.harness.entries import Harness, check_entry_name, check_kind
from primefs.providers.base import ModelError
from primefs.store.session import Session
from primefs.store.workspace import Workspace

OPS = ("create", "update", "delete")

PROMPT = """You refine the harness of an agent system: standing notes, memories (facts learned), skills \
(Python helpers with instructions) and subagent specs (roles). The harness is reused by later sessions; \
the model weights never change. Read what this session did and propose a few precise edits that would \
make future sessions better (fewer mistakes, fewer steps). Propose nothing if nothing is worth keeping.

Reply with JSON only, of this form:
{{"edits": [{{"op": "create|update|delete", "kind": "note|memory|skill|agent", "name": "kebab-case-name",
  "description": "one line", "body": "Markdown text (for a skill: its instructions)",
  "files": {{"module.py": "python code (skills only, optional)"}},
  "evidence": [event numbers n that support the edit], "rationale": "why",
  "expected_effect": "what should change in later sessions"}}],
 "outcomes": [{{"commit": "sha of an earlier refinement below", "outcome": "good|bad", "note": "what happened"}}]}}
Judge an earlier refinement only if these events show whether its intended effect happened.
Scope of new entries: {scope}.{instructions}

## Earlier refinements without an outcome
{pending}

## Current harness
{overview}

## Session {sid} ({name}): task
{task}

## Its last {count} events (n: type: content)
{events}
"""


def _event_line(e: dict) -> str:
    t = e.get("type")
    if t in ("task", "message", "notice", "result"):
        text = e.get("text", "")
    elif t == "assistant":
        text = e.get("text") or ""
        text += "".join(f"\n[code] {json.loads(c['arguments']).get('code', '') if c.get('arguments') else ''}"
                        for c in e.get("calls") or [] if c.get("name") == "python")
    elif t == "cell":
        text = f"{e.get('code') or ''}\n-> {e.get('shown', '')}"
    elif t in ("error", "model_error"):
        text = e.get("error", "")
    else:
        return ""
    text = text if len(text) <= 1500 else text[:1000] + " [...] " + text[-400:]
    return f"{e['n']}: {t}: {text}"


def fingerprint(ws: Workspace, kind: str, name: str, sessions: list[str]) -> str | None:
    """What an entry's files hold now (None: no such entry): to reject edits of entries changed meanwhile."""
    try:
        e = Harness(ws).get(kind, name, sessions=sessions)
    except PrimefsError:
        return "broken"
    if e is None:
        return None
    path = ws.root / e.path
    files = sorted(path.rglob("*")) if path.is_dir() else [path]
    h = hashlib.sha1()
    for f in files:
        if f.is_file():
            h.update(f.name.encode() + b"\0" + f.read_bytes())
    return h.hexdigest()


def parse_reply(text: str) -> tuple[list, list]:
    """(edits, outcomes) from the model's JSON reply."""
    m = re.search(r"\{.*\}", text or "", re.DOTALL)
    if not m:
        raise PrimefsError("the refine reply holds no JSON object")
    try:
        data = json.loads(m.group(0))
    except ValueError as exc:
        raise PrimefsError(f"the refine reply is not valid JSON: {exc}") from None
    edits = data.get("edits") if isinstance(data, dict) else None
    if not isinstance(edits, list):
        raise PrimefsError('the refine reply needs {"edits": [...]}')
    outcomes = data.get("outcomes") or []
    return edits, outcomes if isinstance(outcomes, list) else []


def refine(ws: Workspace, session: Session, *, complete: Callable[[list[dict]], object], chain: list[str],
           instructions: str | None = None, scope: str = "global", max_events: int = 60) -> dict:
    """Plan with one model call, validate, apply. Returns {"applied": [...], "rejected": [...]}."""
    if scope not in ("global", "session"):
        raise PrimefsError("scope is 'global' or 'session'")
    harness = Harness(ws)
    entries = harness.list(sessions=chain)
    events = [e for e in session.events() if _event_line(e)][-max_events:]
    overview = "\n".join(f"- {e.kind}/{e.name} ({e.scope}): {e.description or '(no description)'}"
                         + (f" [problem: {e.problem}]" if e.problem else "") for e in entries) or "(empty)"
    planned = {(e.kind, e.name): fingerprint(ws, e.kind, e.name, chain) for e in entries}
    pending = [r for r in harness.log(limit=50) if r["source"] == "refine" and not r["outcome"]][:5]
    prompt = PROMPT.format(scope=scope, instructions=f"\nInstructions: {instructions}" if instructions else "",
                           pending="\n".join(f"- {r['sha']}: {r['kind']}/{r['name']}: {r['intent']}" for r in pending)
                           or "(none)",
                           overview=overview, sid=session.id, name=session.name, task=session.task[:4000],
                           count=len(events), events="\n".join(_event_line(e) for e in events))
    reply = complete([{"role": "user", "content": prompt}])
    shown = {e["n"] for e in events}
    edits, outcomes = parse_reply(reply.text)
    applied, rejected, judged = [], [], []
    for edit in edits:
        try:
            applied.append(_apply(ws, harness, edit, planned, shown, session.id, chain, scope))
        except PrimefsError as exc:
            rejected.append({"edit": _short(edit), "reason": str(exc)})
    for o in outcomes:  # only refinements that were shown as pending may be judged
        if isinstance(o, dict) and o.get("commit") in {r["sha"] for r in pending} and o.get("outcome") in ("good", "bad"):
            harness.record_outcome(o["commit"], o["outcome"], o.get("note"))
            judged.append({"commit": o["commit"], "outcome": o["outcome"]})
    return {"applied": applied, "rejected": rejected, "outcomes": judged}


def _short(edit) -> dict:
    return {k: edit.get(k) for k in ("op", "kind", "name")} if isinstance(edit, dict) else {"edit": repr(edit)[:200]}


def _apply(ws, harness: Harness, edit, planned: dict, shown: set, sid: str, chain: list[str], scope: str) -> dict:
    if not isinstance(edit, dict):
        raise PrimefsError("an edit must be a JSON object")
    op, kind, name = edit.get("op"), edit.get("kind"), edit.get("name")
    if op not in OPS:
        raise PrimefsError(f"unknown op {op!r} (use {', '.join(OPS)})")
    if kind in ("base", "prompt", "system", "agents-md") or str(name).lower() in ("agents.md", "agents-md"):
        raise PrimefsError("the base prompt and AGENTS.md are not harness entries; refine cannot edit them")
    check_kind(kind)
    check_entry_name(name)
    intent = str(edit.get("expected_effect") or "").strip()
    if not intent:
        raise PrimefsError("an edit needs expected_effect (its intent)")
    cited = [n for n in edit.get("evidence") or [] if isinstance(n, int) and n in shown]
    evidence = [f"{sid}#{n}" for n in (cited or sorted(shown)[-3:])]
    now = fingerprint(ws, kind, name, chain)
    before = planned.get((kind, name))
    if now != before:
        raise PrimefsError(f"{kind}/{name} changed since the refinement was planned; not applied")
    if op == "create" and before is not None:
        raise PrimefsError(f"{kind}/{name} exists already: use update")
    if op in ("update", "delete") and before is None:
        raise PrimefsError(f"{kind}/{name} does not exist: nothing to {op}")
    target = {"scope": scope, "session": sid}
    if op != "create":  # edit the entry where it lives
        e = harness.get(kind, name, sessions=chain)
        target = {"scope": e.scope, "session": e.session if e.scope == "session" else sid}
    if op == "delete":
        sha = harness.delete(kind, name, source="refine", evidence=evidence, intent=intent, **target)
    else:
        files = edit.get("files") if kind == "skill" and isinstance(edit.get("files"), dict) else None
        body = edit.get("body")
        if op == "create" and not isinstance(body, str):
            raise PrimefsError("a created entry needs a body")
        sha = harness.put(kind, name, body if isinstance(body, str) else None, description=edit.get("description"),
                          source="refine", evidence=evidence, intent=intent, files=files, **target)
    return {"op": op, "kind": kind, "name": name, "commit": sha, "evidence": evidence, "intent": intent,
            "rationale": edit.get("rationale")}


def reason(exc: Exception) -> str:
    """Why a refinement failed, as one line without the exception's class: ours say what happened."""
    text = " ".join(str(exc).split())
    if isinstance(exc, (PrimefsError, ModelError, BudgetExhausted, SessionStopping)) and text:
        return text
    return f"unexpected error: {text or type(exc).__name__}"  # a bug: still one line, never a traceback


def run_refine(ws: Workspace, agent, chain: list[str], log, instructions: str | None = None,
               scope: str = "global", model: str | None = None) -> dict:
    """One refinement of the harness from `agent`'s session, its model calls accounted to it and the
    outcome recorded in its history. Never raises: a failed refinement must not fail the session."""
    settings = ws.resolve_model(model) if model else None
    try:
        result = refine(ws, agent.session, chain=chain, instructions=instructions, scope=scope,
                        max_events=agent.limits.refine_events,
                        complete=lambda msgs: agent.complete(msgs, purpose="refine", settings=settings))
    except Exception as exc:
        result = {"applied": [], "rejected": [], "error": reason(exc)}
    agent.record("refine", instructions=instructions, scope=scope, **result)
    log(f"{agent.session.id}: refine: {len(result['applied'])} applied, {len(result['rejected'])} rejected"
        + (f", error: {result['error']}" if result.get("error") else ""))
    return result
