"""The sandbox: kernels with no network, writes only in their room, memory, CPU, process and file caps over
their whole process tree.

Each limit is proved from inside a real forked kernel; then end to end through the runner (on by default,
turned off only by a goal the person trusts), and once as a normal user when the tests run as root. The
attacks of one session on another and on the runner are in test_isolation.py."""
from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sysconfig
import textwrap
from pathlib import Path

import pytest
from conftest import configure, run_once, wait_for

from primefs.store import trust
from primefs.errors import PrimefsError
from primefs.store.goals import write_goal
from primefs.kernels.host import KernelSpec
from primefs.kernels.local import LocalKernelHost
from primefs.store.session import list_sessions
from primefs.store.settings import check_sandbox

LIMITS = {"memory_mb": 1024, "cpu_s": 3, "processes": 40, "open_files": 64}


@pytest.fixture(scope="module")
def boxed(tmp_path_factory):
    """One sandboxed kernel (and a listening socket outside it) for the limit tests."""
    root = tmp_path_factory.mktemp("sandbox")
    ws = root / "ws"
    room = ws / "sessions" / "s" / "work"
    room.mkdir(parents=True)
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    host = LocalKernelHost(root / "rt", ws, lambda *a: "ok")
    spec = KernelSpec("s", ws, room, rooms=[room, room.parent / "kernel"], sandbox=check_sandbox(LIMITS, "test"))
    kernel = host.start(spec)
    kernel.ws, kernel.room, kernel.port, kernel.host, kernel.spec = ws, room, listener.getsockname()[1], host, spec
    yield kernel
    host.close()
    listener.close()


def run(kernel, code: str, timeout: float = 30):
    r = kernel.execute(textwrap.dedent(code), timeout=timeout)
    return r.output + (r.error or "")


def test_no_network(boxed):
    out = run(boxed, f"""
        import socket
        try:
            socket.create_connection(("127.0.0.1", {boxed.port}), timeout=3)
            print("connected")
        except OSError as e:
            print("refused:", e)""")
    assert out.startswith("refused: [Errno 101] Network is unreachable")


def test_writes_only_inside_its_room(boxed):
    """Its room and a private /tmp take writes; the rest of the workspace and the machine do not."""
    out = run(boxed, f"""
        import tempfile
        for path in ("/tmp/escape.txt", "/root/escape.txt", "{boxed.ws}/escape.txt", "../session-file.txt",
                     "inside.txt", "{boxed.room.parent}/kernel/k.txt", tempfile.gettempdir() + "/t.txt"):
            try:
                open(path, "w").write("x")
                print("wrote", path)
            except OSError as e:
                print("refused", path, e.strerror)""")
    for refused in ("/root/escape.txt", f"{boxed.ws}/escape.txt", "../session-file.txt"):
        assert f"refused {refused} Read-only file system" in out, out
    assert "wrote inside.txt" in out and "wrote /tmp/t.txt" in out and "wrote /tmp/escape.txt" in out
    assert not Path("/tmp/escape.txt").exists() and (boxed.room / "inside.txt").read_text() == "x"
    assert not (boxed.ws / "escape.txt").exists() and (boxed.room.parent / "kernel" / "k.txt").exists()


def test_the_read_only_mounts_cannot_be_undone(boxed):
    out = run(boxed, """
        import ctypes
        attr = (ctypes.c_uint64 * 4)(0, 1, 0, 0)  # mount_setattr: clear MOUNT_ATTR_RDONLY on / recursively
        r = ctypes.CDLL(None, use_errno=True).syscall(442, -100, b"/", 0x8000, attr, 32)
        try:
            open("/root/escape2.txt", "w")
            print("escaped")
        except OSError as e:
            print(r, e.strerror)""")
    assert out == "-1 Read-only file system\n"


def test_a_sandboxed_kernel_is_not_dumpable_and_never_root(boxed):
    out = run(boxed, """
        import ctypes, os
        status = dict(line.split(":", 1) for line in open("/proc/self/status").read().splitlines())
        print(ctypes.CDLL(None).prctl(3, 0, 0, 0, 0), status["CapEff"].strip(), status["NoNewPrivs"].strip())""")
    assert out == "0 0000000000000000 1\n"
    run(boxed, "open('mine.txt', 'w').write('x')")
    assert (boxed.room / "mine.txt").stat().st_uid == (65534 if os.getuid() == 0 else os.getuid())


def test_memory_hog_gets_a_memory_error(boxed):
    out = run(boxed, """
        try:
            hog = bytearray(2 * 1024**3)
            print("allocated")
        except MemoryError:
            print("MemoryError")""")
    assert out == "MemoryError\n"


def test_open_files_and_processes_are_capped(boxed):
    out = run(boxed, """
        import subprocess
        files, procs = [], []
        try:
            for i in range(200):
                files.append(open("/dev/null"))
        except OSError as e:
            print("files:", e.strerror)
        for f in files:
            f.close()
        try:
            for i in range(100):
                procs.append(subprocess.Popen(["sleep", "3"]))
        except OSError as e:
            print("processes:", len(procs) < 40, e.strerror)""")
    assert "files: Too many open files" in out
    assert "processes: True Resource temporarily unavailable" in out


def test_cpu_cap_ends_the_kernel_and_the_host_goes_on(boxed):
    r = boxed.execute("while True:\n    pass", timeout=30)
    assert r.died and not boxed.alive()
    again = boxed.host.start(boxed.spec)
    assert again.execute("print(6 * 7)", timeout=30).output == "42\n"


def test_limits_count_the_whole_tree_where_a_cgroup_can_be_made(boxed):
    """Processes a kernel starts share its memory cap (a cgroup): four children of 400 MB each in a
    1 GB tree cannot all live."""
    from dataclasses import replace

    # a kernel of its own (the fixture's may have been ended by the CPU cap), with CPU seconds to spare
    k = boxed.host.start(replace(boxed.spec, sandbox={**boxed.spec.sandbox, "cpu_s": 120}))
    if k.cgroup is None:
        pytest.skip("no writable cgroup here: limits are per process (the runner says so)")
    out = run(k, """
        import subprocess, sys
        hog = "b = bytearray(400 * 1024 * 1024); b[::4096] = b'x' * len(b[::4096]); import time; time.sleep(5)"
        ps = [subprocess.Popen([sys.executable, "-c", hog]) for _ in range(4)]
        print(min(p.wait() for p in ps) < 0)""", timeout=60)
    assert out == "True\n"


def test_a_kernel_that_stops_takes_everything_it_started(boxed):
    k = boxed.host.start(boxed.spec)
    assert run(k, """
        import subprocess
        subprocess.Popen(["setsid", "sleep", "600"])
        _ = subprocess.Popen(["sh", "-c", "sleep 601 &"])""") == ""  # (an error would say why no sleep came)
    wait_for(lambda: len(_sleepers({"600", "601"})) == 2, 30, "the sleeps")  # (once 10 s, on a loaded machine)
    k.shutdown()
    wait_for(lambda: not _sleepers({"600", "601"}), 30, "every process of the kernel gone")


def test_a_kernel_that_stops_leaves_no_cgroup(boxed):
    """A killed process leaves its cgroup only as it exits: a kernel's cgroup removed at once failed, and
    stayed for good (~57,000 of them on this machine after days of tests, until no memory cgroup could be made).
    Its processes busy to the end, a stopped kernel leaves no cgroup folder behind."""
    k = boxed.host.start(boxed.spec)
    if k.cgroup is None:
        pytest.skip("no writable cgroup here: limits are per process (the runner says so)")
    folders = list(k.cgroup.folders)
    run(k, """
        import subprocess
        for _ in range(3):
            subprocess.Popen(["sh", "-c", "while :; do :; done"])""")
    wait_for(lambda: len(k.cgroup.pids()) >= 4, 10, "the kernel's busy processes")
    k.shutdown()
    assert [f for f in folders if os.path.exists(f)] == []


def test_a_closed_host_leaves_no_cgroup_folder(boxed, tmp_path):
    """Each runner's kernels share a group folder (one a workspace): it goes when the runner's host closes."""
    host = LocalKernelHost(tmp_path / "rt-closing", boxed.ws, lambda *a: "ok")
    k = host.start(boxed.spec)
    if k.cgroup is None:
        host.close()
        pytest.skip("no writable cgroup here: limits are per process (the runner says so)")
    groups = [os.path.dirname(f) for f in k.cgroup.folders]
    host.close()
    assert [g for g in groups if os.path.exists(g)] == []


def _sleepers(args: set[str]) -> list[int]:
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmd = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")
        except OSError:
            continue
        if cmd[:1] == [b"sleep"] and len(cmd) > 1 and cmd[1].decode() in args:
            found.append(int(pid))
    return found


def test_sandbox_is_on_by_default_and_off_only_from_a_trusted_goal(ws):
    (ws.root / "s.yaml").write_text(textwrap.dedent("""\
        - code: |
            import socket
            for what, f in (("net", lambda: socket.create_connection(("127.0.0.1", 9), timeout=2)),
                            ("write", lambda: open("/usr/primefs-sandbox-e2e.txt", "w"))):
                try:
                    f()
                    print(what, "allowed")
                except OSError as e:
                    print(what, "refused")
        - text: done
        """))
    ws = configure(ws, model="scripted/s.yaml")  # no `sandbox:` at all
    write_goal(ws, "boxed", name="boxed")
    (ws.goals / "free.md").write_text("---\nsandbox: off\n---\nfree\n")
    (ws.goals / "planted.md").write_text("---\nsandbox: false\n---\nplanted\n")
    trust.trust(ws, ["goals/free.md"])  # the person wrote this one; nobody trusted planted.md
    lines = run_once(ws)
    by = {s.name: s for s in list_sessions(ws.sessions)}
    assert by["boxed"].events("cell")[0]["output"] == "net refused\nwrite refused\n"
    free = by["free"].events("cell")[0]["output"]
    assert "write allowed" in free and by["free"].meta["sandbox"] is False
    assert "planted" not in by
    assert any("goals/planted.md" in ln and "primefs trust goals/planted.md" in ln for ln in lines), lines
    Path("/usr/primefs-sandbox-e2e.txt").unlink(missing_ok=True)


def test_sandbox_settings_are_checked(tmp_path):
    assert check_sandbox("off", "t") is None and check_sandbox(False, "t") is None
    assert check_sandbox("on", "t")["memory_mb"] == 4096 and check_sandbox(None, "t")["default"] is True
    assert check_sandbox({"write": ["."]}, "t", tmp_path)["write"] == [str(tmp_path)]
    with pytest.raises(PrimefsError, match="sandbox.write: 'nowhere' is not a folder"):
        check_sandbox({"write": ["nowhere"]}, "t", tmp_path)
    with pytest.raises(PrimefsError, match="unknown sandbox key 'netwrok'"):
        check_sandbox({"netwrok": True}, "t")


NOBODY_CHECKS = '''
import os, socket, subprocess
print("uid", os.getuid(), "pid", os.getpid())
try:
    socket.create_connection(("127.0.0.1", 9), timeout=2)
except OSError as e:
    print("net", e.strerror)
for path in ("../escape.txt", "/usr/escape.txt"):
    try:
        open(path, "w")
    except OSError as e:
        print("write", e.strerror)
try:
    os.kill(RUNNER, 0)  # the runner: in another pid namespace
except OSError as e:
    print("kill", e.strerror)
ps = []
try:
    for i in range(100):
        ps.append(subprocess.Popen(["sleep", "2"]))
except OSError as e:
    print("processes", e.strerror)
'''


@pytest.mark.skipif(os.getuid() != 0 or not shutil.which("setpriv"), reason="needs root to become another user")
def test_the_sandbox_works_for_a_normal_user(as_nobody):
    """The same boundary when the runner runs as a normal user (unprivileged user namespaces)."""
    out = as_nobody(f"""
        import os
        from pathlib import Path
        from primefs.kernels.host import KernelSpec
        from primefs.kernels.local import LocalKernelHost
        from primefs.store.settings import check_sandbox
        ws = Path("ws").resolve()
        room = ws / "sessions" / "u" / "work"
        room.mkdir(parents=True)
        host = LocalKernelHost(Path("rt"), ws, lambda *a: "ok")
        k = host.start(KernelSpec("u", ws, room, rooms=[room], sandbox=check_sandbox({LIMITS!r}, "t")))
        r = k.execute({NOBODY_CHECKS!r}.replace("RUNNER", str(os.getpid())), timeout=30)
        print(r.output, r.error)
        host.close()
        """)
    assert "uid 65534 pid 1" in out, out
    assert "net Network is unreachable" in out and out.count("write Read-only file system") == 2, out
    assert "kill No such process" in out and "processes Resource temporarily unavailable" in out, out


@pytest.fixture
def as_nobody():
    """Run a Python script as user nobody (uid 65534) in a folder of its own: the runner as a normal user."""
    import tempfile

    python = shutil.which("python3.11", path="/usr/bin")
    if python is None:
        pytest.skip("no system python3.11 that user nobody can run")
    folder = Path(tempfile.mkdtemp(prefix="primefs-nobody-"))  # pytest's own folders are root's only
    folder.chmod(0o777)
    env = {"PATH": "/usr/bin:/bin", "HOME": str(folder),
           "PYTHONPATH": os.pathsep.join([sysconfig.get_paths()["purelib"], str(Path(__file__).parents[1])])}
    nobody = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", python]
    probe = subprocess.run([*nobody, "-c", "import primefs.kernels.local"], capture_output=True, text=True,
                           timeout=60, env=env, cwd=folder)
    if probe.returncode:  # e.g. a checkout under a 0700 folder (mktemp -d): nothing to test as nobody
        shutil.rmtree(folder, ignore_errors=True)
        pytest.skip(f"user nobody cannot import primefs from this checkout: {probe.stderr.strip().splitlines()[-1]}")

    def run(script: str, timeout: float = 120) -> str:
        (folder / "script.py").write_text(textwrap.dedent(script))
        r = subprocess.run([*nobody, "script.py"], capture_output=True, text=True, timeout=timeout, env=env,
                           cwd=folder)
        return r.stdout + r.stderr

    yield run
    shutil.rmtree(folder, ignore_errors=True)


def test_a_room_that_grows_past_disk_mb_ends_the_kernel(boxed):
    from dataclasses import replace

    k = boxed.host.start(replace(boxed.spec, sandbox={**boxed.spec.sandbox, "disk_mb": 2, "cpu_s": 60}))
    r = k.execute("import time\nfor i in range(20):\n    open(f'f{i}', 'wb').write(b'x' * 900_000)\n"
                  "    time.sleep(0.3)", timeout=30)
    assert r.died and "disk_mb" in (k.lost or ""), (r, k.lost)
    big = k.spec.rooms[0]
    for f in big.glob("f*"):
        f.unlink()


def test_folders_nested_past_the_limit_end_that_kernel_and_no_other_watch(boxed):
    """A kernel nesting folders 1,200 deep made the watch of every kernel's disk and CPU limits die of a
    RecursionError (found by an attack). Now that kernel is ended, and the watch goes on for the others;
    its room's deep folders sink no commit either (they are listed, not entered, past MAX_DEPTH)."""
    from dataclasses import replace

    from primefs.store.fsutil import MAX_DEPTH
    from primefs.store.gitops import commit_paths

    k = boxed.host.start(replace(boxed.spec, sandbox={**boxed.spec.sandbox, "disk_mb": 50, "cpu_s": 60}))
    r = k.execute("import os, time\nfd = os.open('.', os.O_RDONLY)\nfor _ in range(1200):\n"
                  "    os.mkdir('d', dir_fd=fd); new = os.open('d', os.O_RDONLY, dir_fd=fd); os.close(fd); fd = new\n"
                  "time.sleep(30)", timeout=60)
    assert r.died and f"deeper than {MAX_DEPTH}" in (k.lost or ""), (r, k.lost)
    room = k.spec.rooms[0]
    root = room.parents[2]  # the workspace: sessions/<id>/work
    if not (root / ".git").exists():
        subprocess.run(["git", "init", "-q", str(root)], check=True)
    rel = str(room.parent.relative_to(root))
    assert commit_paths(root, [rel], "a deep room")
    other = boxed.host.start(replace(boxed.spec, sandbox={**boxed.spec.sandbox, "disk_mb": 2, "cpu_s": 60}))
    r = other.execute("import time\nfor i in range(20):\n    open(f'g{i}', 'wb').write(b'x' * 900_000)\n"
                      "    time.sleep(0.3)", timeout=30)
    assert r.died and "disk_mb" in (other.lost or ""), (r, other.lost)  # the watch lives on
    subprocess.run(["rm", "-rf", str(room / "d")], check=True)  # (shutil.rmtree recurses: 1,200 deep is too deep)
    for f in room.glob("g*"):
        f.unlink()


def test_other_processes_of_the_same_uid_do_not_count_against_a_kernel(boxed):
    """The process cap counts the kernel's own processes: 250 of the same uid elsewhere change nothing."""
    uid = 65534 if os.getuid() == 0 else os.getuid()
    cmd = ["sleep", "30"] if uid == os.getuid() else ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups",
                                                      "sleep", "30"]
    others = [subprocess.Popen(cmd) for _ in range(250)]
    try:
        k = boxed.host.start(boxed.spec)  # processes: 40
        assert run(k, "import subprocess\nprint(subprocess.run(['true']).returncode)") == "0\n"
        k.shutdown()
    finally:
        for p in others:
            p.kill()
            p.wait()


def test_an_unsandboxed_kernel_also_takes_everything_it_started(tmp_path):
    host = LocalKernelHost(tmp_path / "rt", tmp_path, lambda *a: "ok")
    try:
        k = host.start(KernelSpec("free", tmp_path))
        run(k, "import subprocess\nsubprocess.Popen(['setsid', 'sleep', '602'])")
        wait_for(lambda: _sleepers({"602"}), 10, "the sleep")
        k.shutdown()
        wait_for(lambda: not _sleepers({"602"}), 10, "the sleep gone with its kernel")
    finally:
        host.close()


def test_where_no_sandbox_can_be_had_the_runner_says_so_once_and_goes_on(ws, monkeypatch):
    """The default sandbox on a machine without user namespaces: said once (runner log, each session's
    history), kernels run without it. One asked for explicitly is never skipped."""
    from primefs.kernels import boxes

    monkeypatch.setitem(boxes._MACHINE, "why", "cannot create namespaces: Operation not permitted")
    (ws.root / "s.yaml").write_text("- code: \"import os\\nprint(os.getuid() == 0 or os.getpid() != 1)\"\n- text: ok\n")
    ws = configure(ws, model="scripted/s.yaml")
    write_goal(ws, "one", name="one")
    write_goal(ws, "two", name="two")
    (ws.goals / "strict.md").write_text("---\nsandbox: on\n---\nstrict\n")
    lines = run_once(ws)
    said = [ln for ln in lines if "no sandbox can be had on this machine" in ln]
    assert len(said) == 1 and "Operation not permitted" in said[0], lines
    by = {s.name: s for s in list_sessions(ws.sessions)}
    assert by["one"].events("cell")[0]["output"] == "True\n" and by["two"].read_result() == "ok"
    assert any("no sandbox can be had" in e["text"] for e in by["one"].events("warning"))
    assert by["strict"].events("cell")[0]["output"] == "False\n"  # asked for: never skipped


@pytest.mark.skipif(os.getuid() != 0, reason="a root runner's kernels are uid 65534")
def test_a_sandbox_that_cannot_be_set_up_fails_the_session_with_the_reason(ws, scripted):
    ws = scripted("- code: print(1)\n- text: ok\n")
    write_goal(ws, "x", name="x")
    ws.root.chmod(0o700)  # the kernel's uid cannot read the workspace
    try:
        run_once(ws)
    finally:
        ws.root.chmod(0o755)
    s = list_sessions(ws.sessions)[0]
    assert s.meta["status"] == "failed" and "cannot be read by the kernel's uid 65534" in s.meta["error"]
