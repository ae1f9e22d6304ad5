"""store/events.py, the registry of history events: it agrees with docs/workspace.md's table, writers are
held to it (PRIMEFS_CHECK_EVENTS, set for the whole suite), and readers check through it what they rely on."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from primefs.store import events
from primefs.store.history import History, parse_event

DOC = Path(__file__).resolve().parents[2] / "docs" / "workspace.md"


def doc_rows() -> dict[str, str]:
    """type -> its fields column, from the table under "### history.jsonl"."""
    text = DOC.read_text().split("### history.jsonl", 1)[1]
    rows: dict[str, str] = {}
    for line in text.splitlines():
        m = re.match(r"\|\s*`(\w+)`[^|]*\|([^|]*)\|", line)
        if m and m[1] != "type":
            rows[m[1]] = rows.get(m[1], "") + m[2]
        elif rows and not line.startswith("|"):
            break
    return rows


def test_every_event_type_and_field_is_documented_and_every_documented_type_declared():
    rows = doc_rows()
    assert set(rows) == set(events.EVENTS)
    for name, fields in events.FIELDS.items():
        for field in fields:
            assert re.search(f"`{field}[`:]", rows[name]), f"{name}.{field} is not in docs/workspace.md"


def test_a_writer_is_held_to_the_registry(tmp_path, monkeypatch):
    monkeypatch.setenv("PRIMEFS_CHECK_EVENTS", "1")
    h = History(tmp_path / "history.jsonl")
    h.append("cell", call_id=None, code="1", output="1\n", error=None, timed_out=False, restarted=False,
             elapsed_s=0, shown="1")
    for kind, fields, says in [
        ("cel", {}, "event type 'cel' is not declared"),
        ("cell", {"shown": "x", "stdout": ""}, "field 'stdout' is not declared"),
        ("cell", {"code": "1"}, "missing shown"),
        ("turn_end", {"outcome": "finished"}, "field 'outcome' is 'finished'"),
        ("model_call", {"input_tokens": True}, "field 'input_tokens' is True"),
        ("model_call", {"input_tokens": "7"}, "field 'input_tokens' is '7'"),
    ]:
        with pytest.raises(ValueError, match=re.escape(says)):
            h.append(kind, **fields)
    assert [e["type"] for e in map(json.loads, h.path.read_text().splitlines())] == ["cell"]  # nothing refused landed
    monkeypatch.delenv("PRIMEFS_CHECK_EVENTS")
    h.append("cel")  # outside the tests nothing is refused: a plugin's own event type still lands
    h.close()


@pytest.mark.parametrize("line, readable", [
    ({"type": "cell", "shown": "x", "call_id": None}, True),
    ({"type": "cell", "call_id": None}, False),  # what the model saw is missing
    ({"type": "cell", "shown": "x", "call_id": 3}, False),
    ({"type": "message", "id": "m", "from": "a", "kind": "message", "text": "hi"}, True),
    ({"type": "message", "id": "m", "from": "a", "kind": "message"}, False),
    ({"type": "compaction", "summary": "s", "upto_n": True}, False),  # a bool is no event number
    ({"type": "model_call", "input_tokens": "many"}, True),  # not relied on: counted as nothing where read
    ({"type": "assistant", "calls": [{"id": "c", "name": "python", "arguments": "{}"}]}, True),
    ({"type": "assistant", "calls": [{"id": "c", "name": "python"}]}, False),
    ({"type": "a_plugins_own", "text": None}, True),
    ({"type": "a_plugins_own", "text": 3}, False),  # text and error are text on every event
])
def test_readers_check_through_the_registry_what_they_rely_on(line, readable):
    assert (parse_event(json.dumps(line).encode()) is not None) == readable
