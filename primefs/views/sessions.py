"""The session tree as a table that reads at 80 columns (`primefs status`, `primefs agents`).

Trees with a session at work come first. Finished descendants are folded into one line with a count
(a session that failed stays visible), and so are finished trees beyond the newest few (`status`:
FINISHED_TREES; a workspace that grows for months keeps one line for all its old trees). Numbers
are never cut; names and the last column are shortened with an ellipsis; the id column appears when
the terminal is wide enough for it.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

ACTIVE = ("running", "pending")
COLORS = {"running": "green", "idle": "cyan", "done": "blue", "failed": "red", "stopped": "yellow",
          "pending": "magenta", "broken": "red"}
ID_WIDTH = 20
FINISHED_TREES = 20  # `status` without --all: the newest finished trees shown, older ones folded


@dataclass
class Row:
    id: str
    name: str
    parent: str | None
    status: str               # pending, running, idle, done, failed, stopped, broken
    label: str = ""           # the status as shown, e.g. "idle (max_steps)", "running (wait)"
    turns: int | None = None
    tokens: int = 0
    cost: float = 0.0
    detail: str = ""          # the last column: result, error, goal, or the last event
    age: str = ""
    node: str | None = None
    busy: bool = False        # at work now (running, queued, waiting for children)
    depth: int = 0
    children: list = field(default_factory=list)
    counts: Counter | None = None  # a tree not read whole (folded unseen): the statuses of all its sessions


@dataclass
class Folded:
    depth: int
    counts: Counter
    trees: int = 0  # > 0: that many whole trees (old finished ones), not children


def arrange(rows: list[Row], fold: bool = True, root: str | None = None, trees: int | None = None) -> list:
    """Rows (and Folded lines) in display order: trees with work first, then the others in creation
    order; each root followed by its descendants, depth first. `root`: that session's tree only,
    unfolded. `trees` (with `fold`): finished trees beyond the newest `trees` become one line."""
    by_id = {r.id: r for r in rows}
    for r in rows:
        r.children = []
    tops = []
    for r in rows:  # ids sort by creation time
        parent = by_id.get(r.parent) if r.parent else None
        (parent.children if parent else tops).append(r)
    if root is not None:
        tops, fold = ([by_id[root]] if root in by_id else []), False

    def busy(r: Row) -> bool:
        return r.busy or r.status in ACTIVE or any(busy(c) for c in r.children)

    def keep(r: Row) -> bool:  # shown despite folding: at work, failed, or on the way to one that is
        return busy(r) or r.status in ("failed", "broken") or any(keep(c) for c in r.children)

    out: list = []

    def walk(r: Row, depth: int) -> None:
        r.depth = depth
        out.append(r)
        hidden = Counter()
        for c in r.children:
            if fold and not keep(c):
                hidden.update(_statuses(c))
            else:
                walk(c, depth + 1)
        if hidden:
            out.append(Folded(depth + 1, hidden))

    tops = sorted(tops, key=lambda t: not busy(t))  # stable: creation order within each group
    old: list[Row] = []
    if fold and trees is not None:
        finished = [t for t in tops if not keep(t)]  # oldest first
        old = finished[:max(0, len(finished) - trees)]
    folded = {id(t) for t in old}
    for top in tops:
        if old and not busy(top):  # where the old trees were: first of those without work
            counts = Counter()
            for t in old:
                counts.update(_statuses(t))
            out.append(Folded(0, counts, trees=len(old)))
            old = []
        if id(top) not in folded:
            walk(top, 0)
    return out


def unread_trees(statuses: list[tuple[str, Counter]], trees: int) -> set[str]:
    """Of the trees (top, the statuses of its sessions) in display order, those that `arrange(fold=True,
    trees=trees)` folds into its "+N older trees" line: no session at work, failed or broken, and older than
    the newest `trees` such trees. Their sessions need not be read (a Row with `counts` stands for each)."""
    shown = set(ACTIVE) | {"failed", "broken"}
    finished = [top for top, counts in statuses if not shown & set(counts)]
    return set(finished[:max(0, len(finished) - trees)])


def _statuses(r: Row) -> Counter:
    if r.counts is not None:
        return Counter(r.counts)
    c = Counter([r.status])
    for child in r.children:
        c.update(_statuses(child))
    return c


def table(items: list, width: int, last: str = "result", with_age: bool = False, tree_totals: bool = True,
          widths: dict | None = None):
    """The rows as a rich Table fitted to `width` columns. `widths`: the number columns' widths so far
    (a live view passes the same dict each frame: columns grow, never jump back and forth)."""
    from rich.table import Table
    from rich.text import Text

    rows = [r for r in items if isinstance(r, Row)]
    show_node = any(r.node for r in rows)
    show_id = width >= 110
    narrow = width < 100  # 80 columns: names and statuses give way to the last column
    t = Table(box=None, header_style="bold", pad_edge=False, expand=False, width=width,
              collapse_padding=True)  # one space between columns, not two
    if show_id:
        t.add_column("session", no_wrap=True, min_width=ID_WIDTH)
    name_width = 16 if narrow else 28
    t.add_column("name", no_wrap=True, overflow="ellipsis", max_width=name_width, min_width=6)
    t.add_column("status", no_wrap=True, overflow="ellipsis", max_width=15 if narrow else 24)
    if show_node:
        t.add_column("node", no_wrap=True, overflow="ellipsis", max_width=12 if narrow else 16)
    numbers = [("turns", lambda r: "?" if r.turns is None else str(r.turns)),
               ("tokens", lambda r: f"{r.tokens:,}"), ("cost $", lambda r: f"{r.cost:.4f}")]
    widths = {} if widths is None else widths
    for title, fmt in numbers:  # never cut: as wide as their widest value
        widths[title] = max([widths.get(title, 0), len(title)] + [len(fmt(r)) for r in rows])
        t.add_column(title, justify="right", no_wrap=True, min_width=widths[title])
    t.add_column(last, no_wrap=True, overflow="ellipsis", ratio=1, min_width=14 if with_age else 8)
    if with_age:
        t.add_column("age", justify="right", no_wrap=True, min_width=5)
    for item in items:
        indent = "  " * item.depth
        if isinstance(item, Folded):  # "+12 more" in the name column, what they are in the last one
            n = sum(item.counts.values())
            what = f"+{item.trees} older tree{'s' if item.trees > 1 else ''}" if item.trees else f"+{n} more"
            cells = ([""] if show_id else []) + [Text(f"{indent}{what}", style="dim"), ""]
            cells += [""] * (show_node + len(numbers))
            cells.append(Text(", ".join(f"{c} {s}" for s, c in item.counts.most_common()), style="dim"))
            t.add_row(*cells)
            continue
        r = item
        cells = [Text(indent + r.id)] if show_id else []
        shown = indent if not show_id else ""
        cells += [Text(shown + cut_middle(r.name or r.id, name_width - len(shown))),
                  Text(r.label or r.status, style=COLORS.get(r.status, ""))]
        if show_node:
            cells.append(Text(r.node or "local"))
        cells += [fmt(r) for _, fmt in numbers]
        cells.append(Text(" ".join((r.detail or "").split())))
        if with_age:
            cells.append(r.age)
        t.add_row(*cells)
    return t


def cut_middle(name: str, width: int) -> str:
    """A name cut to `width` in its middle: names that begin alike (goals named by the second they came,
    `fan.1` ... `fan.12`) differ at their end, which an ellipsis at the end would hide."""
    width = max(4, width)
    if len(name) <= width:
        return name
    head = (width - 1) // 3
    return name[:head] + "…" + name[len(name) - (width - 1 - head):]


def window(items: list, height: int, offset: int) -> tuple[list, int, int]:
    """The items that fit `height` lines from `offset` (kept in range), and how many are above and below."""
    height = max(1, height)
    offset = max(0, min(offset, max(0, len(items) - height)))
    return items[offset:offset + height], offset, max(0, len(items) - offset - height)
