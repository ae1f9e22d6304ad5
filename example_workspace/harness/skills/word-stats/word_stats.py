"""Word statistics of a text, for a first look at a large `context`."""
from collections import Counter


def stats(text: str, top: int = 10) -> dict:
    words = text.lower().split()
    return {"lines": text.count("\n") + 1, "words": len(words), "top": Counter(words).most_common(top)}
