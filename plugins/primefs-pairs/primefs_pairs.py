"""primefs-pairs: an OOLONG-Pairs style benchmark for `primefs eval`.

Each item's ``context`` is records, one a line, of the same kind as primefs-aggregate's:

    Date: 2024-03-17 || User: u4821 || Instance: Made ramen tonight with way too much garlic; zero regrets.

Every instance is about exactly one of six topics (its label), known by construction (per-label
templates and word lists that share no word). The question asks for every unordered pair of
distinct users that satisfies a label condition:

* both users have at least one line with label X;
* one user has a line with label X and the other a line with label Y;
* both users have a line with label X and neither has a line with label Y.

The answer is a list of pairs, one ``(u1234, u5678)`` a line; the score is the F1 between the
answered and the expected sets of unordered pairs. Two modes, as in primefs-aggregate:
``explicit`` (benchmark ``pairs``: each line ends with `` || Label: <label>``) and ``inferred``
(benchmark ``pairs-inferred``: the label must be inferred from the text).
"""
from __future__ import annotations

import datetime as _dt
import random
import re
from collections import Counter
from itertools import combinations
from typing import Iterator

from primefs import hookimpl

# The records are primefs-aggregate's: same vocabulary, line format and ground-truth labelling.
from primefs_aggregate import LABELS, LINE_RE, VOCAB, _DAYS, _START, classify, instance, parse_records  # noqa: E402,F401


# -- answers ----------------------------------------------------------------------------------------
_SEP = r"(?:[ \t,;:/&|=()\[\]{}<>'\"\u2013\u2014-]|\band\b|\bwith\b)"
_PAIR_RE = re.compile(r"(?<!\w)(u\d+)(?!\w)" + _SEP + r"{1,12}?" + r"(?<!\w)(u\d+)(?!\w)", re.IGNORECASE)


def _pair(a: str, b: str) -> tuple[str, str] | None:
    a, b = a.lower(), b.lower()
    return None if a == b else (min(a, b), max(a, b))


def parse_pairs(answer) -> set[tuple[str, str]]:
    """Unordered pairs from an answer: a JSON list of pairs, or `(u1, u2)` / `u1-u2` / `u1 u2` per line."""
    if isinstance(answer, (list, tuple, set)):
        items = answer
    else:
        text = str(answer or "").strip()
        items = None
        if text.startswith("[") or text.startswith("```"):
            import json

            body = re.sub(r"^```\w*\n?|```$", "", text).strip()
            try:
                items = json.loads(body)
            except ValueError:
                items = None
            if not isinstance(items, list):
                items = None
        if items is None:
            return {p for a, b in _PAIR_RE.findall(text) if (p := _pair(a, b))}
    found = set()
    for item in items:
        if isinstance(item, str):
            found |= parse_pairs(item)
        elif isinstance(item, (list, tuple)) and len(item) == 2 and (p := _pair(str(item[0]), str(item[1]))):
            found.add(p)
    return found


def f1(got: set, expected: set) -> float:
    if not got and not expected:
        return 1.0
    hit = len(got & expected)
    if hit == 0:
        return 0.0
    precision, recall = hit / len(got), hit / len(expected)
    return 2 * precision * recall / (precision + recall)


def score_answer(answer, expected) -> float:
    return f1(parse_pairs(answer), {p for a, b in expected if (p := _pair(a, b))})


# -- questions --------------------------------------------------------------------------------------
_Q = "^Question: List every pair of two different users "
QUESTIONS = {
    "both": re.compile(_Q + r"who both have at least one line with the label '([a-z]+)'\.$", re.M),
    "cross": re.compile(
        _Q + r"where one of them has at least one line with the label '([a-z]+)' and the other "
        r"has at least one line with the label '([a-z]+)'\.$", re.M),
    "both_not": re.compile(
        _Q + r"who both have at least one line with the label '([a-z]+)' and no line with the label '([a-z]+)'\.$",
        re.M),
}


def answer_question(task: str, records) -> list[list[str]]:
    """The exact sorted list of pairs for the question in `task`, over (date, user, label) records."""
    has: dict[str, set[str]] = {}
    for _, user, label in records:
        has.setdefault(label, set()).add(user)
    for kind, pattern in QUESTIONS.items():
        m = pattern.search(task)
        if not m:
            continue
        if kind == "both":
            pairs = set(combinations(sorted(has.get(m.group(1), ())), 2))
        elif kind == "cross":
            xs, ys = has.get(m.group(1), set()), has.get(m.group(2), set())
            pairs = {p for a in xs for b in ys if (p := _pair(a, b))}
        else:
            users = has.get(m.group(1), set()) - has.get(m.group(2), set())
            pairs = set(combinations(sorted(users), 2))
        return [list(p) for p in sorted(pairs)]
    raise ValueError("no known question in the task")


def format_pairs(pairs) -> str:
    return "\n".join(f"({a}, {b})" for a, b in pairs)


class PairsBenchmark:
    """OOLONG-Pairs style: list the user pairs that satisfy a label condition.

    mode:                 "explicit" (lines carry ` || Label: <label>`) or "inferred" (they do not).
    users:                distinct users per item (default 50).
    max_lines_per_label:  a user with a label has 1..this many lines with it (default 10).
    lines:                exactly this many records instead (at least users * 6; e.g. 5000):
                          one per (user, label) held, the rest spread at random.
    The expected set has between 3 and about 200 pairs.
    """

    def __init__(self, mode: str = "explicit", users: int = 50, max_lines_per_label: int = 10,
                 lines: int | None = None, name: str | None = None):
        if mode not in ("explicit", "inferred"):
            raise ValueError("mode must be 'explicit' or 'inferred'")
        if users < 30 or max_lines_per_label < 1:
            raise ValueError("need at least 30 users and max_lines_per_label >= 1")
        if lines is not None and lines < users * len(LABELS):
            raise ValueError(f"lines must be at least users * {len(LABELS)} ({users * len(LABELS)})")
        self.mode = mode
        self.users = int(users)
        self.max_lines_per_label = int(max_lines_per_label)
        self.lines = None if lines is None else int(lines)
        self.name = name or ("pairs" if mode == "explicit" else "pairs-inferred")
        how = "each line carries its label" if mode == "explicit" else "labels inferred from the text"
        self.description = (
            f"OOLONG-Pairs style: list every pair of users ({self.users} users, {how}) that meets a "
            f"label condition. Score: F1 over unordered pairs."
        )

    def items(self, n: int = 10, seed: int = 0, *, lines: int | None = None,
              users: int | None = None) -> Iterator[dict]:
        """Items of this benchmark, or of a variant with other `users` / an exact record count `lines`."""
        bench = self
        if (lines, users) != (None, None):
            bench = PairsBenchmark(self.mode, users=self.users if users is None else users,
                                   max_lines_per_label=self.max_lines_per_label,
                                   lines=self.lines if lines is None else lines, name=self.name)
        for i in range(n):
            yield bench.make_item(seed, i)

    def make_item(self, seed: int, i: int) -> dict:
        # `lines` joins the seed only when set: items made without it stay what they always were
        rng = random.Random(f"{self.name}|{self.mode}|{self.users}|{self.max_lines_per_label}|{seed}|{i}"
                            + (f"|lines={self.lines}" if self.lines else ""))
        users = [f"u{n}" for n in rng.sample(range(1000, 10000), self.users)]
        kind = rng.choice(list(QUESTIONS))
        x, y = rng.sample(LABELS, 2)
        members: dict[str, set[str]] = {}
        if kind == "both":
            members[x] = set(rng.sample(users, rng.randint(6, 20)))
            question = f"who both have at least one line with the label '{x}'."
        elif kind == "cross":
            members[x] = set(rng.sample(users, rng.randint(4, 14)))
            members[y] = set(rng.sample(users, rng.randint(4, 14)))
            question = (f"where one of them has at least one line with the label '{x}' and the other "
                        f"has at least one line with the label '{y}'.")
        else:
            while True:
                members[x] = set(rng.sample(users, rng.randint(10, 26)))
                members[y] = {u for u in users if rng.random() < 0.4}
                if len(members[x] - members[y]) >= 3 and len(members[x] - members[y]) <= 20:
                    break
            question = f"who both have at least one line with the label '{x}' and no line with the label '{y}'."
        for label in LABELS:
            if label not in members:
                p = rng.uniform(0.25, 0.6)
                members[label] = {u for u in users if rng.random() < p}
        free = [lab for lab in LABELS if lab not in (x, y)]
        for u in users:
            if not any(u in members[lab] for lab in LABELS):
                members[rng.choice(free)].add(u)

        records = []
        if self.lines is None:
            for u in users:
                for label in LABELS:
                    if u in members[label]:
                        for _ in range(rng.randint(1, self.max_lines_per_label)):
                            day = _dt.date.fromordinal(_START + rng.randrange(_DAYS)).isoformat()
                            records.append((day, u, label))
        else:  # exactly `lines` records: one per (user, label) held, the rest spread at random
            held = [(u, label) for u in users for label in LABELS if u in members[label]]
            counts = Counter(rng.choices(range(len(held)), k=self.lines - len(held)))
            for j, (u, label) in enumerate(held):
                for _ in range(1 + counts[j]):
                    records.append((_dt.date.fromordinal(_START + rng.randrange(_DAYS)).isoformat(), u, label))
        rng.shuffle(records)
        out = []
        for day, u, label in records:
            line = f"Date: {day} || User: {u} || Instance: {instance(rng, label)}"
            out.append(line + (f" || Label: {label}" if self.mode == "explicit" else ""))
        context = "\n".join(out) + "\n"

        if self.mode == "explicit":
            form = "`Date: YYYY-MM-DD || User: <user id> || Instance: <text> || Label: <label>`"
            note = "The label of each line is given in its `Label` field."
        else:
            form = "`Date: YYYY-MM-DD || User: <user id> || Instance: <text>`"
            note = ("The labels are not given: infer each line's label from its instance text "
                    "(each instance is clearly about exactly one of the labels).")
        task = (
            f"The variable `context` holds {len(records)} records of {self.users} users, one per line, "
            f"in the form {form}.\n"
            f"Every line has exactly one label, one of: {', '.join(LABELS)}. {note}\n"
            f"Question: List every pair of two different users {question}\n"
            "Answer with one pair per line, in the form `(u1234, u5678)`. Each pair is unordered: "
            "list it once, in either order."
        )
        expected = answer_question(task, records)
        return {"id": f"{self.name}-{seed}-{i}", "task": task, "context": context, "expected": expected}

    def score(self, answer, expected) -> float:
        return score_answer(answer, expected)

    def oracle(self, item: dict) -> str:
        """Parses the records from the context (inferring labels from the text if absent) and answers."""
        return format_pairs(answer_question(item["task"], parse_records(item["context"])))


@hookimpl
def register_benchmarks(register):
    register(PairsBenchmark("explicit"))
    register(PairsBenchmark("inferred"))
