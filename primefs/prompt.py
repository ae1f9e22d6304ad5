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
classify a chunk of `context`.
- `done(answer)`: record `answer` as your final result and end the turn after this cell."""


def describe_context(root: Path, paths: list[str]) -> str:
    """Size and type only; the content never goes into a prompt."""
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


def system_prompt(*, root: Path, tool_mode: str, limits: dict, context_paths: list[str]) -> str:
    parts = [BASE.format(how_to_run=HOW_NATIVE if tool_mode == "native" else HOW_FENCED,
                         output_chars=limits["output_chars"], cell_timeout_s=limits["cell_timeout_s"])]
    agents = root / "AGENTS.md"
    if agents.is_file():
        text = agents.read_text(encoding="utf-8", errors="replace").strip()
        if text:
            parts.append(text)
    parts.append(KERNEL_API.format(context_desc=describe_context(root, context_paths)))
    return "\n\n".join(parts)
