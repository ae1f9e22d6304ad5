"""Usage from history: every model call is recorded once, by the session that made it.

`own` sums a session's `model_call` events; `tree` sums own over the session and all its
descendants (found through `parent` in session.yaml), so nothing is counted twice or missed,
whatever state the children ended in. `wall_s` is time spent in turns (summed over a tree).
Sums come from each session's summary (summary.py: kept current with its history, exactly a
recount), found through the index (index.py); no history is read whole.
"""
from __future__ import annotations

from collections import defaultdict
from operator import methodcaller
from pathlib import Path

from primefs.index.db import Entry, Index
from primefs.store import fastjson
from primefs.store import summary as summaries
from primefs.store.session import Session, subtree


def own_usage(session: Session) -> dict:
    return summaries.usage(session.summary())


def total(usages) -> dict:
    """The sum of usage objects (per tool too), rounded as shown. Summed a key at a time, in C (map, sum): a
    root of 50,000 children is one sum, not 50,000 copies of a dict."""
    usages, out = list(usages), {}
    first = list(usages[0]) if usages else []
    for k in first + sorted(set().union(*usages).difference(first)):  # in the order of the first, as shown
        if k != "tools":
            out[k] = sum(map(methodcaller("get", k, 0), usages))
    if "cost_usd" in out:
        out["cost_usd"] = round(out["cost_usd"], 10)
        out["wall_s"] = round(out["wall_s"], 4)
    if any("tools" in u for u in usages):
        tools: dict = {}
        for u in usages:
            for name, per in u.get("tools", {}).items():  # per tool: calls, errors, seconds
                m = tools.get(name)
                if m is None:
                    tools[name] = m = {"calls": 0, "errors": 0, "seconds": 0.0}
                m["calls"] += per["calls"]
                m["errors"] += per["errors"]
                m["seconds"] += per["seconds"]
        for m in tools.values():
            m["seconds"] = round(m["seconds"], 4)
        out["tools"] = tools
    return out


class Forest:
    """Who is whose child, from rows whose first three items are a session's id, parent and `broken`: a broken
    session (its parent unknown, or in a cycle of parents) is no one's child. `parent`: of each sound session;
    `children`: parent -> ids, in the rows' order."""

    def __init__(self, rows):
        self.parent: dict[str, str | None] = {}
        self.broken: dict[str, str] = {}  # id -> why its session.yaml cannot be used (shown, not fatal)
        self.children: dict[str | None, list[str]] = defaultdict(list)
        for r in rows:
            if r[2]:
                self.broken[r[0]] = r[2]
            else:
                self.parent[r[0]] = r[1]
                self.children[r[1]].append(r[0])


class UsageIndex(Forest):
    """Own and tree usage of every session of a workspace, or of one tree (`root`), from the index."""

    def __init__(self, sessions_dir: Path | None = None, root: str | None = None, columns: tuple | None = None,
                 rows: dict | None = None):
        """`columns`: of the rows of every session, only these (Index.rows; `id`, `parent` and `broken` are
        needed here, `usage` for usage). `rows`: these rows (id -> row), the index not asked."""
        if rows is None:
            with Index(Path(sessions_dir).parent) as index:
                rows = index.tree(root) if root else index.sync(columns=columns)
        self.rows = rows
        super().__init__(())
        self.sessions: dict[str, Entry] = {}
        for sid, row in rows.items():  # (as Forest reads its rows: one loop, no tuple made per row)
            if row["broken"]:
                self.broken[sid] = row["broken"]
            else:
                self.parent[sid] = parent = row.get("parent")
                self.children[parent].append(sid)
                self.sessions[sid] = Entry(row)
        self.problems = list(self.broken.values())
        self.own = {sid: row.get("usage") for sid, row in self.rows.items()}  # a broken one's history still counts
        self._tree: dict[str, dict] = {}

    def tree(self, sid: str) -> dict:
        """The usage of `sid` and all its descendants. Each session's sum is made once, from its children's
        (a subtree's sessions in reverse walk order: children before their parents), so asking for every
        session costs one addition per session, not one per session and ancestor."""
        if sid in self.broken:
            return self.own[sid]
        if sid not in self._tree:
            self.sum_up(subtree(self.children, sid))
        return self._tree[sid]

    def sum_up(self, walk: list[str]) -> None:
        """The tree sums of the sessions of a walk (subtree, tree_order: parents before their children), made
        from the end: each from its children's."""
        for node in reversed(walk):
            if node in self._tree or node in self.broken:
                continue
            kids = self.children.get(node)  # (else cut from the walk: a cycle of parents)
            sums = [self._tree[c] for c in kids if c in self._tree] if kids else None
            # a leaf's sum is its own usage (never changed in place)
            self._tree[node] = total([self.own[node], *sums]) if sums else self.own[node]


def tree_texts(index: Forest, walk: list[str], kept: dict, load) -> tuple[dict[str, str], dict[str, str], set]:
    """The tree usage, as JSON text, of each session of `walk` (tree_order, or one tree of it) that has
    children: the text kept in the index (`kept`: id -> text, None if none, "" if the session changed since;
    database.TREES) where it is current, else made from the children's, as sum_up makes it. What changed below a
    session changed it: made again are every changed session with children and their ancestors. `load(ids)`:
    the own usage of these sessions (id -> usage), asked once. Returns every text, those made now, and the
    sessions whose kept text is to be dropped (changed, now without children)."""
    walked = set(walk)
    inner = {n for n, kids in index.children.items() if kids and n in index.parent and n in walked}
    stale: set[str] = set()
    parent = index.parent.get

    changed = [n for n in walk if kept.get(n) == ""]
    for node in changed + [n for n in inner if kept.get(n) is None]:
        up = node if node in inner else parent(node)  # above a session, every one has children
        while up in inner and up not in stale:  # (one already in: so are those above it)
            stale.add(up)
            up = parent(up)
    texts, fresh = {n: kept[n] for n in inner - stale}, {}
    dropped = {n for n in changed if n not in inner}
    if not stale:
        return texts, fresh, dropped
    own = load(sorted(stale.union(*(index.children[n] for n in stale))))
    done: dict[str, dict] = {}  # the sums made now

    def tree(sid: str) -> dict:
        if sid in done:
            return done[sid]
        return fastjson.loads(kept[sid]) if sid in inner and sid not in stale else own[sid]

    for node in reversed(walk):  # children before their parents
        if node in stale:  # (a child not yet made is in a cycle of parents: cut, as sum_up cuts it)
            kids = [c for c in index.children[node] if c in walked and (c in done or c not in stale)]
            done[node] = total([own[node], *map(tree, kids)]) if kids else own[node]
            if kids:
                texts[node] = fresh[node] = fastjson.dumps(done[node])
            else:
                dropped.add(node)
    return texts, fresh, dropped


def tops(index: Forest) -> list[str]:
    """The sessions shown at the top of a tree: broken ones and those whose parent is not known, then roots, in
    creation order each."""
    known = index.parent
    orphans = [sid for sid, parent in known.items() if parent and parent not in known]
    return sorted(orphans + list(index.broken)) + sorted(index.children.get(None, []))


def tree_order(index: Forest) -> list[str]:
    """Roots in creation order, each followed by its descendants (depth first)."""
    return [sid for top in tops(index) for sid in subtree(index.children, top)]
