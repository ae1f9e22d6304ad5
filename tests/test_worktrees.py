"""A git worktree per child (docs/kernel-api.md, "Worktrees"): `rlm(task, worktree=REPO)` and a goal's
`worktree:` give a session its own worktree on a new branch, in its room (its sandbox writes there); at
its turn end what it changed is committed on the branch and listed for the parent, an unchanged one is
removed, overlaps between siblings are reported and nothing is merged. Real: a runner, sandboxed kernels,
git repositories."""
from __future__ import annotations

import json
import subprocess

import pytest
from conftest import cli, configure, run_once

from primefs.store import mail
from primefs.store.goals import write_goal
from primefs.store.session import list_sessions


def git(repo, *args) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=True).stdout


@pytest.fixture
def repo(tmp_path):
    r = tmp_path / "repo"
    r.mkdir()
    git(r, "init", "-q", "-b", "main")
    (r / "a.py").write_text("a = 0\n")
    (r / "b.py").write_text("b = 0\n")
    git(r, "add", "-A")
    git(r, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "start")
    return r


def scripted(ws, rules: dict):
    (ws.root / "script.yaml").write_text(json.dumps({"rules": [{"match": k, "replies": v} for k, v in rules.items()]}))
    return configure(ws, model="scripted/script.yaml")


def by_name(ws):
    return {s.name: s for s in list_sessions(ws.sessions)}


def test_children_get_their_own_branches_and_the_parent_their_changes(ws, repo):
    parent_code = (f"R = {str(repo)!r}\nhs = [rlm(t, worktree=R) for t in ('kid one', 'kid two', 'kid three')]\n"
                   "print([h.wait() for h in hs])\nprint(json.dumps([h.worktree for h in hs]))")
    ws = scripted(ws, {
        "^Work": [{"code": "import json\n" + parent_code}, {"text": "all done"}],
        "^kid one": [{"code": "open('worktree/a.py', 'a').write('x = 1\\n'); open('worktree/new.txt', 'w').write('n')"},
                     {"text": "one"}],
        "^kid two": [{"code": "open('worktree/a.py', 'a').write('y = 2\\n')"}, {"text": "two"}],
        "^kid three": [{"code": "print(open('worktree/a.py').read())"}, {"text": "three"}],
    })
    write_goal(ws, "Work on the repo", name="top")
    run_once(ws)
    s = by_name(ws)
    assert s["top"].read_result() == "all done", s["top"].events("cell")
    out = s["top"].events("cell")[0]["output"].splitlines()
    assert out[0] == "['one', 'two', 'three']"
    one, two, three = json.loads(out[1])
    assert one["changed"] == ["a.py", "new.txt"] and two["changed"] == ["a.py"] and three["removed"]
    assert one["branch"] == f"primefs/{s['top.1'].id}" and one["repo"] == str(repo)
    assert one["overlaps"] == {s["top.2"].id: ["a.py"]} or two["overlaps"] == {s["top.1"].id: ["a.py"]}
    branches = git(repo, "branch", "--list", "--format=%(refname:short)", "primefs/*").split()
    assert sorted(branches) == sorted([one["branch"], two["branch"]])  # the unchanged one's went with it
    assert git(repo, "show", f"{one['branch']}:a.py") == "a = 0\nx = 1\n"
    assert "Primefs-Session: " + s["top.1"].id in git(repo, "log", "-1", "--format=%B", one["branch"])
    assert git(repo, "rev-parse", "main") == git(repo, "rev-parse", "HEAD") and git(repo, "status", "--short") == ""
    assert (repo / "a.py").read_text() == "a = 0\n"  # nothing merged
    assert not (s["top.3"].dir / "work" / "worktree").exists()
    assert (s["top.1"].dir / "work" / "worktree" / "new.txt").read_text() == "n"
    assert "worktree/" not in git(ws.root, "ls-files", "sessions")  # its work is on its branch, not here
    results = [m["text"] for m in s["top"].events("message")]  # the result mail names branch and files
    assert any(f"branch {one['branch']}; changed: a.py, new.txt" in t for t in results), results


def test_a_goals_worktree_and_a_kernel_that_plants_a_git_config(ws, repo, tmp_path):
    """The kernel points its worktree's .git at a git folder of its own whose filter would run a command: the
    runner never reads the worktree through it."""
    mark = tmp_path / "ran"
    plant = ("import os, subprocess\n"
             "subprocess.run(['git', 'init', '-q', '--bare', 'evil.git'])\n"
             f"open('evil.git/config', 'a').write('[filter \"x\"]\\n\\tclean = touch {mark}\\n')\n"
             "open('worktree/.git', 'w').write('gitdir: ' + os.path.abspath('evil.git') + '\\n')\n"
             "open('worktree/.gitattributes', 'w').write('* filter=x\\n')\n"
             "open('worktree/b.py', 'w').write('b = 1\\n')")
    ws = scripted(ws, {"^Plant": [{"code": plant}, {"text": "planted"}]})
    (ws.goals / "plant.md").write_text(f"---\nworktree: {repo}\n---\nPlant it\n")
    run_once(ws)
    [s] = list_sessions(ws.sessions)
    assert s.read_result() == "planted", s.events("cell")
    wt = s.reload()["worktree"]
    assert wt["changed"] == [".gitattributes", "b.py"] and not mark.exists()
    assert git(repo, "show", f"{wt['branch']}:b.py") == "b = 1\n"


@pytest.mark.parametrize("where, words", [("nowhere", "is not a folder"), ("plain", "is not a git repository")])
def test_a_bad_worktree_path_is_an_error_in_the_cell_and_no_child(ws, tmp_path, where, words):
    path = str(tmp_path / where)
    (tmp_path / "plain").mkdir()  # a folder, in no repository
    ws = scripted(ws, {"^Try": [{"code": f"rlm('kid', worktree={path!r})"}, {"text": "tried"}]})
    write_goal(ws, "Try it", name="try")
    run_once(ws)
    [s] = list_sessions(ws.sessions)
    [cell] = s.events("cell")
    assert "ValueError" in cell["error"] and f"rlm(worktree=...): {path!r} {words}" in cell["error"]


def test_a_repository_in_a_sessions_folder_is_refused(ws):
    made = "import subprocess\nsubprocess.run(['git', 'init', '-q', 'mine'])\n"
    ws = scripted(ws, {"^Try": [{"code": made + "import os\nrlm('kid', worktree=os.path.abspath('mine'))"},
                                {"text": "tried"}]})
    write_goal(ws, "Try it", name="try")
    run_once(ws)
    [s] = list_sessions(ws.sessions)
    assert "lies in a session's folder, which kernels write" in s.events("cell")[0]["error"]
    (ws.goals / "bad.md").write_text("---\nworktree: /no/such/repo\n---\nx\n")
    lines = run_once(ws)
    assert any("goals/bad.md: worktree: '/no/such/repo' is not a folder" in ln for ln in lines), lines


def test_a_worktree_removed_unchanged_is_made_again_for_the_next_turn(ws, repo, tmp_path):

    ws = scripted(ws, {"^Look": [{"text": "nothing to do"},
                                 {"code": "open('worktree/c.py', 'w').write('c = 3\\n')"}, {"text": "made c"}]})
    bad = cli(ws, "goal", "Look", "--worktree", str(tmp_path))
    assert bad.returncode == 1 and "--worktree: " in bad.stderr and "is not a git repository" in bad.stderr
    assert cli(ws, "goal", "Look around", "--name", "look", "--worktree", str(repo)).returncode == 0
    run_once(ws)
    [s] = list_sessions(ws.sessions)
    assert s.reload()["worktree"]["removed"] and not (s.dir / "work" / "worktree").exists()
    mail.deliver(s.mail, sender="user", to=s.id, kind="user", text="now add c.py")
    run_once(ws)
    wt = s.reload()["worktree"]
    assert s.read_result() == "made c" and wt["changed"] == ["c.py"] and not wt.get("removed")
    assert git(repo, "show", f"{wt['branch']}:c.py") == "c = 3\n"


def test_a_link_the_kernel_puts_in_its_worktrees_place_is_not_written_through(ws, repo, tmp_path):
    """An attacker's kernel waits for its unchanged worktree to be removed at its turn end, then puts a link
    to an empty folder elsewhere (another session's mail/new, say) in its place. Before, the next turn's
    `git worktree add` wrote the checkout through the link, as the runner: mail "from the user"."""
    victim = tmp_path / "victim"
    victim.mkdir()
    plant = ("import os, threading, time\n"
             "def plant():\n"
             "    while os.path.exists('worktree'):\n"
             "        time.sleep(0.02)\n"
             f"    os.symlink({str(victim)!r}, 'worktree')\n"
             "threading.Thread(target=plant, daemon=True).start()")
    ws = scripted(ws, {"^Look": [{"code": plant}, {"text": "nothing to do"},
                                 {"code": "print(sorted(os.listdir('worktree')))"}, {"text": "looked"}]})
    assert cli(ws, "goal", "Look around", "--name", "look", "--worktree", str(repo)).returncode == 0
    run_once(ws)
    [s] = list_sessions(ws.sessions)
    room = s.dir / "work"
    assert s.reload()["worktree"]["removed"]
    for _ in range(200):  # the kernel's thread plants it once the runner removed the worktree
        if (room / "worktree").is_symlink():
            break
        import time
        time.sleep(0.05)
    else:  # the kernel is gone with the runner: plant it as it would have
        (room / "worktree").symlink_to(victim)
    mail.deliver(s.mail, sender="user", to=s.id, kind="user", text="look again")
    run_once(ws)
    assert list(victim.iterdir()) == []
    assert s.read_result() == "looked" and "'a.py', 'b.py'" in s.events("cell")[-1]["output"]  # a real worktree
    assert not (room / "worktree").exists()  # unchanged again: removed again
    assert not list(s.dir.glob(".worktree-*"))
