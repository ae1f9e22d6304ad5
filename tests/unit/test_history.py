"""store/history.py's readers: the same events however a history is read. Real: history files the test writes
(hypothesis makes their lines, torn last lines and garbage too) and the readers; nothing is faked."""
from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from primefs.store.history import latest_events, read_events

line = st.one_of(
    st.builds(lambda n, pad: json.dumps({"type": "x", "n": n, "pad": pad}), st.integers(0, 10**6), st.text(max_size=80)),
    st.sampled_from(["garbage{", "[]", '{"type": 3}', "", '{"type": "y", "ts": "no time"}']),
)


@given(st.lists(line, max_size=40), st.text(max_size=30), st.sampled_from([1, 5, 64, 1 << 16]))
def test_latest_events_are_all_the_events_from_the_end_back(tmp_path_factory, lines, torn, chunk):
    path = tmp_path_factory.mktemp("h") / "history.jsonl"
    path.write_bytes(("".join(f"{x}\n" for x in lines) + torn.replace("\n", "")).encode("utf-8", "surrogatepass"))
    assert list(latest_events(path, chunk)) == list(reversed(read_events(path)))


def test_latest_events_read_only_as_far_as_asked(tmp_path, monkeypatch):
    """What came since the last turn costs a chunk, not the whole file (14 MB here)."""
    from primefs.store import history

    path = tmp_path / "history.jsonl"
    path.write_text("".join(json.dumps({"type": "x", "n": i, "pad": "p" * 100}) + "\n" for i in range(100_000)))
    read = []

    class Counting:
        def __init__(self, f):
            self.f = f

        def read(self, n=-1):
            data = self.f.read(n)
            read.append(len(data))
            return data

        def __getattr__(self, name):
            return getattr(self.f, name)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()

    real = history.open_regular
    monkeypatch.setattr(history, "open_regular", lambda p: Counting(real(p)))
    events = history.latest_events(path, chunk=1 << 16)
    assert [next(events)["n"] for _ in range(3)] == [99_999, 99_998, 99_997]
    assert sum(read) <= 1 << 16
