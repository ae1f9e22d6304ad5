"""Refine: one model call reads a session's recent events and the harness, and proposes edits.

Edits are validated (kind, name, operation; the base prompt and AGENTS.md are not harness
entries and cannot be edited; an entry changed since planning is rejected), then applied as
harness commits with `Primefs-Source: refine`, the evidence (event ids) and the intent.
"""
from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from itertools import islice
from typing import Callable

from primefs.errors import BudgetExhausted, PrimefsError, SessionStopping
from primefs.harness.entries import Harness, check_entry_name, check_kind
from primefs.providers.base import ModelError
from primefs.store.history import latest_events
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


@dataclass
class Plan:
    """What one refine call proposed, and what it was shown (to validate the edits against)."""
    edits: list
    outcomes: list
    planned: dict  # (kind, name) -> the entry's fingerprint when it was shown
    shown: set  # the event numbers shown
    pending: list  # earlier refinements shown for an outcome
    session: str
    chain: list
    scope: str


def refine(ws: Workspace, session: Session, *, complete: Callable[[list[dict]], object], chain: list[str],
           instructions: str | None = None, scope: str = "global", max_events: int = 60) -> dict:
    """Plan with one model call, validate, apply. Returns {"applied": [...], "rejected": [...]}."""
    p = plan(ws, session, complete=complete, chain=chain, instructions=instructions, scope=scope,
             max_events=max_events)
    applied, rejected = apply_plan(ws, p)
    return {"applied": applied, "rejected": rejected, "outcomes": record_outcomes(ws, p)}


def plan(ws: Workspace, session: Session, *, complete: Callable[[list[dict]], object], chain: list[str],
         instructions: str | None = None, scope: str = "global", max_events: int = 60) -> Plan:
    """One model call proposes edits (nothing is applied)."""
    if scope not in ("global", "session"):
        raise PrimefsError("scope is 'global' or 'session'")
    harness = Harness(ws)
    entries = harness.list(sessions=chain)
    # the last ones, read from the end: a history grows for the session's life
    events = list(islice((e for e in latest_events(session.history.path) if _event_line(e)), max_events))[::-1]
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
    edits, outcomes = parse_reply(reply.text)
    return Plan(edits, outcomes, planned, {e["n"] for e in events}, pending, session.id, chain, scope)


def apply_plan(ws: Workspace, p: Plan, gate: str | None = None) -> tuple[list, list]:
    """Apply the plan's valid edits (each a commit; `gate`: its Primefs-Gate trailer): (applied, rejected)."""
    harness = Harness(ws)
    applied, rejected = [], []
    for edit in p.edits:
        try:
            applied.append(_apply(ws, harness, edit, p, gate))
        except PrimefsError as exc:
            rejected.append({"edit": _short(edit), "reason": str(exc)})
    return applied, rejected


def record_outcomes(ws: Workspace, p: Plan) -> list:
    judged = []
    for o in p.outcomes:  # only refinements that were shown as pending may be judged
        if isinstance(o, dict) and o.get("commit") in {r["sha"] for r in p.pending} \
                and o.get("outcome") in ("good", "bad"):
            Harness(ws).record_outcome(o["commit"], o["outcome"], o.get("note"))
            judged.append({"commit": o["commit"], "outcome": o["outcome"]})
    return judged


def _short(edit) -> dict:
    return {k: edit.get(k) for k in ("op", "kind", "name")} if isinstance(edit, dict) else {"edit": repr(edit)[:200]}


def _apply(ws, harness: Harness, edit, p: Plan, gate: str | None) -> dict:
    sid, chain, scope = p.session, p.chain, p.scope
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
    cited = [n for n in edit.get("evidence") or [] if isinstance(n, int) and n in p.shown]
    evidence = [f"{sid}#{n}" for n in (cited or sorted(p.shown)[-3:])]
    now = fingerprint(ws, kind, name, chain)
    before = p.planned.get((kind, name))
    if now != before:
        raise PrimefsError(f"{kind}/{name} changed since the refinement was planned; not applied")
    if op == "create" and before is not None:
        raise PrimefsError(f"{kind}/{name} exists already: use update")
    if op in ("update", "delete") and before is None:
        raise PrimefsError(f"{kind}/{name} does not exist: nothing to {op}")
    target = {"scope": scope, "session": sid, "gate": gate}
    if op != "create":  # edit the entry where it lives
        e = harness.get(kind, name, sessions=chain)
        target = {"scope": e.scope, "session": e.session if e.scope == "session" else sid, "gate": gate}
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
               scope: str = "global", model: str | None = None, gate: dict | None = None,
               gate_runner: Callable | None = None) -> dict:
    """One refinement of the harness from `agent`'s session, its model calls accounted to it and the
    outcome recorded in its history. Never raises: a failed refinement must not fail the session.
    `gate` (else primefs.yaml's harness.gate): the edits are kept only if `gate_runner` says so."""
    settings = ws.resolve_model(model) if model else None
    gate = gate or (ws.config.get("harness") or {}).get("gate")
    kwargs = dict(chain=chain, instructions=instructions, scope=scope, max_events=agent.limits.refine_events,
                  complete=lambda msgs: agent.complete(msgs, purpose="refine", settings=settings))
    try:
        if gate:
            result = gated(ws, plan(ws, agent.session, **kwargs), gate, gate_runner, log)
        else:
            result = refine(ws, agent.session, **kwargs)
    except Exception as exc:
        result = {"applied": [], "rejected": [], "error": reason(exc)}
    agent.record("refine", instructions=instructions, scope=scope, **result)
    log(f"{agent.session.id}: refine: {len(result['applied'])} applied, {len(result['rejected'])} rejected"
        + (f", error: {result['error']}" if result.get("error") else ""))
    return result


def gated(ws: Workspace, p: Plan, gate: dict, gate_runner: Callable | None, log) -> dict:
    """The plan's edits through the gate: applied with a Primefs-Gate trailer if it keeps them, else
    committed as a rejected proposal (never applied). A gate that cannot run applies nothing."""
    harness, measured, locked = Harness(ws), [], []
    for edit in p.edits:  # a locked entry is refused here, not measured
        try:
            if isinstance(edit, dict):
                harness.check_unlocked(str(edit.get("kind")), str(edit.get("name")), "refine")
            measured.append(edit)
        except PrimefsError as exc:
            locked.append({"edit": _short(edit), "reason": str(exc)})
    p.edits = measured
    out = {"applied": [], "rejected": locked, "outcomes": record_outcomes(ws, p)}
    if not p.edits:
        return out
    try:
        if gate_runner is None:
            raise PrimefsError("no gate can run here (a gate runs in `primefs run` and `primefs refine`)")
        verdict = gate_runner(ws, p, gate, log)
    except Exception as exc:  # the gate could not run: the edits are not applied
        out["error"] = f"gate {gate.get('benchmark')} could not run, so nothing was applied: {reason(exc)}"
        out["proposal"] = propose(ws, p, f"not run; {gate.get('benchmark')}: {reason(exc)}")
        return out
    from_gate = gate_trailer(verdict)
    out["gate"] = verdict
    if verdict["kept"]:
        applied, rejected = apply_plan(ws, p, gate=from_gate)
        out["applied"], out["rejected"] = applied, out["rejected"] + rejected
    else:
        out["proposal"] = propose(ws, p, from_gate)
    return out


def gate_trailer(v: dict) -> str:
    """The Primefs-Gate trailer: verdict, benchmark, items, both scores, the difference, the runs."""
    ci = f" (95% CI {v['diff_ci95'][0]:+.3f} to {v['diff_ci95'][1]:+.3f})" if v.get("diff_ci95") else ""
    failed = f"; newly failed: {', '.join(v['newly_failed'])}" if v.get("newly_failed") else ""
    return (f"{'kept' if v['kept'] else 'rejected'}; {v['benchmark']} n={v['n']} seed={v['seed']} model={v['model']}; "
            f"before {v['before']:.3f}, after {v['after']:.3f}, diff {v['diff']:+.3f}{ci}{failed}; "
            f"runs {' '.join(v['runs'])}")


def propose(ws: Workspace, p: Plan, gate: str) -> str | None:
    """A refinement the gate did not keep, as a file harness/proposals/<id>.json and its commit (with the
    Primefs-Gate trailer): in `harness log`, revertible, never applied to any entry."""
    from primefs.harness.commits import HarnessGit, provenance
    from primefs.store.fsutil import write_atomic
    from primefs.store.gitops import commit_lock

    name = f"{p.session}-{hashlib.sha1(json.dumps(p.edits, sort_keys=True, default=str).encode()).hexdigest()[:8]}"
    rel = f"harness/proposals/{name}.json"
    intent = "; ".join(str(e.get("expected_effect") or "") for e in p.edits if isinstance(e, dict)) or "(none)"
    evidence = [f"{p.session}#{n}" for n in sorted(p.shown)[-3:]]
    trailers = provenance(p.session, "proposal", name, rel, "refine", evidence, intent, gate)
    with commit_lock(ws.root):
        (ws.root / rel).parent.mkdir(parents=True, exist_ok=True)
        write_atomic(ws.root / rel, json.dumps({"session": p.session, "gate": gate, "edits": p.edits}, indent=2,
                                               default=str) + "\n")
        return HarnessGit(ws.root).commit([rel], f"harness(proposal/{name}): not applied - {gate.split(';')[0]}",
                                          trailers)
