"""The one place consoles are made: `out()` for what a command prints (stdout), `err()` for its notes,
progress and errors (stderr). rich is imported when one is made, so a command that prints nothing
with it (e.g. with `--json`) does not pay for it.

What primefs prints holds text that sessions wrote (replies, kernel output, results), and that is
untrusted: a control character in it, ESC above all, could retitle or clear the person's terminal,
write to their clipboard (OSC 52) or hide text. At a terminal such characters are shown as their
Unicode symbols (ESC as ␛), never sent; piped output is left as the files have it.
"""
from __future__ import annotations

import functools
import os
import sys

# C0 controls but tab and newline, and DEL -> the symbols Unicode has for them: one character for one, so
# rich's styles stay on the characters they were on
SHOWN = {c: 0x2400 + c for c in range(32) if c not in (9, 10)} | {127: 0x2421}
ONE_LINE = SHOWN | {10: 0x2424}  # a log line: a newline in what it says would forge another line


def shown(text: str) -> str:
    """`text` safe for a terminal (see above)."""
    return text.translate(SHOWN)


def echo(text: str, **options) -> None:
    """click.echo of text sessions may have written: shown() at a terminal, as it is when piped."""
    import click

    terminal = sys.stdout.isatty() or os.environ.get("FORCE_COLOR")  # (as rich decides: colours shown later)
    click.echo(shown(text) if terminal else text, **options)


@functools.cache
def _console_class():
    from rich.console import Console
    from rich.segment import Segment

    class SafeConsole(Console):
        def _render_buffer(self, buffer):
            if not self.is_terminal:
                return super()._render_buffer(buffer)
            # rich's own escapes (styles, cursor moves) are in its styles and control segments, not in text
            return super()._render_buffer(s if s.control else Segment(s.text.translate(SHOWN), s.style, s.control)
                                          for s in buffer)

    return SafeConsole


def out(**options):
    return _console_class()(highlight=False, **options)


def err(**options):
    return _console_class()(stderr=True, highlight=False, **options)
