"""The one place consoles are made: `out()` for what a command prints (stdout), `err()` for its notes,
progress and errors (stderr). rich is imported when one is made, so a command that prints nothing
with it (e.g. with `--json`) does not pay for it."""
from __future__ import annotations


def out(**options):
    from rich.console import Console

    return Console(highlight=False, **options)


def err(**options):
    from rich.console import Console

    return Console(stderr=True, highlight=False, **options)
