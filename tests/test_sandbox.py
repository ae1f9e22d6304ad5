"""Sandbox mode: kernels with no network, writes only in the workspace, memory, CPU, process and file caps.

Each limit is proved from inside a real forked kernel; then end to end through the runner (primefs.yaml
`sandbox:`, a goal turning it off), and once as a normal user when the tests run as root."""
from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sysconfig
import textwrap
from pathlib import Path

import pytest
from conftest import configure, run_once

from primefs.goals import write_goal
from primefs.kernelhost import KernelSpec
from primefs.localkernels import LocalKernelHost
from primefs.session import list_sessions
from primefs.settings import check_sandbox

LIMITS = {"memory_mb": 1024, "cpu_s": 3, "processes": 40, "open_files": 64}


@pytest.fixture(scope="module")
def boxed(tmp_path_factory):
    """One sandboxed kernel (and a listening socket outside it) for the limit tests."""
    root = tmp_path_factory.mktemp("sandbox")
    ws = root / "ws"
    ws.mkdir()
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    host = LocalKernelHost(root / "rt", ws, lambda *a: "ok")
    spec = KernelSpec("s", ws, sandbox=check_sandbox(LIMITS, "test"), tmpdir=str(ws / "tmp"))
    kernel = host.start(spec)
    kernel.ws, kernel.port, kernel.host, kernel.spec = ws, listener.getsockname()[1], host, spec
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


def test_writes_only_inside_the_workspace(boxed):
    out = run(boxed, """
        import tempfile
        for path in ("/tmp/escape.txt", "/root/escape.txt", "inside.txt", tempfile.gettempdir() + "/t.txt"):
            try:
                open(path, "w").write("x")
                print("wrote", path)
            except OSError as e:
                print("refused", path, e.strerror)""")
    assert "refused /tmp/escape.txt Read-only file system" in out and "refused /root/escape.txt" in out
    assert "wrote inside.txt" in out and f"wrote {boxed.ws}/tmp/t.txt" in out
    assert not Path("/tmp/escape.txt").exists() and (boxed.ws / "inside.txt").read_text() == "x"


def test_the_read_only_mounts_cannot_be_undone(boxed):
    out = run(boxed, """
        import ctypes
        attr = (ctypes.c_uint64 * 4)(0, 1, 0, 0)  # mount_setattr: clear MOUNT_ATTR_RDONLY on / recursively
        r = ctypes.CDLL(None, use_errno=True).syscall(442, -100, b"/", 0x8000, attr, 32)
        try:
            open("/tmp/escape2.txt", "w")
            print("escaped")
        except OSError as e:
            print(r, e.strerror)""")
    assert out == "-1 Read-only file system\n"


def test_a_sandboxed_kernel_is_not_dumpable_and_its_files_are_the_runners(boxed):
    assert run(boxed, "import ctypes\nprint(ctypes.CDLL(None).prctl(3, 0, 0, 0, 0))") == "0\n"
    run(boxed, "open('mine.txt', 'w').write('x')")
    assert (boxed.ws / "mine.txt").stat().st_uid == os.getuid()


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


def test_sandbox_end_to_end_and_a_goal_can_turn_it_off(ws):
    (ws.root / "s.yaml").write_text(textwrap.dedent("""\
        - code: |
            import socket
            for what, f in (("net", lambda: socket.create_connection(("127.0.0.1", 9), timeout=2)),
                            ("write", lambda: open("/tmp/primefs-sandbox-e2e.txt", "w"))):
                try:
                    f()
                    print(what, "allowed")
                except OSError as e:
                    print(what, "refused")
        - text: done
        """))
    ws = configure(ws, model="scripted/s.yaml", sandbox={"memory_mb": 2048})
    write_goal(ws, "boxed", name="boxed")
    (ws.goals / "free.md").write_text("---\nsandbox: false\n---\nfree\n")
    run_once(ws)
    by = {s.name: s for s in list_sessions(ws.sessions)}
    assert by["boxed"].events("cell")[0]["output"] == "net refused\nwrite refused\n"
    free = by["free"].events("cell")[0]["output"]
    assert "write allowed" in free and by["free"].meta["sandbox"] is False
    Path("/tmp/primefs-sandbox-e2e.txt").unlink(missing_ok=True)


@pytest.mark.skipif(os.getuid() != 0 or not shutil.which("setpriv"), reason="needs root to become another user")
def test_the_sandbox_works_for_a_normal_user():
    """The same limits when the runner runs as `nobody` (unprivileged user namespaces)."""
    import tempfile

    python = shutil.which("python3.11", path="/usr/bin")
    if python is None:
        pytest.skip("no system python3.11 that user nobody can run")
    tmp_path = Path(tempfile.mkdtemp(prefix="primefs-nobody-"))  # pytest's own folders are root's only
    tmp_path.chmod(0o777)
    (tmp_path / "ws").mkdir()
    (tmp_path / "ws").chmod(0o777)
    script = tmp_path / "check.py"
    script.write_text(textwrap.dedent(f"""\
        from pathlib import Path
        from primefs.kernelhost import KernelSpec
        from primefs.localkernels import LocalKernelHost
        from primefs.settings import check_sandbox
        ws = Path({str(tmp_path / "ws")!r})
        host = LocalKernelHost(Path({str(tmp_path / "rt")!r}), ws, lambda *a: "ok")
        k = host.start(KernelSpec("u", ws, sandbox=check_sandbox({LIMITS!r}, "t"), tmpdir=str(ws / "tmp")))
        r = k.execute('''
        import os, socket, subprocess
        print("uid", os.getuid())
        try:
            socket.create_connection(("127.0.0.1", 9), timeout=2)
        except OSError as e:
            print("net", e.strerror)
        try:
            open("/tmp/nobody-escape.txt", "w")
        except OSError as e:
            print("write", e.strerror)
        ps = []
        try:
            for i in range(100):
                ps.append(subprocess.Popen(["sleep", "2"]))
        except OSError as e:
            print("processes", e.strerror)
        ''', timeout=30)
        print(r.output, r.error)
        host.close()
        """))
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path),
           "PYTHONPATH": os.pathsep.join([sysconfig.get_paths()["purelib"], str(Path(__file__).parents[1])])}
    nobody = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", python]
    probe = subprocess.run([*nobody, "-c", "import primefs.localkernels"], capture_output=True, text=True,
                           timeout=60, env=env, cwd=tmp_path)
    if probe.returncode:  # e.g. a checkout under a 0700 folder (mktemp -d): nothing to test as nobody
        shutil.rmtree(tmp_path, ignore_errors=True)
        pytest.skip(f"user nobody cannot import primefs from this checkout: {probe.stderr.strip().splitlines()[-1]}")
    r = subprocess.run([*nobody, str(script)], capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)
    assert "uid 65534" in r.stdout, r.stdout + r.stderr
    assert "net Network is unreachable" in r.stdout and "write Read-only file system" in r.stdout
    assert "processes Resource temporarily unavailable" in r.stdout
    shutil.rmtree(tmp_path, ignore_errors=True)
