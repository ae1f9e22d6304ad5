"""A real browser on a real `primefs serve`: shared by test_web_browser.py and bench/screenshots.py.

Debian's chromium, driven by Playwright (its own browser download cannot work here). Run inside a
loopback-only network namespace (`make test` does); the flags also keep Chromium's own background
traffic (updates, safe browsing, DNS) from going anywhere: everything not on loopback goes to a closed
port.
"""
from __future__ import annotations

import contextlib
import os
import queue
import shutil
import subprocess
import sys
import threading

CHROMIUM_ARGS = ["--no-sandbox", "--disable-background-networking", "--disable-component-update",
                 "--no-first-run", "--proxy-server=http://127.0.0.1:9"]


@contextlib.contextmanager
def chromium():
    from playwright.sync_api import sync_playwright

    exe = shutil.which("chromium")
    if exe is None:
        raise RuntimeError("chromium is not installed (`make test` installs it: apt-get install -y chromium)")
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=exe, headless=True, args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()


@contextlib.contextmanager
def served(ws_root, *extra: str, timeout: float = 60.0):
    """`primefs serve --port 0` as a process; yields the URL it printed (with its token)."""
    proc = subprocess.Popen([sys.executable, "-m", "primefs", "-w", str(ws_root), "serve", "--port", "0", *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True"})
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: lines.put(proc.stdout.readline()), daemon=True).start()
    try:
        try:
            first = lines.get(timeout=timeout)
        except queue.Empty:
            first = ""
        if "?token=" not in first:
            proc.kill()
            raise RuntimeError(f"primefs serve printed no URL: {first!r} {proc.stderr.read()!r}")
        yield first.split(": ", 1)[1].strip()
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
