"""Heartbeats: re-enter a session on an interval (`every 10m`) or a cron expression (5 fields).

Each heartbeat is a file `sessions/<id>/heartbeats/<hb-id>.yaml` ({id, schedule, prompt, paused,
next_due, last_fired}), so it survives restarts. A due tick is claimed (next_due moved on, written
atomically) before its mail (`kind: heartbeat`) is delivered: a crash never replays a tick. Ticks
missed while no runner ran are coalesced into one message.
"""
from __future__ import annotations

import math
import re
import secrets
import time
from datetime import datetime, timedelta
from pathlib import Path

from primefs.errors import PrimefsError
from primefs.store.frontmatter import dump_yaml, load_yaml
from primefs.store.fsutil import ring, write_atomic
from primefs.store.summary import stat_key

UNITS = {"s": 1, "sec": 1, "second": 1, "seconds": 1, "m": 60, "min": 60, "minute": 60, "minutes": 60,
         "h": 3600, "hour": 3600, "hours": 3600, "d": 86400, "day": 86400, "days": 86400}
INTERVAL = re.compile(r"^(?:every\s+)?(\d+(?:\.\d+)?)\s*([a-z]+)$")
DEFAULT_PROMPT = "Heartbeat: check on your goal and continue if there is work to do."
CRON_RANGES = ((0, 59), (0, 23), (1, 31), (1, 12), (0, 6))  # minute hour day-of-month month day-of-week


def parse_schedule(text: str) -> dict:
    """'every 10m' / '30s' / '2 hours' -> {"every": seconds}; '*/5 * * * *' -> {"cron": fields}."""
    s = " ".join(str(text).strip().lower().split())
    m = INTERVAL.match(s)
    if m and m.group(2) in UNITS:
        seconds = float(m.group(1)) * UNITS[m.group(2)]
        if seconds < 1:
            raise PrimefsError(f"heartbeat interval {text!r} is under one second")
        return {"every": seconds}
    fields = s.split(" ")
    if len(fields) == 5:
        cron = [_cron_field(f, lo, hi, text) for f, (lo, hi) in zip(fields, CRON_RANGES)]
        if not _ever(cron):
            raise PrimefsError(f"heartbeat schedule {text!r} never fires (no month has such a day)")
        return {"cron": cron}
    raise PrimefsError(f"bad heartbeat schedule {text!r}: use 'every 10m' (s, m, h, d) or 5 cron fields "
                       "like '*/15 9-17 * * 1-5'")


MONTH_DAYS = (31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)  # February 29 comes every four years


def _ever(cron: list[list[int]]) -> bool:
    """Whether a cron schedule fires at all (`0 0 31 2 *` does not): only days of the month alone can
    miss; with the day of the week restricted too, either one fires (as in cron)."""
    _, _, dom, month, dow = cron
    if len(dom) == 31 or len(dow) < 7:
        return True
    return any(d <= MONTH_DAYS[m - 1] for m in month for d in dom)


def _cron_field(field: str, lo: int, hi: int, text: str) -> list[int]:
    values: set[int] = set()
    for part in field.split(","):
        body, _, step = part.partition("/")
        try:
            step_n = int(step) if step else 1
            if body == "*":
                a, b = lo, hi
            elif "-" in body:
                a, b = (int(x) for x in body.split("-", 1))
            else:
                a = b = int(body)
        except ValueError:
            raise PrimefsError(f"bad cron field {field!r} in {text!r}") from None
        if not (lo <= a <= b <= hi) or step_n < 1:
            raise PrimefsError(f"cron field {field!r} in {text!r} is outside {lo}-{hi}")
        values.update(range(a, b + 1, step_n))
    return sorted(values)


def next_after(schedule: dict, t: float) -> float:
    """The first time strictly after `t` (epoch seconds, local time for cron) that the schedule fires."""
    if "every" in schedule:
        return t + schedule["every"]
    minute, hour, dom, month, dow = (set(f) for f in schedule["cron"])
    # as in cron: when both day fields are restricted, a day matching either one fires
    dom_any, dow_any = len(dom) == 31, len(dow) == 7

    def day_ok(d: datetime) -> bool:
        in_dom, in_dow = d.day in dom, (d.weekday() + 1) % 7 in dow
        if dom_any or dow_any:
            return in_dom and in_dow
        return in_dom or in_dow

    d = datetime.fromtimestamp(t).replace(second=0, microsecond=0) + timedelta(minutes=1)
    for _ in range(366 * 24 * 60):
        if d.month not in month or not day_ok(d):
            d = (d + timedelta(days=1)).replace(hour=0, minute=0)
            continue
        if d.hour not in hour:
            d = (d + timedelta(hours=1)).replace(minute=0)
            continue
        if d.minute in minute:
            return d.timestamp()
        d += timedelta(minutes=1)
    raise PrimefsError("the cron expression never fires")


def from_spec(spec) -> tuple[str, str]:
    """A goal's `heartbeat:` value -> (schedule, prompt). 'every 10m', or {every|cron: ..., prompt: ...}."""
    if isinstance(spec, dict):
        if spec.get("every"):
            every = str(spec["every"])
            schedule = every if every.startswith("every") else f"every {every}"
        else:
            schedule = str(spec.get("cron") or spec.get("schedule") or "")
        prompt = str(spec.get("prompt") or DEFAULT_PROMPT)
    else:
        schedule, prompt = str(spec), DEFAULT_PROMPT
    parse_schedule(schedule)
    return schedule, prompt


def folder(session_dir: Path) -> Path:
    return Path(session_dir) / "heartbeats"


def add(session_dir: Path, schedule_text: str, prompt: str, now: float | None = None) -> dict:
    schedule = parse_schedule(schedule_text)
    if not str(prompt).strip():
        raise PrimefsError("a heartbeat needs a prompt (the message it delivers)")
    now = time.time() if now is None else now
    hb = {"id": f"hb-{secrets.token_hex(3)}", "schedule": str(schedule_text), "prompt": str(prompt), "paused": False,
          "next_due": next_after(schedule, now), "last_fired": None, "created": now}
    folder(session_dir).mkdir(exist_ok=True)
    save(session_dir, hb)
    return hb


def save(session_dir: Path, hb: dict) -> None:
    write_atomic(folder(session_dir) / f"{hb['id']}.yaml", dump_yaml(hb, safe=True))
    ring(session_dir)


def load_all(session_dir: Path, problems: list[str] | None = None) -> list[dict]:
    """The session's usable heartbeats; a broken file never stops the others (its problem is added
    to `problems`, naming the file)."""
    out = []
    for p in sorted(folder(session_dir).glob("hb-*.yaml")):
        label = f"sessions/{Path(session_dir).name}/heartbeats/{p.name}"
        try:
            out.append(_load(p, label))
        except PrimefsError as exc:
            if problems is not None:
                problems.append(str(exc))
    return out


# path -> (the file's stat, its values or its problem). A runner asks for the heartbeats of each session that has
# them up to four times a second: parsed each time (0.5 ms a file here, against 0.02 ms from here), 500 sessions
# with a heartbeat would take a core. A file is parsed again when it changes (a save is a new file).
_parsed: dict[str, tuple] = {}
MAX_PARSED = 10_000


def _load(p: Path, label: str) -> dict:
    key = stat_key(p)
    if key is None:  # (a dangling link): said as the reader says it
        return check(load_yaml(p, safe=True, label=label), label)
    hit = _parsed.get(str(p))
    if hit is None or hit[0] != key:
        try:
            hit = (key, check(load_yaml(p, safe=True, label=label), label))
        except PrimefsError as exc:
            hit = (key, exc)
        if len(_parsed) >= MAX_PARSED:
            _parsed.clear()
        _parsed[str(p)] = hit
    if isinstance(hit[1], PrimefsError):
        raise PrimefsError(str(hit[1]))
    return dict(hit[1])  # (the caller's to change: claim_due, pause)


def check(hb, where: str) -> dict:
    """A heartbeat file's values, as the runner needs them."""
    if not isinstance(hb, dict):
        raise PrimefsError(f"{where}: not a mapping")
    for key in ("id", "schedule", "prompt"):
        if not isinstance(hb.get(key), str):
            raise PrimefsError(f"{where}: {key} must be text")
    for key in ("next_due",) + (("last_fired",) if hb.get("last_fired") is not None else ()):
        v = hb.get(key)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise PrimefsError(f"{where}: {key} must be a time (seconds since 1970)")
    if not isinstance(hb.get("paused", False), bool):
        raise PrimefsError(f"{where}: paused must be true or false")
    try:
        parse_schedule(hb["schedule"])
    except PrimefsError as exc:
        raise PrimefsError(f"{where}: {exc}") from None
    return hb


def find(session_dir: Path, hb_id: str) -> dict:
    for hb in load_all(session_dir):
        if hb["id"] == hb_id:
            return hb
    raise PrimefsError(f"no heartbeat {hb_id!r} in {session_dir.name} (see `primefs heartbeat list`)")


def claim_due(session_dir: Path, now: float | None = None, problems: list[str] | None = None
              ) -> list[tuple[dict, int]]:
    """Due heartbeats of a session, each with how many ticks it covers; claimed (saved) before returning."""
    now = time.time() if now is None else now
    out = []
    for hb in load_all(session_dir, problems):
        if hb.get("paused") or hb["next_due"] > now:
            continue
        schedule = parse_schedule(hb["schedule"])
        ticks, nxt = 0, hb["next_due"]
        while nxt <= now and ticks < 100000:
            ticks += 1
            nxt = next_after(schedule, nxt)
        if nxt <= now:  # absurdly many missed ticks: jump to the future
            nxt = next_after(schedule, now)
        hb["next_due"], hb["last_fired"] = nxt, now
        save(session_dir, hb)  # claimed before delivery: a crash now loses this tick, never repeats it
        out.append((hb, ticks))
    return out


def message_text(hb: dict, ticks: int) -> str:
    missed = f"\n({ticks - 1} earlier tick{'s' if ticks > 2 else ''} missed while no runner ran: coalesced)" \
        if ticks > 1 else ""
    return f"{hb['prompt']}{missed}"
