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

# The record generator is the same as primefs-aggregate's (kept here so the package stands alone).
# label -> (templates with {a} {b} {c}, words for a, words for b, words for c). No word is shared
# between labels, and no template's own words are another label's slot words: the label of an
# instance is the label of its slot words.
VOCAB: dict[str, tuple[tuple[str, ...], list[str], list[str], list[str]]] = {
    "sports": (
        ("What a {c}! That {b} carried the whole {a} squad tonight.",
         "Tickets for the {a} {c} sold out in an hour, and the {b} is injured.",
         "Our {b} finally scored in the {c}; best {a} game all season.",
         "Watching {a} highlights again, the {b} in that {c} was unreal.",
         "Anyone else think the {b} should be benched before the {c}? Terrible {a} lately."),
        "soccer basketball tennis hockey rugby cricket volleyball baseball".split(),
        "striker goalkeeper quarterback midfielder pitcher referee coach defender".split(),
        "playoffs championship tournament derby semifinal league scrimmage overtime".split(),
    ),
    "politics": (
        ("The {a} keeps dodging questions about the {c} bill ahead of the {b}.",
         "Just voted in the {b}; the {c} reform is all anyone talks about.",
         "Can't believe the {a} flipped on {c} policy right before the {b}.",
         "Debate night: the {a} spent ten minutes on {c} and nothing on the {b}.",
         "New poll says the {b} will hinge on the {a} and the {c} law."),
        "senator governor mayor parliament congress minister chancellor councillor".split(),
        "election referendum ballot campaign filibuster caucus primary impeachment".split(),
        "tax immigration healthcare pension zoning tariff voting subsidy".split(),
    ),
    "science": (
        ("The {b} says the {a} results from the {c} could change the textbooks.",
         "Fascinating paper today: the {b} mapped the {a} using a new {c}.",
         "Our {b} spent all week on the {c} and the {a} still won't behave.",
         "Reading about how the {a} was measured; the {c} took the {b} three years.",
         "Finally, the {b} explained the {a} {c} in plain words."),
        "telescope microscope genome neutron protein enzyme galaxy molecule".split(),
        "physicist chemist biologist astronomer geologist researcher lab laboratory".split(),
        "experiment hypothesis dataset peer-review spectrometer simulation fossil isotope".split(),
    ),
    "food": (
        ("Made {a} tonight with way too much {b}; zero regrets.",
         "That little {c} downtown serves the best {a}, ask for extra {b}.",
         "Is {b} supposed to go in {a}? Asking for a friend at the {c}.",
         "Tried the new {c}: the {a} was cold but the {b} sauce saved it.",
         "Nothing beats homemade {a} with fresh {b} after a long shift at the {c}."),
        "lasagna ramen curry tacos risotto dumplings pancakes burrito".split(),
        "garlic basil cinnamon paprika ginger saffron cilantro nutmeg".split(),
        "bakery bistro diner food-truck kitchen cafe pizzeria brunch-spot".split(),
    ),
    "travel": (
        ("Missed my {a} to {b} and now the {c} is lost too.",
         "Two weeks in {b} with nothing but a {c} and a flexible {a}.",
         "Pro tip for {b}: book the {a} early and skip the {c} lines.",
         "Landed in {b}; the {a} was chaos but the {c} made it worth it.",
         "Planning {b} next spring, any {a} advice? Already sorted the {c}."),
        "airport train ferry cruise hostel layover passport itinerary".split(),
        "Lisbon Kyoto Reykjavik Marrakesh Patagonia Santorini Hanoi Cusco".split(),
        "backpack suitcase boarding-pass visa jet-lag sightseeing souvenir tour-guide".split(),
    ),
    "finance": (
        ("My {c} says to rebalance the {a} before the {b} numbers come out.",
         "Another {b} scare and my {a} took a hit again; calling the {c} tomorrow.",
         "Moved everything to a new {c} just as {b} ticked up; the {a} look fine.",
         "Quarterly {b} beat expectations, so the {a} jumped and the {c} is thrilled.",
         "Should I move my {a} to a different {c} with {b} this high?"),
        "stocks bonds dividends mortgage portfolio crypto index-fund savings".split(),
        "interest-rate inflation earnings recession rally bear-market bull-market yield".split(),
        "broker accountant bank hedge-fund advisor ledger brokerage credit-union".split(),
    ),
}
LABELS: tuple[str, ...] = tuple(VOCAB)
WORD_LABEL: dict[str, str] = {w.lower(): label for label, (_, *slots) in VOCAB.items() for ws in slots for w in ws}
_WORD_RE = re.compile(r"[a-z][a-z-]*")
LINE_RE = re.compile(
    r"^Date: (\d{4}-\d{2}-\d{2}) \|\| User: (u\d+) \|\| Instance: (.*?)(?: \|\| Label: ([a-z]+))?$", re.MULTILINE
)
_START = _dt.date(2023, 1, 1).toordinal()
_DAYS = 731  # 2023-01-01 .. 2024-12-31


def instance(rng: random.Random, label: str) -> str:
    templates, a, b, c = VOCAB[label]
    return rng.choice(templates).format(a=rng.choice(a), b=rng.choice(b), c=rng.choice(c))


def classify(text: str) -> str:
    """The label of an instance text, from the generator's word lists (the ground truth)."""
    votes = Counter(WORD_LABEL[w] for w in _WORD_RE.findall(text.lower()) if w in WORD_LABEL)
    if not votes:
        raise ValueError(f"no label word in {text!r}")
    (label, n), *rest = votes.most_common()
    if rest:
        raise ValueError(f"mixed labels in {text!r}: {dict(votes)}")
    return label


def parse_records(context: str) -> list[tuple[str, str, str]]:
    """(date, user, label) per line; the label is read from the line, or inferred from its text."""
    return [(d, u, lab or classify(text)) for d, u, text, lab in LINE_RE.findall(context)]


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
    The expected set has between 3 and about 200 pairs.
    """

    def __init__(self, mode: str = "explicit", users: int = 50, max_lines_per_label: int = 10,
                 name: str | None = None):
        if mode not in ("explicit", "inferred"):
            raise ValueError("mode must be 'explicit' or 'inferred'")
        if users < 30 or max_lines_per_label < 1:
            raise ValueError("need at least 30 users and max_lines_per_label >= 1")
        self.mode = mode
        self.users = int(users)
        self.max_lines_per_label = int(max_lines_per_label)
        self.name = name or ("pairs" if mode == "explicit" else "pairs-inferred")
        how = "each line carries its label" if mode == "explicit" else "labels inferred from the text"
        self.description = (
            f"OOLONG-Pairs style: list every pair of users ({self.users} users, {how}) that meets a "
            f"label condition. Score: F1 over unordered pairs."
        )

    def items(self, n: int = 10, seed: int = 0) -> Iterator[dict]:
        for i in range(n):
            yield self.make_item(seed, i)

    def make_item(self, seed: int, i: int) -> dict:
        rng = random.Random(f"{self.name}|{self.mode}|{self.users}|{self.max_lines_per_label}|{seed}|{i}")
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
        for u in users:
            for label in LABELS:
                if u in members[label]:
                    for _ in range(rng.randint(1, self.max_lines_per_label)):
                        day = _dt.date.fromordinal(_START + rng.randrange(_DAYS)).isoformat()
                        records.append((day, u, label))
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
