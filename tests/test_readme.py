"""The README's Use section stays true: its first block runs as written, in bash, from a folder
holding `.venv` (this test's own virtual environment), with HOME in a temporary folder. The model is
a script: $PRIMEFS_MODEL (which the runner reads as the default model) names script.yaml, copied
into the new workspace right after the block's `primefs init` line (a script must be inside its
workspace). Every command named in the second block exists."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SCRIPT = """\
rules:
  - match: "largest files"
    replies:
      - code: "import os\\nnames = sorted(os.listdir('/usr/share'))\\nprint(len(names), 'entries')"
      - text: "The three largest files are a, b and c."
  - match: "How many lines"
    replies:
      - code: "print(len(context.splitlines()))"
      - text: "It has many lines."
  - match: "What is 2"
    replies:
      - text: "1267650600228229401496703205376"
"""


def use_blocks() -> list[str]:
    text = (REPO / "README.md").read_text(encoding="utf-8")
    section = text.split("\n## Use\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"^```[^\n]*\n(.*?)^```", section, re.DOTALL | re.MULTILINE)


def test_the_use_section_runs_as_written(tmp_path):
    activate = Path(sys.prefix) / "bin" / "activate"
    if not activate.is_file():
        pytest.skip("not running in a virtual environment: the README's `source .venv/bin/activate` needs one")
    first = use_blocks()[0]
    assert first.startswith("source .venv/bin/activate")
    lines = first.splitlines()
    init = next(i for i, line in enumerate(lines) if line.startswith("primefs init "))
    lines.insert(init + 1, 'cp "$README_SCRIPT" script.yaml')  # the only line added
    repo, home = tmp_path / "repo", tmp_path / "home"
    repo.mkdir()
    home.mkdir()
    (repo / ".venv").symlink_to(sys.prefix)
    (tmp_path / "script.yaml").write_text(SCRIPT)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PRIMEFS_", "VIRTUAL_ENV"))}
    env.update(HOME=str(home), PRIMEFS_MODEL="scripted/script.yaml", README_SCRIPT=str(tmp_path / "script.yaml"),
               COLUMNS="200", PYTHONPATH=str(REPO),  # the primefs under test, whichever venv runs it
               PATH="/usr/local/bin:/usr/bin:/bin")  # primefs is not on PATH before `source`
    proc = subprocess.run(["bash", "-e", "-c", "\n".join(lines)], cwd=repo, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    ws = home / "myws"
    assert (ws / "primefs.yaml").is_file() and (ws / ".git").is_dir()
    assert not (repo / "myws").exists()
    [result] = list((ws / "sessions").glob("*/result.md"))
    assert result.read_text().strip() == "The three largest files are a, b and c."
    out = proc.stdout
    # the cell's output twice: as it happened (run -v), then in the session's history (log)
    assert len(re.findall(r"^\d+ entries$", out, re.MULTILINE)) == 2
    assert re.search(r"largest\s+idle \(answered\).*The three largest files", out)  # status
    assert re.search(r"^ tree\s+2\s", out, re.MULTILINE)  # usage: 2 calls
    python = use_blocks()[2]  # the Python example, in the workspace the first block made
    proc = subprocess.run([sys.executable, "-c", python], cwd=repo, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    first, second = proc.stdout.splitlines()
    assert re.fullmatch(r"It has many lines\. \d+ \d{6}-\d{9}-\w{3}", first), first
    assert second == "1267650600228229401496703205376"


def test_every_command_of_the_second_block_exists():
    commands = set(re.findall(r"\bprimefs ([a-z][a-z-]*)", use_blocks()[1]))
    assert {"run", "ask", "send", "wait", "exec", "models", "stop", "up", "eval", "serve", "trace"} <= commands
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    for command in sorted(commands):
        proc = subprocess.run([sys.executable, "-m", "primefs", command, "--help"], capture_output=True, text=True,
                              env=env, timeout=60)
        assert proc.returncode == 0, f"primefs {command}: {proc.stderr}"
