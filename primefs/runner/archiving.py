"""The runner's part in archives (index/archive.py): trees a crash left half archived put right at
start-up, and `primefs archive` done here while the runner runs (it knows which sessions are in use)."""
from __future__ import annotations

from primefs.index import archive


class Archiving:
    def __init__(self, ws, scheduler, turns, alive, log):
        self.ws, self.scheduler, self.turns, self.alive, self.log = ws, scheduler, turns, alive, log

    def recover(self) -> None:
        for root in archive.recover(self.ws):
            self.log(f"archive of {root}: finished or undone after a crash")
        for path in archive.conflicts(self.ws):
            self.log(f"kept aside by an archive roll-back (its place was taken): {path}")

    def serve(self, request: dict) -> dict:
        """An archive request (runner/liverequests.py). The turn commits of a tree land before it leaves;
        `alive` freezes and forgets what moves."""
        if self.turns.committer is not None:
            self.turns.committer.flush()
        return archive.serve(self.ws, request, busy=self.in_use, freeze=self.alive.freeze, done=self.alive.archived)

    def in_use(self, sid: str) -> bool:
        """Not to be archived now: queued, running or awake. A finished session's kernel still parked goes
        first (a live kernel could change its room while the archive reads it)."""
        if self.scheduler.busy(sid) or sid in self.alive.awake:
            return True
        agent = self.turns.agents.get(sid)
        return agent is not None and agent.kernel.running() and not self.turns.kernels.evict(agent, "its session was archived")
