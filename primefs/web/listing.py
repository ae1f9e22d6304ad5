"""The sessions page's list: filters (status, name, model, time), counts by status, and pages.

Filters mean what `primefs logs` means by them: `status` one of the statuses, `name` a glob
(`root.*`; text without `*?[` matches anywhere in the name or id), `model` a model or a glob
(`openai/*`), `since` / `until` a date or `30m`, `2h`, `7d` ago, matched against the session's
last event (its creation if it has none). Unfiltered, the list is the trees, newest first, and a
page holds whole trees (so it starts at a root); a tree bigger than a page goes on over pages of its
own, each starting with its root again. Filtered, it is the matching sessions in that order. The
counts by status are those of the sessions the other filters let through. All of it comes from the
server's index (no file is read), once per change of the workspace.
"""
from __future__ import annotations

import re
from datetime import datetime
from fnmatch import fnmatchcase
from urllib.parse import urlencode

from primefs.errors import PrimefsError
from primefs.store.settings import STATUSES
from primefs.views.when import parse_when

PER_PAGE = 200
FILTERS = ("status", "name", "model", "since", "until")
GLOB = re.compile(r"[*?\[]")


def filters_of(params) -> dict:
    """The filters in a query string, checked: PrimefsError says what is wrong with one."""
    found = {k: str(params.get(k) or "").strip() for k in FILTERS}
    found = {k: v for k, v in found.items() if v}
    if found.get("status", STATUSES[0]) not in STATUSES:
        raise PrimefsError(f"status: {found['status'][:40]!r} is not one of {', '.join(STATUSES)}")
    for key in ("since", "until"):
        if key in found:
            parse_when(found[key], key)
    return found


def query(filters: dict, **more) -> str:
    """The query string of these filters, with `more` changed (a value None drops its key)."""
    return urlencode({k: v for k, v in {**filters, **more}.items() if v is not None})


def listing(index, filters: dict) -> dict:
    """{"pages": [[sid, ...], ...], "counts": {status: n}, "matched": n}; the index's lock held."""
    return index.cached(("listing", tuple(sorted(filters.items()))), lambda: _listing(index, filters))


def _listing(index, filters: dict) -> dict:
    test = _matcher(index, {k: v for k, v in filters.items() if k != "status"})
    counts = dict.fromkeys(STATUSES, 0)
    matched = []
    for sid in index.order:
        if test(sid):
            status = index.meta[sid].get("status") or "pending"
            counts[status] = counts.get(status, 0) + 1
            if filters.get("status", status) == status:
                matched.append(sid)
    if filters:
        pages = [matched[i:i + PER_PAGE] for i in range(0, len(matched), PER_PAGE)]
    else:
        pages = _tree_pages(index)
    return {"pages": pages or [[]], "counts": counts, "matched": len(matched)}


def _tree_pages(index) -> list[list[str]]:
    pages, page = [], []
    for root in index.roots:
        members = index.descendants(root)
        if page and len(page) + len(members) > PER_PAGE:
            pages.append(page)
            page = []
        if len(members) <= PER_PAGE:
            page += members
            continue
        for i in range(1, len(members), PER_PAGE - 1):  # each of its pages starts at its root again
            pages.append([root] + members[i:i + PER_PAGE - 1])
    return pages + [page] if page else pages


def _matcher(index, filters: dict):
    name, model = filters.get("name"), filters.get("model")
    since, until = parse_when(filters.get("since"), "since"), parse_when(filters.get("until"), "until")
    anywhere = name is not None and not GLOB.search(name)

    def test(sid: str) -> bool:
        if name is not None:
            own = index.names[sid]
            if not (fnmatchcase(own, name) or fnmatchcase(sid, name)
                    or (anywhere and (name.lower() in own.lower() or name in sid))):
                return False
        if model is not None:
            used = str(index.meta[sid].get("model") or "")
            if used != model and not fnmatchcase(used, model):
                return False
        if since is not None or until is not None:
            ts = (index.tracks[sid].last or {}).get("ts") or _created(index.meta[sid])
            if (since is not None and ts < since) or (until is not None and ts >= until):
                return False
        return True
    return test


def _created(meta: dict) -> float:
    """When a session without events was made (session.yaml's `created`), 0 if it does not say."""
    try:
        return datetime.fromisoformat(str(meta.get("created"))).timestamp()
    except ValueError:
        return 0.0
