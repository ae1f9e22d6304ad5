"""Shell hooks a person configures (`hooks:` in primefs.yaml; docs/long-running.md, "Hooks").

Each is a command run by the runner, outside every kernel, with the event as JSON on stdin, in the
workspace folder, killed after its timeout. Only a primefs.yaml the person trusts runs them (`primefs
trust`: a file a kernel could have changed never makes the runner run a command). `before_cell` runs in
the turn, before the cell (the cell waits for it, at most its timeout); the others run beside the work.
A hook that fails or hangs is a warning in the runner's log and the session's history, never a stuck
session.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time

from primefs.store import trust

DEFAULT_TIMEOUT_S = 30.0  # a hook's timeout_s unless it says (settings.check_hooks: at most 3600)


def specs(config: dict, name: str) -> list[dict]:
    """The hooks of `name`, as {command, timeout_s} (the config is checked: check_hooks)."""
    value = (config.get("hooks") or {}).get(name)
    items = value if isinstance(value, list) else [value] if value is not None else []
    return [{"command": i, "timeout_s": DEFAULT_TIMEOUT_S} if isinstance(i, str)
            else {"command": i["command"], "timeout_s": float(i.get("timeout_s", DEFAULT_TIMEOUT_S))} for i in items]


class Hooks:
    def __init__(self, ws, log):
        self.ws, self.log = ws, log

    def fire(self, name: str, session, event: dict | None = None) -> None:
        """Run the hooks of `name` for `session` (in the background, but `before_cell`: now)."""
        hooks = specs(self.ws.config, name)
        if not hooks:
            return
        if not trust.trusted(self.ws, trust.CONFIG):
            self.log(f"warning: hooks.{name}: not run: primefs.yaml changed since you trusted it (primefs trust)")
            return
        payload = json.dumps({"hook": name, "workspace": str(self.ws.root), "session": session.id,
                              "name": session.name, "status": session.status, "event": event},
                             ensure_ascii=False, default=str)
        for hook in hooks:
            if name == "before_cell":
                self._run(name, hook, payload, session)
            else:
                threading.Thread(target=self._run, args=(name, hook, payload, session), daemon=True,
                                 name=f"primefs-hook-{name}").start()

    def _run(self, name: str, hook: dict, payload: str, session) -> None:
        started = time.monotonic()
        problem = None
        try:
            proc = subprocess.Popen(hook["command"], shell=True, cwd=self.ws.root, stdin=subprocess.PIPE,
                                    stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
        except OSError as exc:
            problem = f"cannot start: {exc}"
        else:
            try:
                _, err = proc.communicate(payload.encode(), timeout=hook["timeout_s"])
                if proc.returncode:
                    tail = err.decode(errors="replace").strip().splitlines()[-1:] or [""]
                    problem = f"exit status {proc.returncode}" + (f": {tail[0][:300]}" if tail[0] else "")
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)  # its own group: what it started goes too
                proc.communicate()
                problem = f"killed after its timeout ({hook['timeout_s']:g} s)"
        if problem:
            text = f"hooks.{name}: {hook['command']!r}: {problem} ({time.monotonic() - started:.1f} s)"
            self.log(f"warning: {text}")
            try:
                session.history.append("warning", text=text)
            except OSError:
                pass
