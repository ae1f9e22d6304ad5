"""The local kernel host: forked kernels, one per session for life, identity that cannot be stolen."""
from __future__ import annotations

import os
import threading
import time

import pytest

from primefs.kernels.host import KernelSpec
from primefs.kernels.local import LocalKernelHost, process_state


@pytest.fixture
def host(tmp_path):
    calls: list[tuple[str, str, dict]] = []

    def handler(sid, op, args):
        calls.append((sid, op, args))
        return f"ok from {sid}"

    h = LocalKernelHost(tmp_path / "rt", tmp_path, handler)
    h.calls = calls
    yield h
    h.close()


def call_from(kernel, sock, token, op="send"):
    """Code in `kernel` calls the runner with `token` (its own, or one it stole)."""
    code = (f"from primefs.kernels.inside.rpc import call\ntry:\n    print('reply:', call({str(sock)!r}, {token!r}, {op!r}, "
            "{'to': 'parent', 'text': 'hi'}))\nexcept Exception as e:\n    print('error:', e)")
    return kernel.execute(code, timeout=20).output


def test_kernels_are_separate_processes_forked_from_the_template(host, tmp_path):
    a = host.start(KernelSpec("a", tmp_path))
    b = host.start(KernelSpec("b", tmp_path))
    assert a.pid != b.pid and a.token != b.token
    # a thread and a patched module left in a's kernel are not in b's
    a.execute("import threading, textwrap, time\ntextwrap.dedent = lambda *x, **k: 'patched'\n"
              "threading.Thread(target=time.sleep, args=(60,), name='left-behind', daemon=True).start()", timeout=20)
    out = b.execute("import threading, textwrap\nprint([t.name for t in threading.enumerate()].count('left-behind'), "
                    "textwrap.dedent(' x'))", timeout=20).output
    assert out == "0 x\n"
    assert a.execute("import os; print(os.getpid(), os.getcwd())", timeout=20).output == f"{a.pid} {tmp_path}\n"
    # kernels are children of the template, not of the runner
    assert all(int(open(f"/proc/{k.pid}/stat").read().rsplit(")", 1)[1].split()[1]) != os.getpid() for k in (a, b))


def test_a_kernel_starts_with_the_environment_scrubbed(host, tmp_path, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-secret-in-the-runner")
    host.start(KernelSpec("warm", tmp_path))  # the template is ready
    k = host.start(KernelSpec("s", tmp_path))  # how fast: bench/kernels.py measures it (docs/performance.md)
    out = k.execute("import os\nprint('OPENAI_API_KEY' in os.environ, open('/proc/self/environ', 'rb').read()"
                    ".count(b'sk-secret'))", timeout=20).output
    assert out == "False 0\n"


def test_a_stolen_token_is_refused(host, tmp_path):
    a = host.start(KernelSpec("a", tmp_path))
    b = host.start(KernelSpec("b", tmp_path))
    sock = host.rpc.path
    assert call_from(b, sock, b.token) == "reply: ok from b\n"
    # a has b's token (however it got it): the runner refuses, since the caller is not b's process tree
    assert "error: request refused: the caller is not a process of the kernel" in call_from(a, sock, b.token)
    # a subprocess of b's kernel acts for b
    script = f"from primefs.kernels.inside.rpc import call; print(call({str(sock)!r}, {b.token!r}, 'send', {{}}))"
    out = b.execute(f"import subprocess, sys\nr = subprocess.run([sys.executable, '-c', {script!r}], "
                    "capture_output=True, text=True)\nprint(r.stdout, r.stderr)", timeout=30).output
    assert "ok from b" in out, out
    assert [c[0] for c in host.calls] == ["b", "b"]


def test_tokens_are_never_reused_and_die_with_their_kernel(host, tmp_path):
    old = host.start(KernelSpec("s", tmp_path))
    old_token = old.token
    old.shutdown()
    new = host.start(KernelSpec("s", tmp_path))
    assert new.token != old_token
    assert "error: request refused: unknown or expired kernel token" in call_from(new, host.rpc.path, old_token)
    assert call_from(new, host.rpc.path, new.token) == "reply: ok from s\n"


def test_kernels_are_not_dumpable(host, tmp_path):
    k = host.start(KernelSpec("s", tmp_path))
    out = k.execute("import ctypes\nprint(ctypes.CDLL(None).prctl(3, 0, 0, 0, 0))", timeout=20).output  # PR_GET_DUMPABLE
    assert out == "0\n"


def test_dead_kernels_are_noticed_and_all_die_with_the_host(tmp_path):
    host = LocalKernelHost(tmp_path / "rt", tmp_path, lambda *a: None)
    k1 = host.start(KernelSpec("a", tmp_path))
    k2 = host.start(KernelSpec("b", tmp_path))
    res = k1.execute("import os\nos._exit(3)", timeout=20)
    assert res.died and not k1.alive()
    # a kernel that spawned a subprocess: the whole process group goes
    k2.execute("import subprocess\np = subprocess.Popen(['sleep', '600'])\nprint(p.pid)", timeout=20)
    child = int(k2.execute("print(p.pid)", timeout=20).output)
    server = host._server
    host.close()
    assert server.poll() is not None
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and (process_state(k2.pid) or process_state(child)) not in (None, "Z"):
        time.sleep(0.05)
    assert process_state(k2.pid) in (None, "Z") and process_state(child) in (None, "Z")


def test_snapshot_and_restore_in_a_new_kernel(host, tmp_path):
    k = host.start(KernelSpec("s", tmp_path))
    k.execute("x = 41\nimport math as m\ndef f(a):\n    return a + 1\nclass P:\n    v = 3\n"
              "p = P()\nimport socket\nsock = socket.socket()\nbig = 'x' * 3_000_000\n_private = 1", timeout=20)
    m = k.snapshot(tmp_path / "snap", max_bytes=1_000_000, reason="test")
    saved = {s["name"] for s in m["saved"]}
    skipped = {s["name"]: s["reason"] for s in m["skipped"]}
    assert {"x", "f", "p", "P"} <= saved and "_private" not in saved and "context" not in saved
    assert "cannot pickle" in skipped["sock"] and "size cap" in skipped["big"]
    assert m["modules"] == {"m": "math", "socket": "socket"}
    k.shutdown()
    k2 = host.start(KernelSpec("s", tmp_path))
    r = k2.restore(tmp_path / "snap")
    assert set(r["restored"]) == saved and set(r["modules"]) == {"m", "socket"}
    assert k2.execute("print(x + 1, f(1), p.v, m.pi > 3)", timeout=20).output == "42 2 3 True\n"


def test_many_kernels_start_in_parallel(host, tmp_path):
    kernels, errors = [], []

    def start(i):
        try:
            kernels.append(host.start(KernelSpec(f"s{i}", tmp_path)))
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=start, args=(i,)) for i in range(24)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors and len(kernels) == 24
    assert len({k.pid for k in kernels}) == 24
    assert all(k.execute("print(1 + 1)", timeout=30).output == "2\n" for k in kernels)


def test_a_long_lived_kernel_client_keeps_a_bounded_replay_history(host, tmp_path):
    """jupyter_client remembers the signature of every message it receives (65,536 by default, ~8.5 MB for
    the life of a client): a session's kernel lives for days, so its client keeps the last 1,024."""
    k = host.start(KernelSpec("a", tmp_path))
    for i in range(300):  # ~5 messages a cell
        assert k.execute(f"print({i})", timeout=20).output == f"{i}\n"
    assert 0 < len(k.client.kc.session.digest_history) <= 1024


def test_a_long_lived_kernel_keeps_only_its_last_cells(host, tmp_path):
    """IPython keeps each cell's source (three times), its lines and all it printed for the kernel's life:
    a session's kernel keeps its last cells.KEPT, here 5. A function from an old cell still has its lines,
    for the last cells.DEFINING_KEPT cells that may have made one, here 3."""
    k = host.start(KernelSpec("a", tmp_path))
    run = lambda code: k.execute(code, timeout=20)  # noqa: E731
    run("import linecache, re, primefs.kernels.inside.cells as cells\ncells.KEPT, cells.DEFINING_KEPT = 5, 3")  # 1
    run("def f():\n    raise ValueError('from an old cell')")  # 2
    run("print('same')")  # 3: the same code as 4, so the same name for tracebacks
    run("print('same')")  # 4
    for i in range(4):  # 5-8
        run(f"print({i})")
    same = "print(any(v[2] == [\"print('same')\\n\"] for v in linecache.cache.values()))"
    assert run(same).output == "True\n"  # 9: cell 3 is forgotten, not its lines, which cell 4 still has
    assert run(same).output == "False\n"  # 10: and now cell 4 too
    for i in range(40):  # 11-50; three cells that make functions
        run(f"def g{i}():\n    raise ValueError('g{i}')" if i in (10, 20, 30) else f"print('x' * 10_000, {i})")
    out = run("ip = get_ipython(); h = ip.history_manager\n"  # 51
              "print(sum(bool(s) for s in In), sum(bool(s) for s in h.input_hist_parsed), len(h.outputs), "
              "len(h.db_input_cache), sorted(int(n[2:]) for n in ip.user_ns if re.fullmatch(r'_i\\d+', n)), "
              "sum(\"'x' * 10_000\" in ''.join(v[2]) for v in linecache.cache.values()))").output
    assert out == f"6 6 5 1 {list(range(46, 52))} 6\n"  # cells 46-50 and this one
    assert "----> 2     raise ValueError('g10')" in run("g10()").error
    assert "raise" not in run("f()").error  # the fourth cell back that made a function: no lines
    assert run("print(ip.kernel.session.digest_history_size)").output == "1024\n"  # (signatures it has seen)


def test_a_snapshot_during_a_cell_takes_none_of_its_output(host, tmp_path):
    """A turn's end snapshot and `primefs exec` share one client: neither may read the other's messages
    (the cell once came back empty in CI, its output read and dropped by the snapshot's drain)."""
    from primefs.kernels.session_kernel import SessionKernel
    from primefs.store.settings import Limits

    k = SessionKernel(host, lambda: KernelSpec("s", tmp_path), tmp_path / "snap", Limits.of({"snapshot": "turn"}),
                      record=lambda *a, **kw: None)
    k.ensure()
    for n in range(5):
        k.execute(f"x = {n}", timeout=20)
        started, taken = threading.Event(), []
        cell = threading.Thread(target=lambda: (started.set(), taken.append(k.execute(
            "import time; time.sleep(0.2); print('out'); 'value'", timeout=20))))
        cell.start()
        started.wait()
        time.sleep(0.05)  # the cell is on its way (the snapshot must wait for it, not race it)
        snap = k.snapshot("turn")
        cell.join()
        assert taken[0].output == "out\n'value'\n" and taken[0].error is None, taken[0]
        assert snap is not None and "x" in [v["name"] for v in snap["saved"]], snap
    k.shutdown()


def test_a_stop_interrupts_the_cell_once_it_runs(host, tmp_path):
    """A stop asked for before the kernel began the cell: its interrupt would hit an idle kernel and be
    lost, and the cell would run its whole time. It is sent once the cell runs."""
    k = host.start(KernelSpec("s", tmp_path))
    res = k.execute("import time; time.sleep(30)", timeout=60, stop=lambda: True)
    # cut short, not its 30 s (an interrupt that lands as ipykernel begins the cell, before its code: no error)
    assert res.elapsed_s < 10 and not res.timed_out and not res.died, res
    assert res.error is None or "KeyboardInterrupt" in res.error, res
    assert k.execute("print('alive')", timeout=20).output == "alive\n"
