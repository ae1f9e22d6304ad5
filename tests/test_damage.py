"""Derived, runtime and misshapen files, damaged the ways a crash, a disk or a person damages them: every
command and a runner go on, with no traceback and no hang. The index, summaries and archives' indexes are
caches: any doubt means rebuild or skip. Each case plants one damage in a workspace that has finished
sessions (one archived), then runs the commands a person would."""
from __future__ import annotations

import json
import os
import shutil
import sqlite3
import zipfile
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import by_name, run_once

from primefs.cli.main import main
from primefs.store.goals import write_goal

DEEP = "[" * 200_000 + "]" * 200_000
COMMANDS = [["status"], ["status", "--json"], ["status", "-a"], ["usage", "one"], ["usage", "one", "--tree"],
            ["log", "one"], ["logs", "-n", "20"], ["logs", "--counts"], ["agents", "--once"], ["reindex"],
            ["send", "one", "hello"], ["archive", "--dry-run", "--status", "idle"]]


@pytest.fixture(scope="module")
def template(tmp_path_factory):
    """A workspace with sessions one (and a child), two, and an archived tree: copied for each case."""
    from primefs.store.workspace import init_workspace

    ws = init_workspace(tmp_path_factory.mktemp("damage") / "ws")
    (ws.root / "s.yaml").write_text("rules:\n  - match: '^one'\n    replies:\n      - code: \"rlm('sub').wait()\"\n"
                                    "      - text: done\ndefault:\n  - text: ok\n")
    from conftest import configure

    ws = configure(ws, model="scripted/s.yaml")
    write_goal(ws, "old", name="old")
    run_once(ws)
    r = CliRunner().invoke(main, ["-w", str(ws.root), "archive", "--status", "idle"], catch_exceptions=False)
    assert r.exit_code == 0 and list((ws.root / "archive").glob("*.zip")), r.output
    for name in ("one", "two"):
        write_goal(ws, name, name=name)
    run_once(ws)
    return ws.root


def history_line(root, line: str):
    with open(by_name(root)["one"].dir / "history.jsonl", "a") as f:
        f.write(line + "\n")


def flip_a_byte(path: Path, at: float = 0.5):
    data = bytearray(path.read_bytes())
    i = int(len(data) * at)
    data[i] ^= 0xFF
    path.write_bytes(bytes(data))


def archived_zip(root: Path) -> Path:
    return next((root / "archive").glob("*.zip"))


def rewrite_zip(path: Path, change):
    """Rewrite an archive with change(name, data) -> (name, data, compress_type) for each entry."""
    entries = []
    with zipfile.ZipFile(path) as z:
        for info in z.infolist():
            entries.append(change(info.filename, z.read(info)))
    with zipfile.ZipFile(path, "w") as z:
        for name, data, kind in entries:
            z.writestr(zipfile.ZipInfo(name), data, compress_type=kind)


def set_zip_flag(path: Path, what: str):
    """Mark the central directory's entries encrypted, or of an unknown compression method."""
    data = bytearray(path.read_bytes())
    i = data.find(b"PK\x01\x02")
    while i >= 0:
        if what == "encrypted":
            data[i + 8] |= 0x01
        else:
            data[i + 10:i + 12] = (99).to_bytes(2, "little")
        i = data.find(b"PK\x01\x02", i + 4)
    path.write_bytes(bytes(data))


def journal(root: Path, text: str):
    folder = root / ".primefs" / "archiving" / "261201-000000000-zzz"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "journal.json").write_text(text)


CASES = {
    "a deeply nested history line": lambda r: history_line(r, DEEP),
    "history lines of the wrong types": lambda r: [history_line(r, line) for line in (
        '{"type": 5, "ts": "x", "n": "a"}', '{"type": "model_call", "input_tokens": "many", "cost_usd": [1]}',
        '{"ts": 1e308, "type": "cell", "output": {"a": 1}}', '[]', '"text"', 'null', '{"type": null}',
        '{"type": "turn_end", "elapsed_s": -1e308, "ts": -1e308}', '{"type": "message", "from": 3, "text": 4}')],
    "lone surrogates in history": lambda r: history_line(r, '{"ts": 1.0, "type": "assistant", "text": "\\ud800 x"}'),
    "a nested summary.json": lambda r: (by_name(r)["one"].dir / "summary.json").write_text(DEEP),
    "a summary.json of wrong types": lambda r: (by_name(r)["one"].dir / "summary.json").write_text(
        json.dumps({"version": 1, "id": by_name(r)["one"].id, "offset": "x", "usage": [], "meta": 5})),
    "a summary.json that is a FIFO": lambda r: ((by_name(r)["one"].dir / "summary.json").unlink(),
                                                os.mkfifo(by_name(r)["one"].dir / "summary.json")),
    "a surrogate in session.yaml": lambda r: (by_name(r)["two"].dir / "session.yaml").write_text(
        (by_name(r)["two"].dir / "session.yaml").read_text().replace("model: ", 'model: "\\ud800" #', 1)),
    "a byte of the index flipped": lambda r: flip_a_byte(r / ".primefs" / "index.sqlite", 0.6),
    "the index cut short": lambda r: (r / ".primefs" / "index.sqlite").write_bytes(
        (r / ".primefs" / "index.sqlite").read_bytes()[:5000]),
    "the index a folder": lambda r: ((r / ".primefs" / "index.sqlite").unlink(),
                                     (r / ".primefs" / "index.sqlite").mkdir()),
    "the index of a foreign schema": lambda r: (sqlite3.connect(r / ".primefs" / "index.sqlite").execute(
        "DROP TABLE sessions").connection.commit()),
    "an archive with bad deflate data": lambda r: flip_a_byte(archived_zip(r), 0.3),
    "an archive marked encrypted": lambda r: set_zip_flag(archived_zip(r), "encrypted"),
    "an archive of an unknown method": lambda r: set_zip_flag(archived_zip(r), "method"),
    "an archive with a nested manifest": lambda r: rewrite_zip(archived_zip(r), lambda n, d: (
        n, DEEP.encode() if n.endswith("manifest.json") else d, zipfile.ZIP_DEFLATED)),
    "an archive with a manifest of wrong types": lambda r: rewrite_zip(archived_zip(r), lambda n, d: (
        n, b'{"sessions": 5, "root": []}' if n.endswith("manifest.json") else d, zipfile.ZIP_DEFLATED)),
    "an archive that is not a zip": lambda r: archived_zip(r).write_bytes(b"not a zip at all"),
    "a broken archiving journal": lambda r: journal(r, "{broken"),
    "an archiving journal of wrong types": lambda r: journal(r, json.dumps({"root": 5, "sessions": "x", "keys": []})),
    "a nested archiving journal": lambda r: journal(r, DEEP),
    "runner.json a folder": lambda r: (r / ".primefs" / "runner.json").mkdir(parents=True),
    "runner.json garbage": lambda r: (r / ".primefs" / "runner.json").write_text("\x00{garbage"),
    "goals.json nested": lambda r: (r / ".primefs" / "goals.json").write_text(DEEP),
    "trust.json garbage": lambda r: (r / ".primefs" / "trust.json").write_text('{"primefs.yaml": [1]}'),
    "the git index of primefs garbage": lambda r: (r / ".primefs" / "git-index").write_bytes(b"DIRC garbage"),
    "git-index.head garbage": lambda r: (r / ".primefs" / "git-index.head").write_text("not a sha\n"),
    "a stale runner.lock": lambda r: (r / ".primefs" / "runner.lock").write_text("999999999 0\n"),
    "mail/cur a file": lambda r: (shutil.rmtree(by_name(r)["one"].dir / "mail" / "cur"),
                                  (by_name(r)["one"].dir / "mail" / "cur").write_text("x")),
    "mail/ missing": lambda r: shutil.rmtree(by_name(r)["one"].dir / "mail"),
    "mail/new a file": lambda r: (shutil.rmtree(by_name(r)["one"].dir / "mail" / "new"),
                                  (by_name(r)["one"].dir / "mail" / "new").write_text("x")),
    "mail/tmp a file": lambda r: (shutil.rmtree(by_name(r)["one"].dir / "mail" / "tmp"),
                                  (by_name(r)["one"].dir / "mail" / "tmp").write_text("x")),
    "a mail of a 250-character name": lambda r: (by_name(r)["one"].dir / "mail" / "new" / ("m" * 250)).write_text("hi"),
    "a history that is a FIFO": lambda r: ((by_name(r)["two"].dir / "history.jsonl").unlink(),
                                           os.mkfifo(by_name(r)["two"].dir / "history.jsonl")),
}


@pytest.mark.parametrize("case", list(CASES))
def test_commands_and_a_runner_go_on(template, tmp_path, case):
    root = tmp_path / "ws"
    shutil.copytree(template, root, symlinks=True)
    CASES[case](root)
    runner = CliRunner()
    for cmd in COMMANDS:
        r = runner.invoke(main, ["-w", str(root), *cmd])
        assert r.exception is None or isinstance(r.exception, SystemExit), (cmd, repr(r.exception), r.output)
        assert "Traceback" not in r.output, (cmd, r.output)
        assert r.exit_code in (0, 1, 3), (cmd, r.exit_code, r.output)
    r = runner.invoke(main, ["-w", str(root), "run", "--once", "-q"])
    assert r.exception is None or isinstance(r.exception, SystemExit), ("run", repr(r.exception), r.output)
    assert r.exit_code in (0, 1, 3) and "Traceback" not in r.output, r.output


def test_the_events_of_a_session_whose_yaml_is_broken_say_so(template, tmp_path):
    root = tmp_path / "ws"
    shutil.copytree(template, root, symlinks=True)
    one = by_name(root)["one"]
    (one.dir / "session.yaml").write_text("status: [unclosed\n")
    r = CliRunner().invoke(main, ["-w", str(root), "logs", "-s", one.id, "-n", "2"], catch_exceptions=False)
    assert r.exit_code == 0 and f"{one.id} (session.yaml broken)" in r.output and "(None)" not in r.output, r.output
