"""The system prompt: a fixed base, AGENTS.md, the kernel API, and the size and type of `context`."""
from __future__ import annotations

from pathlib import Path

BASE = """You are an agent of primefs. You work by running Python code in your own persistent IPython \
kernel: variables, imports and files you create persist between cells. The working directory is \
the workspace root.
{how_to_run}
Large inputs are in the variable `context`: examine, slice and search it with code instead of \
printing it whole. Cell output is cut to {output_chars} characters (head and tail kept); a cell \
running over {cell_timeout_s} s is interrupted.
When you have the final answer, reply with it in plain text and no code: that reply becomes your \
result and ends your turn. Or call `done(answer)` in a cell."""

HOW_NATIVE = "Run code by calling the `python` tool with the argument `code`; you will see its output."
HOW_FENCED = ("Run code by writing it in a fenced block that starts with ```python and ends with ```; "
              "you will see its output in the next message. Write at most one block per reply.")

KERNEL_API = """## Kernel API (already defined in your kernel)
- `context`: your input data ({context_desc}).
- `llm(prompt, model=None) -> str`: one plain model call (no tools, no kernel), e.g. to read or \
classify a chunk of `context`. `llm_batch(prompts, model=None) -> list[str]`: many, in parallel.
- `rlm(task, name=None, model=None, context=None, agent=None, budget=None) -> Handle`: start a child agent with its \
own kernel on a sub-task; `context` (str or JSON data) becomes its `context`; `budget` ({{"tokens": N, "cost_usd": X}}) \
caps the child and reserves that much of yours. Returns at once. `h.wait(timeout=None)` \
returns its answer (raises `ChildFailed` if it failed); `wait_all(handles)`; `h.status`, `h.result`, \
`h.send(text)` (a finished child takes a new turn). Split big inputs into chunks and fan out.
- `send(to, text)`: mail "parent", "children", "all", a child's name or a session id. `inbox()` returns \
unread messages; `recv(timeout=None)` waits for one. Mail that arrives while you work is shown to you.
- `done(answer)`: record `answer` as your final result and end the turn after this cell. \
`goal_status()`: your goal, budgets used and left, end-condition results. \
`heartbeat(every="10m", prompt=...)`: be woken on a schedule.
- `harness.put(kind, name, body, scope="global", description=None)`, `harness.get/list/delete`: keep \
notes, memories, skills and subagent specs (kind: note, memory, skill, agent) for later turns and \
sessions. `from skills import <name>` imports a skill's Python; `rlm(task, agent="<spec>")` starts a \
child in that role. `refine(instructions=None)`: improve the harness from this session, at turn end.
- `history.events(type=None, last=None)`, `history.search(pattern)`: your full history, also what was \
compacted into a summary; `history.search("words", scope="workspace")`: what every session (archived too) \
did, found by full-text search (scope="tree": your tree's)."""
from primefs.store.settings import Limits


def describe_context(root: Path, paths: list[str], data: str | None = None) -> str:
    """Size and type only; the content never goes into a prompt."""
    if data:  # a parent's value: text, or JSON data
        p = root / data
        n = p.stat().st_size if p.exists() else 0
        if p.suffix == ".json":
            import json

            value = json.loads(p.read_text(encoding="utf-8")) if n else None
            kind = type(value).__name__
            size = f" of {len(value):,} items" if isinstance(value, (list, dict)) else ""
            return f"{kind}{size} ({n:,} characters as JSON), passed by your parent"
        return f"str of about {n:,} characters (~{n // 4:,} tokens), passed by your parent"
    if not paths:
        return "None: this task has no input data"
    sizes = []
    for p in paths:
        try:
            sizes.append((p, (root / p).stat().st_size))
        except OSError:
            sizes.append((p, 0))
    if len(sizes) == 1:
        p, n = sizes[0]
        return f"str of about {n:,} characters (~{n // 4:,} tokens), read from {p}"
    total = sum(n for _, n in sizes)
    listing = ", ".join(f"{p!r}: {n:,} chars" for p, n in sizes[:20])
    more = f", and {len(sizes) - 20} more" if len(sizes) > 20 else ""
    return (f"dict of {len(sizes)} files (path -> str), {total:,} characters in all (~{total // 4:,} tokens): "
            f"{listing}{more}")


def system_prompt(*, root: Path, tool_mode: str, limits: Limits, context_paths: list[str],
                  context_data: str | None = None, role: str | None = None, harness: str = "", tools: str = "") -> str:
    """base, AGENTS.md, the harness (notes, memories, skills, subagents), the role, the kernel API, tools."""
    parts = [BASE.format(how_to_run=HOW_NATIVE if tool_mode == "native" else HOW_FENCED,
                         output_chars=limits.output_chars, cell_timeout_s=limits.cell_timeout_s)]
    agents = root / "AGENTS.md"
    if agents.is_file():
        text = agents.read_text(encoding="utf-8", errors="replace").strip()
        if text:
            parts.append(text)
    if harness.strip():
        parts.append(harness.strip())
    if role:
        parts.append(f"## Your role\n{role.strip()}")
    parts.append(KERNEL_API.format(context_desc=describe_context(root, context_paths, context_data)))
    if tools:
        parts.append(tools)
    return "\n\n".join(parts)
