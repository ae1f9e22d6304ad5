"""A turn going round in circles: caught before it burns its budget (docs/long-running.md, "Loops").

Two signs, counted over the cells of one turn:
- the same cell (its code, whitespace aside) or the same error (its last line) `loop_repeat` times in a row;
- `loop_window` cells in a row without new output: each one's output empty, or the same as an output
  already seen among the cells of the window.
The first time a sign shows, the model is told (a `notice`, naming what repeated); if it goes on for
`AFTER_NOTICE` more cells the turn stops (`stop_reason: loop`, the error saying what repeated). A cell
that breaks the pattern starts the count again. A limit of 0 turns its sign off.
"""
from __future__ import annotations

import re
from collections import deque
from dataclasses import dataclass

AFTER_NOTICE = 2  # cells the model may take after the notice before the turn is stopped


@dataclass
class Verdict:
    stop: bool  # False: a notice for the model; True: the turn ends
    text: str


def _code_key(code: str | None) -> str:
    return re.sub(r"\s+", " ", code or "").strip()


def _error_key(error: str | None) -> str:
    lines = [line for line in (error or "").strip().splitlines() if line.strip()]
    return lines[-1].strip() if lines else ""


def _short(text: str, n: int = 120) -> str:
    text = text.replace("\n", " ")
    return text if len(text) <= n else text[: n - 3] + "..."


class LoopWatch:
    def __init__(self, repeat: int, window: int):
        self.repeat, self.window = repeat, window
        self.last_code = self.last_error = ""
        self.code_run = self.error_run = self.stale_run = 0
        self.outputs: deque[str] = deque(maxlen=max(window, 1))
        self.noticed: str | None = None  # the sign the model was told of
        self.after = 0  # cells since that notice, the sign still showing

    def cell(self, code: str | None, output: str | None, error: str | None) -> Verdict | None:
        """Count one cell; a Verdict when a sign shows (a notice the first time, then a stop)."""
        key, err = _code_key(code), _error_key(error)
        self.code_run = self.code_run + 1 if key and key == self.last_code else (1 if key else 0)
        self.error_run = self.error_run + 1 if err and err == self.last_error else (1 if err else 0)
        self.last_code, self.last_error = key, err
        seen = ((output or "") + (error or "")).strip()
        stale = not seen or seen in self.outputs
        self.stale_run = self.stale_run + 1 if stale else 0
        self.outputs.append(seen)
        sign = self._sign(key, err)
        if sign is None:
            self.noticed, self.after = None, 0
            return None
        if self.noticed is None:
            self.noticed, self.after = sign, 0
            return Verdict(False, f"[primefs: {sign}. Change approach: what you are doing is not making progress; "
                                  f"if it goes on for {AFTER_NOTICE} more cells this turn is stopped.]")
        self.after += 1
        if self.after >= AFTER_NOTICE:
            return Verdict(True, f"stopped as a loop: {sign}")
        return None

    def after_step(self, agent, cells: list[dict]) -> str | None:
        """The cells of one step counted: a notice recorded for the model, or the turn ended (`"loop"`,
        the outcome). None: go on."""
        for c in cells:
            verdict = self.cell(c.get("code"), c.get("output"), c.get("error"))
            if verdict is not None and verdict.stop:
                agent.record("error", error=verdict.text)
                agent.session.set_status("idle", stop_reason="loop", error=verdict.text)
                return "loop"
            if verdict is not None:
                agent.record("notice", text=verdict.text)
        return None

    def _sign(self, key: str, err: str) -> str | None:
        if self.repeat and self.code_run >= self.repeat:
            return f"the same cell ran {self.code_run} times in a row ({_short(key)!r})"
        if self.repeat and self.error_run >= self.repeat:
            return f"the same error came {self.error_run} times in a row ({_short(err)!r})"
        if self.window and self.stale_run >= self.window:
            return f"{self.stale_run} cells in a row gave no new output"
        return None
