"""A workspace plugin (copied to <workspace>/plugins/mytools.py by the tests) with tools of both kinds."""
import os
import time

import primefs


def word_count(text: str) -> int:
    """Count the words of a text.

    Words are runs of characters between whitespace."""
    return len(text.split())


def api_lookup(key: str, times: int = 1) -> dict:
    """Look a key up with a credential only the runner has (TEST_TOOL_SECRET).

    Returns {"key", "secret", "times"}."""
    return {"key": key, "secret": os.environ.get("TEST_TOOL_SECRET"), "times": times}


def boom() -> None:
    """Always fails."""
    raise KeyError("no such thing")


def hang() -> None:
    """Never returns in time."""
    time.sleep(30)


def not_json():
    """Returns a set."""
    return {1, 2}


def big() -> str:
    """Half a megabyte of text."""
    return "x" * 500_000


@primefs.hookimpl
def register_tools(register):
    register("mytools:word_count", runs="kernel")
    for fn in (api_lookup, boom, hang, not_json, big):
        register(fn, runs="runner")
    register(word_count, runs="runner", name="bad name")
    register("mytools:nothing_here", runs="kernel", name="ghost")
