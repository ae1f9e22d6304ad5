"""What each page shows, as template contexts: all reading, no writing (actions are in app.py)."""
from __future__ import annotations

import re
import subprocess
from collections import Counter

from primefs.harness.commits import HarnessGit
from primefs.errors import PrimefsError
from primefs.harness.entries import Harness
from primefs.store import approvals
from primefs.store.fsutil import NAME_RE
from primefs.store.gitops import git_env
from primefs.store.mail import new_files
from primefs.store.session import Session
from primefs.store.settings import STATUSES
from primefs.web import charts, evals, listing
from primefs.web.timeline import line_end, tail_events

EVENTS = 200  # timeline events per page
TOP_SERIES = 7  # chart lines; the rest are summed as "others"
DIFF_LINES, DIFF_BYTES = 4000, 400_000
SHA_RE = re.compile(r"^[0-9a-f]{7,40}$")


def valid_sid(sid: str) -> bool:
    return bool(NAME_RE.match(sid or "")) and ".." not in sid


def tree_page(state, page: int, filters: dict) -> dict:
    state.index.refresh(force=True)  # a page shows what is there now; live streams share throttled looks
    parts = tree_parts(state, page, filters)
    models = sorted({str(m.get("model")) for m in state.index.meta.values() if m.get("model")})
    return {**parts, "models": models[:200], "statuses": STATUSES,
            "live_query": listing.query(filters, page=parts["page"])}


def tree_parts(state, page: int, filters: dict) -> dict:
    """The live parts of the tree page: summary line (with the counts) and rows."""
    index = state.index
    with index.lock:
        found = listing.listing(index, filters)
        pages = found["pages"]
        page = min(max(1, page), len(pages))
        ids = pages[page - 1]
        continued = page > 1 and bool(ids) and ids[0] in pages[page - 2]  # a big tree, from the page before
        return {"rows": [index.row(sid) for sid in ids], "runner": index.runner, "total": index.total,
                "problems": sorted(index.problems.items())[:50], "page": page, "pages": len(pages),
                "continued": continued, "counts": found["counts"], "matched": found["matched"],
                "filters": filters, "query": lambda **more: listing.query(filters, **more), "names": index.names}


def session_head(state, sid: str) -> dict:
    index = state.index
    s = Session(state.ws.sessions / sid)
    with index.lock:
        known = sid in index.meta
        kids = sorted(index.children.get(sid, []))[:200] if known else []
        head = {"sid": sid, "name": index.names.get(sid, sid), "meta": index.meta.get(sid, {}),
                "problem": index.problems.get(sid), "row": index.row(sid) if known else None, "names": index.names,
                "children": [{"id": c, "name": index.names.get(c, c), "status": index.meta[c].get("status")}
                             for c in kids]}
    return {**head, "result": s.read_result(), "pending": len(new_files(s.mail)), "approvals": _waiting(s)}


def _waiting(s: Session) -> list[dict]:
    """The session's approval requests that wait, with the code each shows (the forms to answer them)."""
    out = []
    for meta in approvals.listing(s.dir, waiting_only=True):
        try:
            out.append({**meta, "code": approvals.code_of(approvals.read(s.dir, meta["n"])[1])})
        except PrimefsError:
            continue  # changed meanwhile
    return out


def session_page(state, sid: str, before: int | None) -> dict | None:
    """None if there is no such session."""
    if not valid_sid(sid) or not (state.ws.sessions / sid / "session.yaml").is_file():
        return None
    index = state.index
    index.refresh(force=True)
    events, start, end = tail_events(state.ws.sessions / sid / "history.jsonl", EVENTS, before)
    head = session_head(state, sid)
    live = before is None or end == line_end(state.ws.sessions / sid / "history.jsonl")  # it ends the history
    running = head["meta"].get("status") == "running" if live else None
    return {**head, "events": state.renderer.events(events, index.names, running), "start": start, "end": end,
            "live": live}


def _series(index, groups: list[tuple[str, list[str]]], what: str) -> list:
    return [(label, index.series(sids, what)) for label, sids in groups]


def usage_page(state, focus: str | None) -> dict | None:
    index = state.index
    index.refresh(force=True)
    with index.lock:
        return _usage(index, focus)


def _labels(index, sids: list[str]) -> dict[str, str]:
    """What a chart calls each session: its name, and its id too where another shown has that name."""
    count = Counter(index.names[sid] for sid in sids)
    return {sid: index.names[sid] if count[index.names[sid]] == 1 else f"{index.names[sid]} ({sid})" for sid in sids}


def _usage(index, focus: str | None) -> dict | None:
    if focus is not None:
        if focus not in index.meta:
            return None
        members = index.descendants(focus)
        rows = [dict(index.row(sid), size=1) for sid in members[:500]]
        top = sorted(members, key=lambda sid: -index.tracks[sid].usage()["tokens"])
        label = _labels(index, top[:25])
        groups = [(label[sid], [sid]) for sid in top[:TOP_SERIES]]
        share = charts.bars([(label[sid], index.tracks[sid].usage()["tokens"]) for sid in top[:25]])
        more = len(members) - len(rows)
        cost_unknown = index.tree(focus)["cost_unknown_calls"]
    else:
        roots = sorted(index.roots, key=lambda sid: -index.tree(sid)["tokens"])
        rows = [dict(index.row(sid), size=len(index.descendants(sid))) for sid in roots[:200]]
        label = _labels(index, roots[:TOP_SERIES])
        groups = [(label[sid], index.descendants(sid)) for sid in roots[:TOP_SERIES]]
        share, more, cost_unknown = None, max(0, len(roots) - 200), index.total["cost_unknown_calls"]
        top = roots
    rest = [sid for root in top[TOP_SERIES:] for sid in (index.descendants(root) if focus is None else [root])]
    if rest:
        groups.append((f"{len(top) - TOP_SERIES} others", rest))
    return {"focus": index.row(focus) if focus else None, "rows": rows, "total": index.total, "share": share,
            "more": more, "cost_unknown": cost_unknown,
            "tokens_chart": charts.line_chart(_series(index, groups, "tokens"), "tokens over time"),
            "cost_chart": charts.line_chart(_series(index, groups, "cost"), "cost over time", "$")}


def harness_page(state) -> dict:
    h = Harness(state.ws)
    commits = h.log(limit=200)
    state.index.refresh(force=True)
    return {"entries": h.list(all_sessions=True), "commits": commits, "limited": len(commits) == 200,
            "reverted": {c["sha"] for c in commits if c.get("reverted_by")}, "names": state.index.names}


def commit_page(state, sha: str) -> dict | None:
    """A harness commit with its trailers and diff; None if `sha` is not a harness commit."""
    if not SHA_RE.match(sha or ""):
        return None
    try:
        full, subject, trailers = HarnessGit(state.ws.root).harness_commit(sha)
    except Exception:
        return None
    raw = subprocess.run(["git", "-C", str(state.ws.root), "show", "--format=", "--patch", "--no-color", "--no-ext-diff",
                          full], capture_output=True, env=git_env(), timeout=30).stdout
    text = raw[:DIFF_BYTES].decode("utf-8", "replace")
    lines = text.splitlines()
    cut = None
    if len(raw) > DIFF_BYTES or len(lines) > DIFF_LINES:
        lines, cut = lines[:DIFF_LINES], f"{len(raw):,} bytes"
    return {"sha": full, "subject": subject, "trailers": sorted(trailers.items()), "cut": cut,
            "diff": [(_diff_class(ln), ln) for ln in lines]}


def _diff_class(line: str) -> str:
    if line.startswith(("+++", "---", "diff ", "index ", "new file", "deleted file")):
        return "meta"
    if line.startswith("@@"):
        return "hunk"
    return {"+": "add", "-": "del"}.get(line[:1], "ctx")


def evals_page(state) -> dict:
    runs = [evals.describe(*found) for found in evals.find_runs(state.eval_roots)[:200]]
    cost = any(m["cost_usd"] > 0 for r in runs for m in r["modes"])
    key, label, unit = ("cost_usd", "cost (US$)", "$") if cost else ("tokens", "tokens (no run has a known cost)", "")
    points = [(m[key], m["mean_score"], f"{r['name']}" + (f" ({m['mode']})" if m["mode"] else ""))
              for r in runs for m in r["modes"]]
    return {"runs": runs, "roots": [str(p) for p in state.eval_roots], "x_label": label,
            "chart": charts.scatter_chart(points, "mean score against " + label, label, unit)}


def eval_run_page(state, root: int, rel: str) -> dict | None:
    folder = evals.resolve(state.eval_roots, root, rel)
    if folder is None:
        return None
    state.index.refresh(force=True)
    return {"run": evals.describe(root, rel, folder), "names": state.index.names}
