"""primefs-needle: a RULER S-NIAH / MK-NIAH style needle-in-a-haystack benchmark for `primefs eval`.

Each item's ``context`` is a long filler text (``tokens`` tokens at ~4 characters a token, made
offline and deterministically from a built-in word list) with needles of the exact form

    The special magic number for <key> is: <7-digit number>.

hidden at random depths, plus near-miss distractors: a misspelled key, a longer key that starts
with the asked key, an "almost magic number" and an "ordinary number" for an asked key, and the
needles of keys that are not asked. The task names the asked keys; the answer is one
``key: number`` line per key; the score is the fraction of asked keys answered exactly.
"""
from __future__ import annotations

import random
import re
from typing import Iterator

from primefs import hookimpl

CHARS_PER_TOKEN = 4

NEEDLE = "The special magic number for {key} is: {number}."
NEEDLE_RE = re.compile(r"The special magic number for ([a-z][a-z-]*) is: (\d{7})\.")
KEYS_RE = re.compile(r"^Keys: (.+)$", re.MULTILINE)

_ADJECTIVES = (
    "amber azure bitter brave calm clever cobalt crimson curious dusty eager faded fierce gentle "
    "golden hollow humble icy jolly lively lonely lucky mellow misty noble olive patient polished "
    "proud quiet rapid rusty scarlet shy silent silver sleepy smoky solemn steady sturdy swift "
    "tender tidy velvet vivid wandering wary windy witty"
).split()
_NOUNS = (
    "anchor badger beacon canyon cedar comet compass falcon ferry glacier harbor hazel heron "
    "island juniper kettle lantern lighthouse maple meadow mirror orchard otter pebble pepper "
    "quarry raven river saddle sparrow spruce summit thistle thunder timber tower tulip valley "
    "violin walnut willow window zephyr"
).split()
_SUFFIXES = ("north", "south", "west", "east", "old", "new", "two", "minor", "annex")

_FILLER_WORDS = (
    "the a an this that every some many few of in on at by for with from over under about after "
    "before between during while because although and but or so yet people children farmers "
    "travelers students workers neighbors visitors teachers painters sailors merchants builders "
    "house garden road bridge market school library kitchen field forest hill lake town village "
    "city street morning evening afternoon winter summer spring autumn weather rain wind snow "
    "sunlight shadow letter story song picture book table chair door basket bread soup tea coffee "
    "apple bicycle train boat cart wagon lamp candle clock bell rope ladder fence gate path stone "
    "walked talked waited watched listened carried opened closed painted built cleaned cooked "
    "wrote read sang remembered noticed gathered repaired visited planted followed crossed "
    "slowly quickly quietly carefully happily often rarely always sometimes usually again still "
    "old new small large bright dark warm cold busy empty long short early late simple "
    "ordinary familiar distant nearby wooden narrow wide green blue yellow brown white gray"
).split()
_NUMBER_SENTENCES = (
    "The ledger listed record {n} under the heading of {w}.",
    "Someone had written {n} on the back of the {w} receipt.",
    "The parcel marked {n} waited near the {w} for days.",
    "Ticket {n} was called twice before anyone from the {w} answered.",
)


def _filler_pool(rng: random.Random, size: int = 1500) -> list[str]:
    """Filler sentences, each already followed by its separator (a space, sometimes a paragraph break)."""
    words = _FILLER_WORDS
    pool = []
    for _ in range(size):
        if rng.random() < 0.04:
            s = rng.choice(_NUMBER_SENTENCES).format(n=rng.randrange(1_000_000, 10_000_000), w=rng.choice(words))
        else:
            s = " ".join(rng.choices(words, k=rng.randint(6, 16)))
            s = s[0].upper() + s[1:] + "."
        pool.append(s + ("\n\n" if rng.random() < 0.12 else " "))
    return pool


def _typo(rng: random.Random, key: str) -> str:
    """A misspelling of key (swap, drop or double a letter), still letters and hyphens."""
    letters = [i for i, c in enumerate(key) if c.isalpha()]
    while True:
        i = rng.choice(letters[1:])
        kind = rng.randrange(3)
        if kind == 0 and i + 1 < len(key) and key[i + 1].isalpha():
            out = key[:i] + key[i + 1] + key[i] + key[i + 2:]
        elif kind == 1:
            out = key[:i] + key[i + 1:]
        else:
            out = key[:i] + key[i] + key[i:]
        if out != key and "--" not in out and not out.endswith("-"):
            return out


def _key_mention(key: str) -> re.Pattern:
    # The key as a whole word: not inside a longer key such as "<key>-north" or "x<key>".
    return re.compile(r"(?<![A-Za-z0-9_-])" + re.escape(key) + r"(?![A-Za-z0-9_]|-[A-Za-z])", re.IGNORECASE)


_NUMBER_AFTER = re.compile(r"[^\n\d]{0,80}?(\d{1,3}(?:[, ]\d{3})+(?!\d)|\d+)")
_SEVEN_DIGITS = re.compile(r"(?<!\d)(\d{1,3}(?:,\d{3}){2}|\d{7})(?!\d)")


def parse_answer(text: str, keys) -> dict[str, str]:
    """key -> the number the answer gives for it (the last `key ... number` pair on one line wins)."""
    text = str(text or "")
    found: dict[str, str] = {}
    for key in keys:
        for m in _key_mention(key).finditer(text):
            n = _NUMBER_AFTER.match(text, m.end())
            if n:
                found[key] = re.sub(r"[, ]", "", n.group(1))
    if len(keys) == 1 and not found:
        # A single asked key: a bare number is enough.
        numbers = {re.sub(",", "", m.group(1)) for m in _SEVEN_DIGITS.finditer(text)}
        if len(numbers) == 1:
            found[keys[0]] = numbers.pop()
    return found


class NeedleBenchmark:
    """Needle in a haystack at a chosen size.

    tokens:       haystack length in tokens (~4 characters each); RULER sizes are 2**13 .. 2**20.
    keys:         how many keys the task asks for (1 = single needle, S-NIAH).
    extra_keys:   needles of other keys that are present but not asked (multi-key distractors).
    distractors:  near-miss sentences about the asked keys (typo key, longer key, "almost magic",
                  "ordinary number"), the kinds taken in turn; default max(4, 2 * keys).
    """

    def __init__(self, tokens: int = 2**13, keys: int = 1, extra_keys: int = 2,
                 distractors: int | None = None, name: str = "needle"):
        if tokens < 64:
            raise ValueError("tokens must be at least 64")
        if keys < 1 or extra_keys < 0:
            raise ValueError("keys must be >= 1 and extra_keys >= 0")
        self.tokens = int(tokens)
        self.keys = int(keys)
        self.extra_keys = int(extra_keys)
        self.distractors = max(4, 2 * self.keys) if distractors is None else int(distractors)
        self.name = name
        self.description = (
            f"Needle in a haystack (RULER NIAH style): find the 7-digit special magic numbers of "
            f"{self.keys} key(s) in ~{self.tokens} tokens of filler with near-miss distractors. "
            f"Score: fraction of keys answered exactly."
        )

    # -- items ------------------------------------------------------------------------------------
    def items(self, n: int = 10, seed: int = 0, *, tokens: int | None = None, chars: int | None = None,
              keys: int | None = None) -> Iterator[dict]:
        """Items of this benchmark, or of a variant: `tokens` or `chars` (haystack size; `chars`
        wins, e.g. chars=10_000_000), `keys` (asked keys, with this benchmark's other settings)."""
        bench = self
        if keys is not None and int(keys) != self.keys:
            bench = NeedleBenchmark(tokens=self.tokens, keys=int(keys), extra_keys=self.extra_keys, name=self.name)
        if chars is not None:
            tokens = max(64, int(chars) // CHARS_PER_TOKEN)
        for i in range(n):
            yield bench.make_item(seed, i, tokens=tokens)

    def make_item(self, seed: int, i: int, *, tokens: int | None = None) -> dict:
        tokens = self.tokens if tokens is None else int(tokens)
        rng = random.Random(f"{self.name}|{tokens}|{self.keys}|{self.extra_keys}|{self.distractors}|{seed}|{i}")

        all_keys: list[str] = []
        while len(all_keys) < self.keys + self.extra_keys:
            key = f"{rng.choice(_ADJECTIVES)}-{rng.choice(_NOUNS)}"
            if key not in all_keys:
                all_keys.append(key)
        asked = all_keys[: self.keys]
        numbers = rng.sample(range(1_000_000, 10_000_000), len(all_keys) + self.distractors)
        truth = {k: str(numbers[j]) for j, k in enumerate(all_keys)}

        inserts = [NEEDLE.format(key=k, number=truth[k]) for k in all_keys]
        used = set(all_keys)
        first_kind = rng.randrange(4)
        for j in range(self.distractors):
            key, number = rng.choice(asked), numbers[len(all_keys) + j]
            kind = (first_kind + j) % 4
            if kind == 0:
                other = _typo(rng, key)
                while other in used:
                    other = _typo(rng, key)
                used.add(other)
                inserts.append(NEEDLE.format(key=other, number=number))
            elif kind == 1:
                other = f"{key}-{rng.choice(_SUFFIXES)}"
                while other in used:
                    other = f"{key}-{rng.choice(_SUFFIXES)}"
                used.add(other)
                inserts.append(NEEDLE.format(key=other, number=number))
            elif kind == 2:
                inserts.append(f"The special almost magic number for {key} is: {number}.")
            else:
                inserts.append(f"The ordinary number for {key} is: {number}.")

        # Filler to the target length, then the needles at random sentence boundaries.
        target = tokens * CHARS_PER_TOKEN - sum(len(s) + 1 for s in inserts)
        pool = _filler_pool(rng)
        avg = sum(map(len, pool)) / len(pool)
        body: list[str] = []
        size = 0
        while size < target:
            batch = rng.choices(pool, k=max(1, int((target - size) / avg) + 1))
            for s in batch:
                body.append(s)
                size += len(s)
                if size >= target:
                    break
        for s in inserts:
            body.insert(rng.randrange(len(body) + 1), s + " ")
        context = "".join(body).rstrip() + "\n"

        key_list = ", ".join(asked)
        task = (
            f"The variable `context` holds a long text (about {tokens} tokens, {len(context)} characters). "
            "Hidden in it are sentences of the exact form "
            "\"The special magic number for <key> is: <number>.\" with a 7-digit number. "
            "Near-misses do not count: a misspelled or longer key, an \"almost magic\" number, "
            "or any other number.\n"
            f"Find the special magic number of each of these keys.\n"
            f"Keys: {key_list}\n"
            "Answer with one line per key, in the form `<key>: <number>`."
        )
        return {
            "id": f"{self.name}-{seed}-{i}",
            "task": task,
            "context": context,
            "expected": {k: truth[k] for k in asked},
        }

    # -- scoring ----------------------------------------------------------------------------------
    def score(self, answer, expected) -> float:
        if not expected:
            return 1.0
        keys = list(expected)
        got = parse_answer(answer, keys)
        return sum(got.get(k) == str(v) for k, v in expected.items()) / len(keys)

    def oracle(self, item: dict) -> str:
        """Reads the asked keys from the task and their needles from the context."""
        m = KEYS_RE.search(item["task"])
        keys = [k.strip() for k in m.group(1).split(",")]
        needles: dict[str, list[str]] = {}
        for key, number in NEEDLE_RE.findall(item["context"]):
            needles.setdefault(key, []).append(number)
        lines = []
        for key in keys:
            found = needles.get(key, [])
            if len(found) != 1:
                raise ValueError(f"key {key!r}: {len(found)} needles in the context")
            lines.append(f"{key}: {found[0]}")
        return "\n".join(lines)


@hookimpl
def register_benchmarks(register):
    register(NeedleBenchmark())
