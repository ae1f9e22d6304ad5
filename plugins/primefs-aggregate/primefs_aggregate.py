"""primefs-aggregate: an OOLONG style aggregation benchmark for `primefs eval`.

Each item's ``context`` is thousands of records, one a line:

    Date: 2024-03-17 || User: u4821 || Instance: Made ramen tonight with way too much garlic; zero regrets.

Every instance is about exactly one of six topics (its label), known by construction: the text is
made from per-label templates and per-label word lists that share no word. Two modes:

* ``explicit`` (benchmark ``aggregate``): each line ends with `` || Label: <label>``; code alone solves it.
* ``inferred`` (benchmark ``aggregate-inferred``): no label on the line; it must be inferred from
  the text (e.g. by sub-model calls over chunks of lines).

Questions vary by item: the most / least common label, the count of a label (overall, for one
user, or after a date), and which of two labels is more common. Score: a number scores
``0.75 ** |error|``, a label scores 1 if it is the right one (case-insensitive), else 0.
"""
from __future__ import annotations

import datetime as _dt
import random
import re
from collections import Counter
from typing import Iterator

from primefs import hookimpl

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
_NUMBER_RE = re.compile(r"(?<![\w.-])-?\d{1,3}(?:,\d{3})+(?![\d,])|(?<![\w.-])-?\d+(?:\.\d+)?(?![\d-])")
_ANSWER_MARK = re.compile(r"(?:final answer|answer)\s*(?:is)?\s*[:=]\s*(.+)", re.IGNORECASE)


def _final_part(text: str) -> str:
    """The part of an answer that holds the answer: after the last `Answer:`, else the last line."""
    text = str(text or "").strip()
    marks = list(_ANSWER_MARK.finditer(text))
    if marks:
        return marks[-1].group(1)
    lines = [line for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else ""


def parse_number(text) -> float | None:
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        return float(text)
    for part in (_final_part(text), str(text or "")):
        m = _NUMBER_RE.search(part)
        if m:
            return float(m.group(0).replace(",", ""))
    return None


def parse_label(text, labels=LABELS) -> str | None:
    """The label an answer names: all of it if it is one label, else the first label in its final part."""
    text = str(text or "")
    bare = re.sub(r"[^a-z]", "", text.lower())
    if bare in labels:
        return bare
    pattern = re.compile(r"\b(" + "|".join(map(re.escape, labels)) + r")\b")
    for part in (_final_part(text), text):
        m = pattern.search(part.lower())
        if m:
            return m.group(1)
    return None


def score_answer(answer, expected) -> float:
    if isinstance(expected, str):
        return 1.0 if parse_label(answer) == expected.lower() else 0.0
    got = parse_number(answer)
    if got is None:
        return 0.0
    return 0.75 ** abs(got - float(expected))


# -- questions --------------------------------------------------------------------------------------
QUESTIONS = {
    "most": re.compile(r"^Question: Which label is the most common across all lines\?$", re.M),
    "least": re.compile(r"^Question: Which label is the least common across all lines\?$", re.M),
    "count": re.compile(r"^Question: How many lines have the label '([a-z]+)'\?$", re.M),
    "count_user": re.compile(r"^Question: How many lines of user (u\d+) have the label '([a-z]+)'\?$", re.M),
    "count_after": re.compile(
        r"^Question: How many lines dated after (\d{4}-\d{2}-\d{2}) \(that day excluded\) have the label '([a-z]+)'\?$",
        re.M),
    "compare": re.compile(r"^Question: Which label is more common, '([a-z]+)' or '([a-z]+)'\?$", re.M),
}


def answer_question(task: str, records: list[tuple[str, str, str]]):
    """The exact answer (a label or an int) to the question in `task`, over parsed records."""
    counts = Counter(label for _, _, label in records)
    for kind, pattern in QUESTIONS.items():
        m = pattern.search(task)
        if not m:
            continue
        if kind == "most":
            ranked = counts.most_common()
            if len(ranked) > 1 and ranked[0][1] == ranked[1][1]:
                raise ValueError("tie for the most common label")
            return ranked[0][0]
        if kind == "least":
            ranked = sorted(((counts.get(lab, 0), lab) for lab in LABELS))
            if ranked[0][0] == ranked[1][0]:
                raise ValueError("tie for the least common label")
            return ranked[0][1]
        if kind == "count":
            return counts.get(m.group(1), 0)
        if kind == "count_user":
            user, label = m.groups()
            return sum(1 for _, u, lab in records if u == user and lab == label)
        if kind == "count_after":
            day, label = m.groups()
            return sum(1 for d, _, lab in records if d > day and lab == label)
        x, y = m.groups()
        if counts.get(x, 0) == counts.get(y, 0):
            raise ValueError("tie between the compared labels")
        return x if counts.get(x, 0) > counts.get(y, 0) else y
    raise ValueError("no known question in the task")


class AggregateBenchmark:
    """OOLONG style aggregation over labelled records.

    mode:   "explicit" (each line carries ` || Label: <label>`) or "inferred" (it does not).
    lines:  records per item (default 2000: ~280k characters, ~70k tokens).
    users:  distinct user ids per item.
    """

    def __init__(self, mode: str = "explicit", lines: int = 2000, users: int = 40, name: str | None = None):
        if mode not in ("explicit", "inferred"):
            raise ValueError("mode must be 'explicit' or 'inferred'")
        if lines < 50 or users < 2:
            raise ValueError("need at least 50 lines and 2 users")
        self.mode = mode
        self.lines = int(lines)
        self.users = int(users)
        self.name = name or ("aggregate" if mode == "explicit" else "aggregate-inferred")
        how = ("each line carries its label" if mode == "explicit"
               else "labels must be inferred from each line's text")
        self.description = (
            f"OOLONG style aggregation over {self.lines} records ({how}): most/least common label, "
            f"label counts (overall, per user, after a date), comparisons. Score: labels exact, "
            f"numbers 0.75**|error|."
        )

    def items(self, n: int = 10, seed: int = 0, *, lines: int | None = None,
              users: int | None = None) -> Iterator[dict]:
        """Items of this benchmark, or of a variant with other `lines` / `users` (e.g. lines=5000)."""
        bench = self
        if (lines, users) != (None, None):
            bench = AggregateBenchmark(self.mode, lines=self.lines if lines is None else lines,
                                       users=self.users if users is None else users, name=self.name)
        for i in range(n):
            yield bench.make_item(seed, i)

    def make_item(self, seed: int, i: int) -> dict:
        rng = random.Random(f"{self.name}|{self.mode}|{self.lines}|{self.users}|{seed}|{i}")
        # Distinct label counts, so most / least common and comparisons have one answer.
        while True:
            shares = rng.sample(range(4, 60), len(LABELS))
            counts = [self.lines * s // sum(shares) for s in shares]
            counts[counts.index(max(counts))] += self.lines - sum(counts)
            if len(set(counts)) == len(counts):
                break
        labels = [lab for lab, c in zip(LABELS, counts) for _ in range(c)]
        rng.shuffle(labels)
        users = [f"u{n}" for n in rng.sample(range(1000, 10000), self.users)]
        weights = [rng.uniform(0.2, 3.0) for _ in users]
        line_users = rng.choices(users, weights=weights, k=self.lines)
        records = []
        out = []
        for label, user in zip(labels, line_users):
            day = _dt.date.fromordinal(_START + rng.randrange(_DAYS)).isoformat()
            records.append((day, user, label))
            line = f"Date: {day} || User: {user} || Instance: {instance(rng, label)}"
            out.append(line + (f" || Label: {label}" if self.mode == "explicit" else ""))
        context = "\n".join(out) + "\n"

        kind = rng.choice(["most", "least", "count", "count_user", "count_after", "compare"])
        if kind == "most":
            question = "Which label is the most common across all lines?"
        elif kind == "least":
            question = "Which label is the least common across all lines?"
        elif kind == "count":
            question = f"How many lines have the label '{rng.choice(LABELS)}'?"
        elif kind == "count_user":
            question = f"How many lines of user {rng.choice(line_users)} have the label '{rng.choice(LABELS)}'?"
        elif kind == "count_after":
            day = _dt.date.fromordinal(_START + rng.randrange(60, _DAYS - 60)).isoformat()
            question = f"How many lines dated after {day} (that day excluded) have the label '{rng.choice(LABELS)}'?"
        else:
            x, y = rng.sample(LABELS, 2)
            question = f"Which label is more common, '{x}' or '{y}'?"
        reply = ("Answer with only the label." if kind in ("most", "least", "compare")
                 else "Answer with only the number.")

        if self.mode == "explicit":
            form = "`Date: YYYY-MM-DD || User: <user id> || Instance: <text> || Label: <label>`"
            note = "The label of each line is given in its `Label` field."
        else:
            form = "`Date: YYYY-MM-DD || User: <user id> || Instance: <text>`"
            note = ("The labels are not given: infer each line's label from its instance text "
                    "(each instance is clearly about exactly one of the labels).")
        task = (
            f"The variable `context` holds {self.lines} records, one per line, in the form {form}.\n"
            f"Every line has exactly one label, one of: {', '.join(LABELS)}. {note}\n"
            f"Question: {question}\n{reply}"
        )
        expected = answer_question(task, records)
        return {"id": f"{self.name}-{seed}-{i}", "task": task, "context": context, "expected": expected}

    def score(self, answer, expected) -> float:
        return score_answer(answer, expected)

    def oracle(self, item: dict) -> str:
        """Parses the records from the context (inferring labels from the text if absent) and answers."""
        return str(answer_question(item["task"], parse_records(item["context"])))


@hookimpl
def register_benchmarks(register):
    register(AggregateBenchmark("explicit"))
    register(AggregateBenchmark("inferred"))
