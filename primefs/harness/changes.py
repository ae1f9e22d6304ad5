"""The harness log read back from git: every harness change with its provenance and outcome, and
which changes are reverted, by which commit.

A revert is known by its `Primefs-Reverts` trailer (`primefs harness revert`) or by the line
`This reverts commit <sha>.` that `git revert` writes: the design promises that a plain `git revert`
of a harness commit works, so the log must not go on listing such a change as live. A plain revert
has no trailers; it is listed with the entry of the commit it reverts and no source."""
from __future__ import annotations

import re
from pathlib import Path

from primefs.store.gitops import git

REVERTS_LINE = re.compile(r"^This reverts commit ([0-9a-f]{7,40})\b", re.MULTILINE)
# sha, author date, subject, trailers, outcome note, body: fields never hold \x1f or \x1e
FORMAT = "%H%x1f%aI%x1f%s%x1f%(trailers:only,unfold)%x1f%N%x1f%b%x1e"


def parse_trailers(text: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip():
            out[key.strip()] = value.strip()
    return out


def read_log(root: Path, notes_ref: str) -> list[dict]:
    """Harness commits on HEAD and reverts of them, newest first; each row has `reverts` (the sha it
    undoes, or None) and `reverted_by` (the revert that undoes it now, or None)."""
    # the whole history, always: a revert may lie outside any `-n` window of what it reverts.
    # --topo-order: what a commit reverts (an ancestor) always comes after it in the output.
    out = git(root, "log", "--topo-order", f"--notes={notes_ref}", "--grep=^Primefs-Kind:",
              "--grep=^This reverts commit ", f"--format={FORMAT}").stdout
    records = [rec.strip("\n").split("\x1f") for rec in out.split("\x1e") if rec.strip()]
    rows: dict[str, dict] = {}  # oldest first (insertion order)
    for rec in reversed(records):
        row = _row(*rec, known=rows)
        if row:
            rows[row["sha"]] = row
    latest: dict[str, str] = {}  # sha -> the newest commit that reverts it
    for row in rows.values():
        if row["reverts"] in rows:
            latest[row["reverts"]] = row["sha"]
    newest_first = list(reversed(rows.values()))
    for row in newest_first:  # a revert is newer than what it reverts: its own state is known already
        by = latest.get(row["sha"])
        row["reverted_by"] = by if by and not rows[by]["reverted_by"] else None  # a reverted revert undoes nothing
    return newest_first


def _row(sha, date, subject, trailers, note, body, *, known: dict) -> dict | None:
    t = parse_trailers(trailers)
    found = REVERTS_LINE.search(body)
    target = _full(t.get("Primefs-Reverts") or (found.group(1) if found else None), known)
    if "Primefs-Kind" in t:
        path = t.get("Primefs-Path", "")
        session = t.get("Primefs-Session", "-")
        entry = {"kind": t["Primefs-Kind"], "name": t.get("Primefs-Name"), "path": path or None,
                 "scope": "session" if path.startswith("sessions/") else "global",
                 "session": None if session == "-" else session, "source": t.get("Primefs-Source"),
                 "evidence": [e.strip() for e in t.get("Primefs-Evidence", "").split(",") if e.strip()],
                 "intent": t.get("Primefs-Intent"), "gate": t.get("Primefs-Gate")}
    elif target in known:  # a plain `git revert` of a harness change
        of = known[target]
        entry = {"kind": of["kind"], "name": of["name"], "path": of["path"], "scope": of["scope"],
                 "session": None, "source": None, "evidence": [], "intent": None, "gate": None}
    else:
        return None
    outcome, _, outcome_note = note.strip().partition("\n")
    return {"sha": sha, "date": date, "subject": subject, **entry, "reverts": target,
            "outcome": outcome or None, "outcome_note": outcome_note.strip() or None}


def _full(sha: str | None, known: dict) -> str | None:
    """`git revert` with revert.reference writes an abbreviated sha: the listed commit it names."""
    if not sha or len(sha) == 40:
        return sha
    matches = [k for k in known if k.startswith(sha)]
    return matches[0] if len(matches) == 1 else sha
