"""The model loop of one session: model call -> code cells in the kernel -> ... -> a reply without code."""
from __future__ import annotations

import threading
import time
from pathlib import Path

from primefs.errors import BudgetExhausted, PrimefsError, SessionStopping
from primefs.harness.entries import Harness, render_for_prompt
from primefs.kernels import boxes
from primefs.kernels.client import CellResult, cut
from primefs.kernels.host import KernelHost, KernelSpec
from primefs.kernels.local import kernel_env
from primefs.kernels.session_kernel import SessionKernel
from primefs.providers.base import PYTHON_TOOL, ModelError
from primefs.providers.models import key_files
from primefs.runner.approvals import Approvals
from primefs.runner.bell import Bell
from primefs.runner.compaction import maybe_compact
from primefs.runner.gateway import ModelGateway
from primefs.runner.hooks import Hooks
from primefs.runner.loops import LoopWatch
from primefs.runner.postoffice import PostOffice
from primefs.runner.prompt import system_prompt
from primefs.runner.toolbox import ToolBox
from primefs.runner.tree import SessionTree
from primefs.store import livefeed, trust, worktrees
from primefs.store.conversation import code_of_call, fenced_code, rebuild, to_messages
from primefs.store.gitops import lock_file
from primefs.store.history import latest_events, open_turn, since_compaction
from primefs.store.session import Session
from primefs.store.settings import Limits, check_sandbox
from primefs.tools.registry import render_for_prompt as render_tools
from primefs.tracing import spans as tracing


def format_cell(res: CellResult, limits: Limits) -> str:
    text = res.output
    if res.error:
        text = f"{text}\n{res.error}" if text else res.error
    text = cut(text, limits.output_chars)
    notes = []
    if res.timed_out:
        notes.append(f"[the cell ran over {limits.cell_timeout_s} s and was interrupted; "
                     "the kernel is still usable]")
    if res.restarted:
        notes.append(f"[the kernel died and was restarted: variables are gone, except what its last snapshot "
                     f"restored. {res.notice or ''}]".replace(" ]", "]"))
    return "\n".join([*notes, text or "[no output]"])



def kernel_spec(agent: Agent) -> KernelSpec:
    """What a session's kernel is started with: its rooms, sandbox, context, skills, tools."""
    meta, ws, room = agent.session.meta, agent.ws, agent.room
    skill_dirs = [str(agent.tree.dir / s / "harness" / "skills") for s in agent.tree.chain(agent.session.id)]
    skill_dirs.append(str(ws.harness / "skills"))
    room.mkdir(exist_ok=True)
    box = agent.sandbox()
    refused = trust.skills_refused(ws, skill_dirs) if trust.lowers(box) else {}
    return KernelSpec(agent.session.id, ws.root, room, rooms=[room, agent.session.dir / "kernel"],
                      setup={"workspace": str(ws.root), "history": str(agent.session.history.path),
                             "context_paths": list(meta.get("context") or []),
                             "context_data": meta.get("context_data"), "skill_dirs": skill_dirs,
                             "skills_refused": refused,
                             "tools": [t.spec() for t in agent.tools()], "plugins_dir": str(ws.plugins)},
                      resources=dict(meta.get("resources") or {}), sandbox=box,
                      hidden=[*key_files(ws.config), str(lock_file(ws.root))], tree=agent.tree.root(agent.session.id))


class Agent:
    """Live state of a session in the runner: its kernel, its conversation, its turn."""

    def __init__(self, session: Session, *, ws, tree: SessionTree, gateway: ModelGateway, post: PostOffice,
                 host: KernelHost, bell: Bell, toolbox: ToolBox | None = None, hooks: Hooks | None = None,
                 approvals: Approvals | None = None):
        self.session, self.ws, self.tree, self.gateway, self.post, self.bell = session, ws, tree, gateway, post, bell
        self.toolbox, self.hooks, self.approvals = toolbox, hooks, approvals
        meta = session.meta
        self.settings = ws.resolve_model(meta["model"])
        self.tool_mode = self.settings["tool_mode"]
        self.limits = ws.limits(meta.get("limits") or {})
        self.kernel = SessionKernel(host, lambda: kernel_spec(self), session.dir / "kernel", self.limits, self.record,
                                    on_start=self.placed)
        self.had_kernel = False  # a kernel of this session ran before (an earlier runner, or evicted)
        self.kernel_gone: str | None = None  # why its kernel was shut down while the session was idle
        self.retire_kernel: str | None = None  # its kernel must go when this turn ends, and why
        self.warned: set[str] = set()  # harness problems already recorded in this session's history
        self.messages: list[dict] | None = None
        self.seen_ids: set[str] = set()  # ids of the messages of its conversation (since its last compaction)
        self.claimed: set[Path] | None = None  # mail/cur/ files claimed, not acknowledged (None: not listed yet)
        self.turns = 0
        self.done_answer: str | None = None
        self.stop_requested = False
        self.cell_seq = 0  # bumped when a cell ends: requests from an ended cell are void
        self.mail_lock = threading.Lock()  # one reader of this session's mailbox at a time
        self.turn_lock = threading.Lock()  # held while a worker runs its turns (the kernel is in use)
        self.resuming = False  # the next turn goes on with one a runner stop cut off (not a new turn)
        self.pending_notice: str | None = None  # starts the next turn of an autonomous goal
        self.pending_refine: dict | None = None  # refine() asked for during the turn, done at its end
        self.forgotten = False  # let go by the runner (Turns.forget_idle): whoever still holds it asks anew
        self.open_turn: dict | None = None  # its history's last turn has no turn_end (ensure_conversation)

    @property
    def room(self) -> Path:
        """The session's own folder for files: its kernel's working folder, the one place (with its
        kernel/ folder) its sandboxed kernel may write."""
        return self.session.dir / "work"

    def sandbox(self) -> dict | None:
        """The session's sandbox: its own `sandbox:` (from its goal, or inherited), else primefs.yaml's, else
        the default (on, where this machine allows one; said once where it does not)."""
        meta = self.session.meta
        if "sandbox" in meta:  # from its goal (checked and trusted when the goal was taken), or inherited
            box = check_sandbox(meta["sandbox"], f"sessions/{self.session.id}", self.ws.root)
        else:
            box = check_sandbox(self.ws.config.get("sandbox"), "primefs.yaml", self.ws.root)
            if trust.lowers(box) and not trust.trusted(self.ws, trust.CONFIG):
                self.warn(f"sandbox: {trust.untrusted_note(trust.CONFIG, 'its weaker `sandbox:` is')}; "
                          "kernels get the default sandbox")
                box = check_sandbox(None, "primefs.yaml")
        box, notes = boxes.machine_notes(box)
        for note in notes:
            self.warn(f"sandbox: {note}")
        return box

    def warn(self, text: str) -> None:
        """A warning in this session's history, once per runner."""
        if text not in self.warned:
            self.warned.add(text)
            self.record("warning", text=text)

    def run_command(self, command: str, timeout: float) -> tuple[int | None, str]:
        """A shell command as this session's kernel would run it: in its sandbox, in its room, with the
        kernel's environment (end conditions' `command`)."""
        box = self.sandbox()
        self.room.mkdir(exist_ok=True)
        if box is not None:
            box = boxes.box_for(box, self.ws.root, [self.room, self.session.dir / "kernel"], self.room,
                                  hide=[self.ws.runtime.parent], hide_files=key_files(self.ws.config))
        return boxes.run_in_box(box, ["sh", "-c", command], timeout, kernel_env(), cwd=self.room)

    def tools(self) -> list:
        """The tools this session gets (its `tools:` selection); names that match none are said once."""
        if self.toolbox is None:
            return []
        chosen, unknown = self.toolbox.for_session(self.session.meta.get("tools"))
        for name in unknown:
            self.warn(f"tools: {name!r} matches no tool (see `primefs tools`)")
        return chosen

    # -- state ------------------------------------------------------------------------------------
    def record(self, type: str, **fields) -> dict:
        event = self.session.history.append(type, **fields)
        if self.messages is not None:
            self.messages.extend(to_messages(event, self.tool_mode))
        if type == "message":
            self.seen_ids.add(fields["id"])
        return event

    def ensure_conversation(self) -> None:
        """The conversation and the rest the runner keeps of a session, read from its history's end back: a
        history grows for the session's life, and waking a session must not cost its whole length."""
        if self.messages is not None:
            return
        path = self.session.history.path
        tail = since_compaction(path)[1]
        self.messages = rebuild(tail, self.tool_mode)
        self.seen_ids = {e.get("id") for e in tail if e["type"] == "message"}
        latest, start, kernel, ran = [], None, None, False  # latest: the events since the last turn_start
        for e in latest_events(path):
            if start is None:
                latest.append(e)
                start = e if e["type"] == "turn_start" else None
            if kernel is None and not ran:
                kernel = e if e["type"] == "kernel" else None
                # a cell ran after the last kernel event, so that one started a kernel: no need to read back
                # to it (a kernel may live for months)
                ran = e["type"] == "cell" and e.get("code") is not None
            if start is not None and (kernel is not None or ran):
                break
        # each turn_start records its turn's number (a resumed turn goes on with its own)
        self.turns = start["turn"] if start is not None and isinstance(start.get("turn"), int) else 0
        cut_off = open_turn(latest)
        if cut_off is not None:
            self.open_turn = {"turn": cut_off.get("turn"), "elapsed_s": round(latest[0]["ts"] - cut_off["ts"], 4)}
        self.had_kernel = kernel is not None or ran
        if kernel is not None and kernel.get("event") == "stopped" and self.kernel_gone is None:
            self.kernel_gone = kernel.get("reason")  # shut down while idle, by this runner or an earlier one

    def ensure_kernel(self, soon: bool = False) -> None:
        """The session's kernel running (`soon`: a first one may start beside the model call: kernel.ready()
        before a cell)."""
        self.kernel.ready()
        if self.kernel.running():
            return
        why = None
        if self.kernel.handle is not None and self.kernel.handle.lost:
            why = self.kernel.handle.lost  # e.g. its node was lost while the session was idle
        elif self.kernel_gone:
            why = self.kernel_gone
        elif self.kernel.handle is not None:  # ours, and gone without the runner's doing
            why = "it ended while the session was idle (killed from outside, or it crashed)"
        elif self.had_kernel:
            why = "the runner restarted"
        if why is None and soon:
            self.kernel.start_soon()
            self.had_kernel, self.kernel_gone = True, None
            return
        notice = self.kernel.ensure(why)
        self.had_kernel, self.kernel_gone = True, None
        if notice:
            self.record("notice", text=notice)

    def placed(self, node: str) -> None:
        """session.yaml `node`: where the session's kernel runs (`primefs status`); absent while local."""
        if node != (self.session.meta.get("node") or "local"):
            self.session.update(node=node)

    def cell_ended(self) -> None:
        with self.bell.cond:
            self.cell_seq += 1
            self.bell.cond.notify_all()  # requests still waiting for that cell give up

    def system_prompt(self) -> str:
        """Rebuilt at every turn boundary, so harness changes (by agents or by hand) apply next turn."""
        meta = self.session.meta
        chain = self.tree.chain(self.session.id)
        harness = Harness(self.ws)
        role = None
        if meta.get("agent"):
            try:
                spec = harness.get("agent", meta["agent"], sessions=chain)
            except PrimefsError as exc:
                spec, role = None, f"(the subagent spec {meta['agent']!r} is broken: {exc})"
            if spec is not None:
                role = spec.body
        role = "\n\n".join(x for x in (role, worktrees.note({**meta, "id": self.session.id})) if x) or None
        entries = harness.list(sessions=chain)
        for e in entries:  # broken harness files: skipped, and said once in this session's log
            if e.problem:
                self.warn(f"harness file skipped: {e.problem}")
        return system_prompt(root=self.ws.root, tool_mode=self.tool_mode, limits=self.limits,
                             context_paths=list(meta.get("context") or []), context_data=meta.get("context_data"),
                             role=role, harness=render_for_prompt(entries, self.limits.memory_prompt_chars),
                             tools=render_tools(self.tools()))

    def complete(self, messages: list[dict], tools=None, *, purpose: str, settings: dict | None = None):
        return self.gateway.complete(self, messages, tools, purpose=purpose, settings=settings)

    # -- one turn ---------------------------------------------------------------------------------
    def run_turn(self) -> str:
        """Run until a reply without code, done(), an error or the step limit. Returns the outcome."""
        self.ensure_conversation()
        self.ensure_kernel(soon=True)
        try:
            return self._turn()
        finally:
            try:
                self.kernel.ready()  # a turn that ran no cell: its kernel started all the same
            except Exception:  # noqa: BLE001 - the next turn starts it again, and says why if it fails
                pass

    def _turn(self) -> str:
        self.done_answer = None
        system = self.system_prompt()
        tools = [PYTHON_TOOL] if self.tool_mode == "native" else None
        max_steps = self.limits.max_steps_per_turn
        self.loops = LoopWatch(self.limits.loop_repeat, self.limits.loop_window)
        for step in range(1, max_steps + 1):
            if self.stop_requested:
                return self.stopped()
            if self.bell.stopping:  # Ctrl-C / primefs down: resumed (with a notice) by the next runner
                return "interrupted"
            self.post.take_mail(self)  # mail that arrived meanwhile is shown before the next call
            livefeed.publish(self.session.id, {"type": "step", "ts": time.time(), "step": step, "of": max_steps,
                                               "model": self.settings["model"]})  # `run -v`; not history
            try:
                maybe_compact(self, system)
                reply = self.complete([{"role": "system", "content": system}, *self.messages], tools, purpose="turn")
            except ModelError as exc:
                self.record("error", error=str(exc))
                self.session.set_status("failed", error=str(exc), stop_reason="error")
                return "failed"
            except BudgetExhausted as exc:
                self.record("budget", reason=exc.reason, detail=str(exc))
                self.session.set_status("stopped", stop_reason=exc.reason, error=str(exc))
                return "stopped"
            except SessionStopping:
                return self.stopped() if self.stop_requested else "interrupted"
            if self.bell.stopping:
                return "interrupted"  # the reply is in no event yet: the next runner asks again
            outcome = self._step(reply)
            if outcome:
                return outcome
        note = f"max_steps_per_turn ({max_steps}) reached without a final answer"
        self.record("error", error=note)
        self.session.set_status("idle", stop_reason="max_steps", error=note)
        return "max_steps"

    def _step(self, reply) -> str | None:
        """Record the reply and run its code. Returns the turn's outcome if the turn ends here."""
        calls, cells = [], []
        if self.tool_mode == "native":
            for c in reply.tool_calls:
                calls.append({"id": c.id, "name": c.name, "arguments": c.arguments})
                cells.append((c.id,) + code_of_call(c.name, c.arguments))
        else:
            cells = [(None, code, None) for code in fenced_code(reply.text)]
        asked = self.record("assistant", text=reply.text, calls=calls)
        if not cells:
            return self.finish(reply.text, "idle")
        self.kernel.ready()
        with self.kernel.lock:  # the whole step's cells (`primefs exec` runs between two steps)
            ran = self._run_cells(asked, cells)
        if self.done_answer is not None:
            return self.finish(self.done_answer, "done")
        if self.stop_requested:
            return self.stopped()
        return self.loops.after_step(self, ran)  # a turn going round in circles: told once, then stopped

    def _run_cells(self, asked: dict, cells: list) -> list[dict]:
        """The cells of the reply `asked` (its assistant event), in order; their `cell` events."""
        limit = self.limits.output_chars
        ran = []
        for k, (call_id, code, error) in enumerate(cells):
            if not error and self.stop_requested:  # the rest of a reply a stop came during
                error = "not run: the session was stopped"
            if not error and self.approvals is not None:
                error = self.approvals.check_cell(self, code)  # None once a person said yes (if one must)
            if error:
                ran.append(self.record("cell", call_id=call_id, code=code, error=error, shown=f"[error] {error}"))
                continue
            if self.hooks is not None:
                self.hooks.fire("before_cell", self.session, {"call_id": call_id, "code": code})
            with tracing.cell(self.session, asked, k, call_id) as span:
                # the cell's requests (wait, recv) are void from the moment it is interrupted
                res = self.kernel.execute(code, timeout=self.limits.cell_timeout_s, on_timeout=self.cell_ended,
                                          stop=lambda: self.stop_requested)
                self.cell_ended()
                ran.append(self.record("cell", call_id=call_id, code=code, output=cut(res.output, limit),
                                       error=cut(res.error, limit) if res.error else None, timed_out=res.timed_out,
                                       restarted=res.restarted, elapsed_s=res.elapsed_s,
                                       shown=format_cell(res, self.limits)))
                span.done(ran[-1])
        return ran

    def stopped(self) -> str:
        self.session.set_status("stopped", stop_reason="stopped")
        return "stopped"

    def finish(self, answer: str, status: str) -> str:
        self.session.write_result(answer)
        self.record("result", text=answer)
        self.session.set_status(status, stop_reason="done" if status == "done" else "answered", error=None)
        return status
