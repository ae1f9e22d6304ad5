"""Runs inside kernels: what IPython keeps of each cell, for the last KEPT cells only.

IPython keeps every cell for the kernel's life: its source in `In`, in `_iN` and in a cache for a history
database primefs turns off; its lines for tracebacks; and (IPython 9) all it printed. A session's kernel
lives for days: 300 cells that each printed 100 KB held 30 MB. Older cells are forgotten after each cell.
IPython bounds `Out` itself (its displayhook's cache_size).
"""
from __future__ import annotations

import linecache
import re
from collections import deque

KEPT = 1000
# A cell that may have made a function or class keeps its lines (a traceback through the function shows
# them), for the last DEFINING_KEPT such cells
DEFINES = re.compile(r"\b(def|class|lambda)\b")
DEFINING_KEPT = 10_000


def keep_recent(shell) -> None:
    """From now on, after each cell: forget all but the last KEPT cells (In[n] becomes '')."""
    history = shell.history_manager
    names = getattr(shell.compile, "_filename_map", {})  # a cell's name in tracebacks -> its number
    ran: deque = deque()  # (number, name) of the cells kept
    defining: deque = deque()  # (number, name) of older cells whose lines are kept

    def drop_lines(number: int, name: str | None) -> None:
        if name is not None and names.get(name) == number:  # (not the name of a later cell with the same code)
            names.pop(name)
            linecache.cache.pop(name, None)

    def forget(number: int, name: str | None) -> None:
        for inputs in (history.input_hist_parsed, history.input_hist_raw):
            if number < len(inputs):
                inputs[number] = ""
        for ns in (shell.user_ns, shell.user_ns_hidden):
            ns.pop(f"_i{number}", None)
        for kept in (history.output_hist_reprs, getattr(history, "outputs", {}), getattr(history, "exceptions", {})):
            kept.pop(number, None)
        lines = linecache.cache.get(name) if name is not None else None
        if lines and DEFINES.search("".join(lines[2])):
            defining.append((number, name))
            while len(defining) > DEFINING_KEPT:
                drop_lines(*defining.popleft())
        else:
            drop_lines(number, name)

    def after(result) -> None:
        if not history.enabled:  # nothing will write them to a database
            history.db_input_cache.clear()
            history.db_output_cache.clear()
        number = result.execution_count
        if not result.info.store_history or number is None:
            return
        name = next(reversed(names), None) if names else None
        if name is None or names[name] != number:  # the same code ran before: its name was not added last
            name = next((k for k, v in names.items() if v == number), None)
        ran.append((number, name))
        while ran and ran[0][0] <= number - KEPT:
            forget(*ran.popleft())

    shell.events.register("post_run_cell", after)
