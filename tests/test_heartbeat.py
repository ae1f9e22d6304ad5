"""Heartbeats: schedules, ticks as mail, claimed before delivery, missed ticks coalesced."""
from __future__ import annotations

import json
import time
from datetime import datetime

import pytest
from conftest import BackgroundRunner, cli, configure, run_once, wait_for

from primefs.store import heartbeat as hb
from primefs.errors import PrimefsError
from primefs.store.goals import write_goal
from primefs.store.session import list_sessions


def test_schedules():
    assert hb.parse_schedule("every 10m") == {"every": 600}
    assert hb.parse_schedule("30s") == {"every": 30} and hb.parse_schedule("every 2 hours") == {"every": 7200}
    cron = hb.parse_schedule("*/15 9-17 * * 1-5")
    assert cron["cron"][0] == [0, 15, 30, 45] and cron["cron"][1] == list(range(9, 18))
    t = datetime(2026, 11, 27, 17, 50).timestamp()  # a Friday, 17:50
    assert datetime.fromtimestamp(hb.next_after(cron, t)) == datetime(2026, 11, 30, 9, 0)  # next Monday 9:00
    assert datetime.fromtimestamp(hb.next_after(hb.parse_schedule("0 0 1 * *"), t)) == datetime(2026, 12, 1, 0, 0)
    for bad in ("every", "sometimes", "* * *", "61 * * * *", "every 0s", "*/0 * * * *"):
        with pytest.raises(PrimefsError):
            hb.parse_schedule(bad)


def test_heartbeat_files_are_parsed_again_only_when_they_change(tmp_path, monkeypatch):
    """The runner asks up to four times a second: a file is parsed once per change, and every change is seen
    (a save, an edit in place, broken and mended); a broken file's problem is said at every ask."""
    session = tmp_path / "s1"
    session.mkdir()
    made = hb.add(session, "every 10m", "beat")
    parses = []
    real = hb.load_yaml
    monkeypatch.setattr(hb, "load_yaml", lambda *a, **k: (parses.append(1), real(*a, **k))[1])
    for _ in range(3):
        assert [x["prompt"] for x in hb.load_all(session)] == ["beat"]
    assert len(parses) == 1
    hb.load_all(session)[0]["prompt"] = "changed by a caller"  # a copy: what is kept stays as parsed
    assert hb.load_all(session)[0]["prompt"] == "beat"
    hb.save(session, {**made, "paused": True})  # a new file in its place
    assert hb.load_all(session)[0]["paused"] is True and len(parses) == 2
    path = hb.folder(session) / f"{made['id']}.yaml"
    path.write_text(path.read_text().replace("prompt: beat", "prompt: beat, edited in place"))
    assert hb.load_all(session)[0]["prompt"] == "beat, edited in place"
    good = path.read_text()
    path.write_text("schedule: [unclosed\n")
    for _ in range(2):
        problems: list[str] = []
        assert hb.load_all(session, problems) == [] and problems and made["id"] in problems[0]
    path.write_text(good)
    assert hb.load_all(session)[0]["prompt"] == "beat, edited in place" and len(parses) == 5


def test_goal_heartbeat_ticks_start_turns(ws):
    (ws.root / "s.yaml").write_text("default:\n" + "".join(f"  - text: tick {i}\n" for i in range(50)))
    ws = configure(ws, model="scripted/s.yaml")
    (ws.goals / "watch.md").write_text("---\nheartbeat: {every: 1s, prompt: check the build}\n---\nWatch things\n")
    with BackgroundRunner(ws):
        wait_for(lambda: any(len(s.events("turn_start")) >= 3 for s in list_sessions(ws.sessions)))
    s = list_sessions(ws.sessions)[0]
    beats = [m for m in s.events("message") if m["kind"] == "heartbeat"]
    # (a tick checked late under load may coalesce with the next one: the prompt still leads)
    assert len(beats) >= 2 and all(m["text"].startswith("check the build") and m["from"] == "heartbeat"
                                   for m in beats)


def test_missed_ticks_are_coalesced_and_claims_never_replay(ws):
    (ws.root / "s.yaml").write_text("default:\n" + "".join(f"  - text: ok {i}\n" for i in range(50)))
    ws = configure(ws, model="scripted/s.yaml")
    write_goal(ws, "idle session", name="idle")
    run_once(ws)
    s = list_sessions(ws.sessions)[0]
    h = hb.add(s.dir, "every 60s", "wake up")
    h["next_due"] = time.time() - 60 * 10 + 30  # ten ticks were due while no runner ran
    hb.save(s.dir, h)
    run_once(ws)  # a starting runner delivers one coalesced message
    beats = [m for m in s.events("message") if m["kind"] == "heartbeat"]
    assert len(beats) == 1 and beats[0]["text"].startswith("wake up\n(9 earlier ticks missed")
    assert hb.find(s.dir, h["id"])["next_due"] > time.time()
    # a tick claimed by a runner that died before delivering is not replayed
    h = hb.find(s.dir, h["id"])
    h["next_due"] = time.time() - 1
    hb.save(s.dir, h)
    claimed = hb.claim_due(s.dir)
    assert [c[1] for c in claimed] == [1]
    run_once(ws)
    assert len([m for m in s.events("message") if m["kind"] == "heartbeat"]) == 1


def test_cli_and_kernel_heartbeats(ws):
    (ws.root / "s.yaml").write_text("- code: print(heartbeat(every='1h', prompt='hourly'))\n- text: set\n")
    ws = configure(ws, model="scripted/s.yaml")
    write_goal(ws, "set one", name="k")
    run_once(ws)
    s = list_sessions(ws.sessions)[0]
    assert "'id': 'hb-" in s.events("cell")[0]["output"]

    r = cli(ws, "heartbeat", "k", "*/5 * * * *", "check the build")
    assert r.returncode == 0 and r.stdout.startswith("hb-")
    rows = json.loads(cli(ws, "heartbeat", "list", "k", "--json").stdout)
    assert sorted(x["prompt"] for x in rows) == ["check the build", "hourly"]
    hid = r.stdout.split(":")[0]
    assert "paused" in cli(ws, "heartbeat", "pause", "k", hid).stdout
    assert hb.find(s.dir, hid)["paused"] is True
    assert "active" in cli(ws, "heartbeat", "resume", "k", hid).stdout
    paused = json.loads(cli(ws, "heartbeat", "pause", "k", hid, "--json").stdout)
    assert paused["id"] == hid and paused["paused"] is True and paused["session"] == s.id
    added = json.loads(cli(ws, "heartbeat", "k", "every 1h", "later", "--json").stdout)
    assert added["schedule"] == "every 1h" and added["next_due"] > 0
    gone = json.loads(cli(ws, "heartbeat", "rm", "k", added["id"], "--json").stdout)
    assert gone == {"id": added["id"], "session": s.id, "removed": True}
    assert cli(ws, "heartbeat", "rm", "k", hid).returncode == 0
    assert len(json.loads(cli(ws, "heartbeat", "list", "--json").stdout)) == 1
    bad = cli(ws, "heartbeat", "k", "whenever", "x")
    assert bad.returncode == 1 and "bad heartbeat schedule" in bad.stderr
    assert cli(ws, "heartbeat", "rm", "k", "hb-nope").returncode == 1


def test_cron_day_fields_match_either_when_both_are_set():
    # "the 1st of the month, or any Monday", as cron has it
    s = hb.parse_schedule("0 12 1 * 1")
    t = datetime(2026, 11, 27, 13, 0).timestamp()  # Friday 27th
    assert datetime.fromtimestamp(hb.next_after(s, t)) == datetime(2026, 11, 30, 12, 0)  # Monday 30th
    t2 = datetime(2026, 11, 30, 13, 0).timestamp()
    assert datetime.fromtimestamp(hb.next_after(s, t2)) == datetime(2026, 12, 1, 12, 0)  # Tuesday the 1st
