"""A person in a session's kernel with a real Jupyter client (`primefs kernel` + jupyter_client, and
`jupyter console --existing`) while the agent uses the same kernel: aborted cells are not taken for run
ones, a console job does not eat the agent's cell timeout, the console's threads print to the console,
a kernel killed from the console is said to be, and turning kernel_connect off revokes the files."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import cli, configure, wait_for

from primefs.kernels.host import KernelSpec
from primefs.kernels.local import LocalKernelHost


@pytest.fixture
def kernel(tmp_path):
    host = LocalKernelHost(tmp_path / "rt", tmp_path, lambda *a: "ok")
    k = host.start(KernelSpec("s", tmp_path))
    yield k
    host.close()


def running(kc, msg_id: str) -> None:
    """Wait until the kernel has started on this client's request (so the agent's comes after it)."""
    while True:
        msg = kc.get_iopub_msg(timeout=10)
        if msg["parent_header"].get("msg_id") == msg_id and msg["msg_type"] == "execute_input":
            return


def console_client(info: dict):
    """Another client of the same kernel, as `jupyter console --existing` makes one."""
    from jupyter_client import BlockingKernelClient

    kc = BlockingKernelClient()
    kc.load_connection_info(info)
    kc.start_channels()
    kc.wait_for_ready(timeout=20)
    return kc


def test_a_cell_aborted_behind_a_console_error_is_sent_again_not_taken_for_run(kernel):
    kc = console_client(kernel.connection())
    try:
        running(kc, kc.execute("import time; time.sleep(1); 1/0"))  # the console's code raises meanwhile
        res = kernel.execute("print('agent ran')", timeout=20)
        assert res.output == "agent ran\n" and not res.not_run and res.error is None
    finally:
        kc.stop_channels()


def test_a_cell_aborted_every_time_is_reported_as_not_run(kernel, monkeypatch):
    from primefs.kernels import client as kernelclient

    real = kernelclient.KernelClient._execute
    kc = console_client(kernel.connection())

    def behind_an_error(self, code, timeout, on_timeout, stop):  # a console error queued before each attempt
        running(kc, kc.execute("import time; time.sleep(0.5); 1/0"))
        return real(self, code, timeout, on_timeout, stop)

    monkeypatch.setattr(kernelclient.KernelClient, "_execute", behind_an_error)
    try:
        res = kernel.execute("open('ran.txt', 'w')", timeout=20)
    finally:
        kc.stop_channels()
    assert res.not_run and res.error.startswith("the cell was not run") and res.output == ""
    assert not (kernel.spec.cwd / "ran.txt").exists()


def test_the_cell_timeout_counts_the_agents_cell_only(kernel):
    kc = console_client(kernel.connection())
    try:
        console = kc.execute("import time; time.sleep(2.5); print('console done')")
        running(kc, console)
        res = kernel.execute("print('agent after the console')", timeout=1.5)
        assert not res.timed_out and res.output == "agent after the console\n"
        reply = kc.get_shell_msg(timeout=10)
        assert reply["parent_header"]["msg_id"] == console and reply["content"]["status"] == "ok"  # not interrupted
    finally:
        kc.stop_channels()


def test_a_thread_the_console_started_prints_to_the_console(kernel):
    kc = console_client(kernel.connection())
    try:
        reply = kc.execute_interactive(textwrap.dedent("""\
            import threading, time
            def chatter():
                for i in range(30):
                    print("console thread", i, flush=True)
                    time.sleep(0.05)
            threading.Thread(target=chatter).start()"""), timeout=20, output_hook=lambda msg: None)
        assert reply["content"]["status"] == "ok"
        res = kernel.execute("import time\ntime.sleep(1)\nprint('agent')", timeout=20)
        assert res.output == "agent\n", res.output
        started_here = kernel.execute("import threading\nthreading.Thread(target=lambda: print('mine')).start()\n"
                                      "import time; time.sleep(0.3)", timeout=20)
        assert started_here.output == "mine\n"  # a thread of the agent's cell still prints into it
    finally:
        kc.stop_channels()


def test_jupyter_console_and_the_agent_share_a_kernel(ws, scripted, daemon_cleanup):
    """`primefs kernel` hands a file to `jupyter console --existing`; what the person runs there the agent
    sees, a kernel the person kills from the console is said to be killed, and turning kernel_connect off
    replaces the kernel (the old file opens nothing)."""
    from conftest import answered_under_a_runner

    ws = configure(scripted('- code: "shared = 1"\n- text: "set"\n- code: "print(shared)"\n- text: "read"\n'),
                   kernel_connect=True)
    s = answered_under_a_runner(ws, "box", "set it\n", "set")
    path = json.loads(cli(ws, "kernel", "box", "--json").stdout)["connection_file"]
    console = subprocess.run([Path(sys.executable).parent / "jupyter-console", "--existing", path, "--simple-prompt",
                              "--ZMQTerminalInteractiveShell.kernel_timeout=20"],
                             input="shared = 41 + 1\nprint('from the console', shared)\nexit(keep_kernel=True)\n",
                             capture_output=True,
                             text=True, timeout=60)
    assert "from the console 42" in console.stdout, console.stdout + console.stderr
    assert cli(ws, "send", "box", "read it").returncode == 0
    wait_for(lambda: s.read_result() == "read", 30, "the second turn")
    assert s.events("cell")[-1]["output"] == "42\n"  # the agent sees what the person set
    # killed from the console while idle
    subprocess.run([Path(sys.executable).parent / "jupyter-console", "--existing", path, "--simple-prompt"],
                   input="import os; os._exit(1)\n", capture_output=True, text=True, timeout=60)
    assert cli(ws, "send", "box", "again").returncode == 0
    wait_for(lambda: len(s.events("turn_end")) == 3, 30, "the third turn")
    notices = [e["text"] for e in s.events("notice")]
    assert any("it ended while the session was idle" in n for n in notices), notices
    # kernel_connect off: the file goes, the kernel it opened is replaced
    path = json.loads(cli(ws, "kernel", "box", "--json").stdout)["connection_file"]
    old = json.loads(Path(path).read_text())
    configure(ws, kernel_connect=False)
    wait_for(lambda: not os.path.exists(path), 30, "the connection file removed")
    assert cli(ws, "send", "box", "and again").returncode == 0
    wait_for(lambda: len(s.events("turn_end")) == 4, 30, "the fourth turn")
    assert any("connection file was revoked" in e["text"] for e in s.events("notice"))
    from jupyter_client import BlockingKernelClient

    kc = BlockingKernelClient()
    kc.load_connection_info(old)
    kc.start_channels()
    try:
        with pytest.raises(RuntimeError):
            kc.wait_for_ready(timeout=3)  # the old key opens nothing: that kernel is gone
    finally:
        kc.stop_channels()
