"""The harness store: entries as files, one commit per change with provenance trailers (real git)."""
from __future__ import annotations

import subprocess

import pytest

from primefs.harness import entries as harness
from primefs.errors import PrimefsError
from primefs.harness.entries import Harness, render_for_prompt, session_chain
from primefs.store.session import create_session


def git(ws, *args) -> str:
    return subprocess.run(["git", "-C", str(ws.root), *args], capture_output=True, text=True, check=True).stdout


def trailers(ws, sha) -> dict:
    body = git(ws, "log", "-1", "--format=%B", sha)
    parsed = subprocess.run(["git", "interpret-trailers", "--parse"], input=body, capture_output=True,
                            text=True, check=True).stdout
    return dict(line.split(": ", 1) for line in parsed.splitlines())


def changed_files(ws, sha) -> list[str]:
    return git(ws, "show", "--name-only", "--format=", sha).split()


def head(ws) -> str:
    return git(ws, "rev-parse", "HEAD").strip()


def clean(ws) -> bool:
    return git(ws, "status", "--porcelain") == ""


@pytest.fixture
def h(ws) -> Harness:
    return Harness(ws)


def test_put_writes_front_matter_and_one_commit_with_trailers(ws, h):
    (ws.root / "unrelated.txt").write_text("staged by the user\n")
    git(ws, "add", "unrelated.txt")
    before = head(ws)
    sha = h.put("memory", "sky-color", "The sky is blue.", description="What colour the sky is")
    assert sha == head(ws) and git(ws, "rev-parse", f"{sha}^").strip() == before
    assert changed_files(ws, sha) == ["harness/memory/sky-color.md"]
    assert git(ws, "diff", "--cached", "--name-only").split() == ["unrelated.txt"]  # still staged, not committed
    assert git(ws, "log", "-1", "--format=%s", sha).strip() == \
        "harness(memory/sky-color): add - What colour the sky is"
    assert trailers(ws, sha) == {
        "Primefs-Session": "-", "Primefs-Kind": "memory", "Primefs-Name": "sky-color",
        "Primefs-Path": "harness/memory/sky-color.md", "Primefs-Source": "agent"}

    entry = h.get("memory", "sky-color")
    assert entry.body == "The sky is blue.\n" and entry.description == "What colour the sky is"
    assert entry.meta["name"] == "sky-color" and entry.scope == "global"
    assert entry.meta["primefs"]["source"] == "agent" and entry.meta["primefs"]["created"]
    text = (ws.harness / "memory" / "sky-color.md").read_text()
    assert text.startswith("---\nname: sky-color\ndescription: What colour the sky is\nprimefs:\n")


def test_refine_put_carries_evidence_and_intent(ws, h):
    with pytest.raises(PrimefsError, match="evidence"):
        h.put("note", "style", "Be brief.", source="refine")
    sha = h.put("note", "style", "Be brief.", source="refine", session="s1", evidence=["ev-3", "ev-9"],
                intent="shorter\nanswers")
    t = trailers(ws, sha)
    assert t["Primefs-Source"] == "refine" and t["Primefs-Session"] == "s1"
    assert t["Primefs-Evidence"] == "ev-3, ev-9" and t["Primefs-Intent"] == "shorter answers"


def test_skill_with_module_and_agent_spec(ws, h):
    sha = h.put("skill", "csv-stats", "Import csv_stats and call summary(path).", description="Summarise a CSV",
                files={"csv_stats.py": "def summary(path):\n    return path\n"}, allowed_tools="python",
                license="MIT")
    assert sorted(changed_files(ws, sha)) == ["harness/skills/csv-stats/SKILL.md",
                                              "harness/skills/csv-stats/csv_stats.py"]
    e = h.get("skill", "csv-stats")
    assert e.files == ["csv_stats.py"] and e.meta["allowed-tools"] == "python" and e.meta["license"] == "MIT"
    assert e.path == "harness/skills/csv-stats"
    for bad in ("../x.py", "a/b.py", "SKILL.md", ".hidden"):
        with pytest.raises(PrimefsError):
            h.put("skill", "csv-stats", "x", files={bad: "x"})
    with pytest.raises(PrimefsError, match="description"):
        h.put("agent", "reviewer", "Review code.")
    h.put("agent", "reviewer", "Review code.", description="Reviews diffs", model="inherit", tools=["python"])
    assert h.get("agent", "reviewer").meta["model"] == "inherit"


def test_update_keeps_comments_and_unknown_keys(ws, h):
    h.put("memory", "sky-color", "Blue.", description="Sky")
    path = ws.harness / "memory" / "sky-color.md"
    text = path.read_text().replace("description: Sky\n", "description: Sky  # checked by hand\nmood: calm\n")
    path.write_text(text)  # not committed: put commits the hand edit first, as the user's
    sha = h.put("memory", "sky-color", "Grey today.")
    assert trailers(ws, f"{sha}^")["Primefs-Source"] == "user" and trailers(ws, sha)["Primefs-Source"] == "agent"
    assert "mood: calm" in git(ws, "show", f"{sha}^:harness/memory/sky-color.md")
    text = path.read_text()
    assert "# checked by hand" in text and "mood: calm" in text and text.endswith("---\nGrey today.\n")
    e = h.get("memory", "sky-color")
    assert e.description == "Sky" and e.meta["primefs"]["updated"] >= e.meta["primefs"]["created"]
    h.put("memory", "sky-color", None, description="Sky colour", mood=None)  # body kept, key removed
    assert "mood" not in path.read_text() and h.get("memory", "sky-color").body == "Grey today.\n"


def test_delete_commits(ws, h):
    h.put("skill", "tool", "Use it.", description="A tool", files={"tool.py": "x = 1\n"})
    sha = h.delete("skill", "tool", session="s2")
    assert not (ws.harness / "skills" / "tool").exists()
    assert sorted(changed_files(ws, sha)) == ["harness/skills/tool/SKILL.md", "harness/skills/tool/tool.py"]
    assert git(ws, "log", "-1", "--format=%s", sha).strip() == "harness(skill/tool): delete"
    assert trailers(ws, sha)["Primefs-Session"] == "s2"
    with pytest.raises(PrimefsError, match="no global skill"):
        h.delete("skill", "tool")
    assert clean(ws)


def test_session_local_shadows_global_and_is_seen_by_descendants(ws, h):
    root = create_session(ws.sessions, task="t", name="root", model="scripted")
    child = create_session(ws.sessions, task="t", name="child", model="scripted", parent=root.id, depth=1)
    other = create_session(ws.sessions, task="t", name="other", model="scripted")
    h.put("memory", "sky-color", "Blue.", description="global")
    sha = h.put("memory", "sky-color", "Red, in this session.", scope="session", session=root.id, description="local")
    assert changed_files(ws, sha) == [f"sessions/{root.id}/harness/memory/sky-color.md"]
    assert trailers(ws, sha)["Primefs-Session"] == root.id
    h.put("note", "only-here", "x", scope="session", session=root.id)

    chain = session_chain(ws, child.id)
    assert chain == [child.id, root.id]
    assert h.get("memory", "sky-color", sessions=chain).description == "local"
    assert h.get("memory", "sky-color", sessions=[other.id]).description == "global"
    assert h.get("memory", "sky-color").description == "global"
    visible = {(e.kind, e.name): e for e in h.list(sessions=chain)}
    assert visible[("memory", "sky-color")].scope == "session" and visible[("memory", "sky-color")].session == root.id
    assert ("note", "only-here") in visible and len(h.list(sessions=chain)) == 2
    assert [e.name for e in h.list(sessions=[other.id])] == ["sky-color"]
    assert len(h.list(all_sessions=True)) == 3
    with pytest.raises(PrimefsError, match="no session"):
        h.put("note", "x", "y", scope="session", session="nope")
    with pytest.raises(PrimefsError, match="session id"):
        h.put("note", "x", "y", scope="session")


@pytest.mark.parametrize("name", ["../x", "/abs", "a/b", "Bad", "", "a_b", "-x", "x-", "a" * 65])
def test_bad_names_refused(ws, h, name):
    with pytest.raises(PrimefsError, match="invalid harness name"):
        h.put("memory", name, "x")
    with pytest.raises(PrimefsError, match="invalid harness name"):
        h.get("memory", name)
    assert clean(ws)


def test_bad_kind_scope_source_refused(h):
    with pytest.raises(PrimefsError, match="unknown harness kind"):
        h.put("memories", "x", "y")
    with pytest.raises(PrimefsError, match="scope"):
        h.put("note", "x", "y", scope="world")
    with pytest.raises(PrimefsError, match="source"):
        h.put("note", "x", "y", source="robot")
    with pytest.raises(PrimefsError, match="unknown harness kind"):
        h.list("notes")


def test_broken_front_matter_reported_by_list_not_raised(ws, h):
    h.put("note", "good", "fine")
    (ws.harness / "notes" / "broken.md").write_text("---\nname: broken\ndescription: [oops\n---\nbody\n")
    (ws.harness / "memory" / "wrong-name.md").write_text("---\nname: other\n---\nbody\n")
    (ws.harness / "notes" / "todo.txt").write_text("not markdown\n")
    entries = h.list()
    by_path = {e.path: e for e in entries}
    assert by_path["harness/notes/good.md"].problem is None
    broken = by_path["harness/notes/broken.md"].problem
    assert broken.startswith("harness/notes/broken.md:") and "bad YAML front matter" in broken
    line = int(broken.split(":")[1])
    assert line in (3, 4)  # the unclosed flow sequence: reported on its line or the next
    assert by_path["harness/memory/wrong-name.md"].problem.startswith("harness/memory/wrong-name.md:2: name 'other'")
    assert "not a harness entry" in by_path["harness/notes/todo.txt"].problem
    with pytest.raises(PrimefsError, match="broken.md"):
        h.get("note", "broken")
    with pytest.raises(PrimefsError, match="broken.md"):  # never overwrite a file we cannot parse
        h.put("note", "broken", "new")
    prompt = render_for_prompt(entries)
    assert "fine" in prompt and "harness/notes/broken.md:" in prompt and "body" not in prompt


def test_hand_edits_committed_as_user(ws, h):
    h.put("memory", "edited", "old", description="d")
    h.put("note", "removed", "bye")
    (ws.harness / "memory" / "edited.md").write_text((ws.harness / "memory" / "edited.md").read_text() + "more\n")
    (ws.harness / "notes" / "removed.md").unlink()
    (ws.harness / "skills" / "new-skill").mkdir()
    (ws.harness / "skills" / "new-skill" / "SKILL.md").write_text("---\nname: new-skill\ndescription: x\n---\nhi\n")
    (ws.harness / "skills" / "new-skill" / "helper.py").write_text("y = 2\n")
    s = create_session(ws.sessions, task="t", name="s", model="scripted")
    (s.dir / "harness" / "notes").mkdir(parents=True)
    (s.dir / "harness" / "notes" / "mine.md").write_text("session note\n")
    (ws.root / "elsewhere.txt").write_text("not harness\n")

    shas = harness.commit_user_edits(ws)
    assert len(shas) == 4
    subjects = {git(ws, "log", "-1", "--format=%s", sha).strip(): sha for sha in shas}
    assert set(subjects) == {"harness(memory/edited): update (hand edit)", "harness(note/removed): delete (hand edit)",
                             "harness(skill/new-skill): add (hand edit)", "harness(note/mine): add (hand edit)"}
    for sha in shas:
        assert trailers(ws, sha)["Primefs-Source"] == "user" and trailers(ws, sha)["Primefs-Session"] == "-"
    assert sorted(changed_files(ws, subjects["harness(skill/new-skill): add (hand edit)"])) == \
        ["harness/skills/new-skill/SKILL.md", "harness/skills/new-skill/helper.py"]
    assert trailers(ws, subjects["harness(note/mine): add (hand edit)"])["Primefs-Path"] == \
        f"sessions/{s.id}/harness/notes/mine.md"
    status = git(ws, "status", "--porcelain", "--untracked-files=all")
    assert "elsewhere.txt" in status and "harness/" not in status  # only harness files were committed
    assert harness.commit_user_edits(ws) == []


def test_log_returns_fields(ws, h):
    a = h.put("memory", "m", "one", session="s1")
    b = h.put("memory", "m", "two", source="refine", evidence="ev-1", intent="better")
    (ws.root / "x.txt").write_text("x")
    git(ws, "add", "x.txt")
    git(ws, "commit", "-qm", "not harness")
    entries = harness.log(ws)
    assert [e["sha"] for e in entries] == [b, a]
    assert entries[0] | {"date": None} == {
        "sha": b, "date": None, "subject": "harness(memory/m): update - two", "kind": "memory", "name": "m",
        "path": "harness/memory/m.md", "scope": "global", "session": None, "source": "refine",
        "evidence": ["ev-1"], "intent": "better", "gate": None, "reverts": None, "outcome": None, "outcome_note": None,
        "reverted_by": None}
    assert entries[1]["session"] == "s1" and entries[1]["source"] == "agent" and entries[0]["date"]
    assert len(harness.log(ws, limit=1)) == 1


def test_revert_restores_previous_state_with_a_new_commit(ws, h):
    h.put("memory", "m", "first")
    path = ws.harness / "memory" / "m.md"
    before = path.read_text()
    bad = h.put("memory", "m", "second", source="refine", evidence=["e1"], intent="x")
    sha = harness.revert(ws, bad)
    assert sha == head(ws) and git(ws, "rev-parse", "HEAD^").strip() == bad  # appended, history kept
    assert path.read_text() == before and clean(ws)
    t = trailers(ws, sha)
    assert t["Primefs-Source"] == "user" and t["Primefs-Kind"] == "memory" and t["Primefs-Reverts"] == bad
    assert t["Primefs-Path"] == "harness/memory/m.md"
    assert harness.log(ws)[0]["reverts"] == bad
    # reverting an add removes the entry; reverting that revert brings it back
    added = h.put("note", "n", "hello")
    gone = harness.revert(ws, added)
    assert not (ws.harness / "notes" / "n.md").exists()
    harness.revert(ws, gone)
    assert h.get("note", "n").body == "hello\n"


def test_revert_commits_pending_hand_edits_first(ws, h):
    h.put("note", "a", "one")
    sha = h.put("note", "b", "two")
    (ws.harness / "notes" / "a.md").write_text("edited by hand\n")
    harness.revert(ws, sha)
    assert (ws.harness / "notes" / "a.md").read_text() == "edited by hand\n" and clean(ws)
    assert harness.log(ws)[1]["subject"] == "harness(note/a): update (hand edit)"


def test_revert_refused_cleanly(ws, h):
    with pytest.raises(PrimefsError, match="not a harness change"):
        harness.revert(ws, "HEAD")  # the workspace's first commit
    with pytest.raises(PrimefsError, match="unknown commit"):
        harness.revert(ws, "deadbeef")
    first = h.put("memory", "m", "v1")
    middle = h.put("memory", "m", "v2")
    h.put("memory", "m", "v3")
    last = head(ws)
    with pytest.raises(PrimefsError, match="conflicts with later changes to harness/memory/m.md"):
        harness.revert(ws, middle)
    assert head(ws) == last and clean(ws) and h.get("memory", "m").body == "v3\n"
    assert not (ws.root / ".git" / "REVERT_HEAD").exists()
    (ws.root / "staged.txt").write_text("s")
    git(ws, "add", "staged.txt")
    with pytest.raises(PrimefsError, match="staged changes"):
        harness.revert(ws, first)
    assert git(ws, "diff", "--cached", "--name-only").split() == ["staged.txt"] and head(ws) == last


def test_outcome_recorded_and_shown_in_log(ws, h):
    sha = h.put("memory", "m", "v1", source="refine", evidence=["e"], intent="fewer retries")
    other = h.put("memory", "n", "v1")
    harness.record_outcome(ws, sha, "good", "retries went from 3 to 1")
    by_sha = {e["sha"]: e for e in harness.log(ws)}
    assert by_sha[sha]["outcome"] == "good" and by_sha[sha]["outcome_note"] == "retries went from 3 to 1"
    assert by_sha[other]["outcome"] is None
    harness.record_outcome(ws, sha, "bad")  # replaces
    assert {e["sha"]: e for e in harness.log(ws)}[sha]["outcome"] == "bad"
    assert git(ws, "notes", "--ref=primefs-outcomes", "show", sha).strip() == "bad"
    with pytest.raises(PrimefsError, match="good or bad"):
        harness.record_outcome(ws, sha, "meh")
    with pytest.raises(PrimefsError, match="not a harness change"):
        harness.record_outcome(ws, git(ws, "rev-list", "--max-parents=0", "HEAD").strip(), "good")
    assert clean(ws)


def test_render_for_prompt_respects_memory_budget(ws, h):
    h.put("note", "style", "Always answer in English.", description="House style")
    h.put("skill", "csv-stats", "Long instructions " * 50, description="Summarise a CSV")
    h.put("agent", "reviewer", "Long spec " * 50, description="Reviews diffs")
    for i in range(5):
        h.put("memory", f"fact-{i}", f"Fact number {i}. " + "x" * 200, description=f"fact {i}")
    entries = h.list()
    full = render_for_prompt(entries, memory_budget_chars=100_000)
    assert all(f"Fact number {i}." in full for i in range(5)) and "not shown" not in full
    assert "Always answer in English." in full
    assert "- csv-stats: Summarise a CSV (harness/skills/csv-stats)" in full and "Long instructions" not in full
    assert "- reviewer: Reviews diffs" in full and "Long spec" not in full

    block = len(full.split("### fact-4")[1].split("### fact-3")[0]) + len("### fact-4")
    text = render_for_prompt(entries, memory_budget_chars=2 * block + 10)
    shown = [i for i in range(5) if f"Fact number {i}." in text]
    assert shown == [3, 4]  # the newest, whole
    assert "3 more memories not shown" in text
    assert "x" * 200 in text  # never cut short
    assert "Always answer in English." in text  # notes are not limited by the memory budget
    none = render_for_prompt(entries, memory_budget_chars=0)
    assert "5 more memories not shown" in none and "Fact number" not in none
    assert render_for_prompt([]) == ""


def test_put_with_unchanged_content_writes_and_commits_nothing(ws, h):
    sha = h.put("memory", "m", "The sky is blue.", description="Sky", mood="calm")
    path = ws.harness / "memory" / "m.md"
    text, last = path.read_text(), head(ws)
    # same body, description and fields; another source and session: only provenance would differ
    assert h.put("memory", "m", "The sky is blue.", description="Sky", mood="calm") is None
    assert h.put("memory", "m", "The sky is blue.\n", source="user", session="s9") is None
    assert h.put("memory", "m", None, description="Sky") is None  # body kept, nothing else given
    assert path.read_text() == text and head(ws) == last == sha and clean(ws)
    assert h.put("memory", "m", None, mood="grey") != last  # a real change still commits
    # a skill: its modules count as content
    h.put("skill", "tool", "Use it.", description="A tool", files={"tool.py": "x = 1\n"})
    before = head(ws)
    assert h.put("skill", "tool", "Use it.", files={"tool.py": "x = 1\n", "gone.py": None}) is None
    assert head(ws) == before
    assert h.put("skill", "tool", "Use it.", files={"tool.py": "x = 2\n"}) is not None
    # a hand-written file without a primefs block: put of the same content leaves it alone
    (ws.harness / "notes" / "hand.md").write_text("---\nname: hand\n---\nWritten by hand.\n")
    harness.commit_user_edits(ws)
    before = head(ws)
    assert h.put("note", "hand", "Written by hand.") is None
    assert head(ws) == before and "primefs" not in (ws.harness / "notes" / "hand.md").read_text()


def test_plain_git_revert_is_seen_by_log_and_revert(ws, h):
    h.put("note", "n", "one")
    change = h.put("note", "n", "two")
    git(ws, "revert", "--no-edit", change)  # what the design promises works, with git alone
    plain = head(ws)
    rows = {r["sha"]: r for r in harness.log(ws)}
    assert rows[change]["reverted_by"] == plain
    assert rows[plain] | {"date": None} == {
        "sha": plain, "date": None, "subject": 'Revert "harness(note/n): update - two"', "kind": "note",
        "name": "n", "path": "harness/notes/n.md", "scope": "global", "session": None, "source": None,
        "evidence": [], "intent": None, "gate": None, "reverts": change, "outcome": None, "outcome_note": None,
        "reverted_by": None}
    with pytest.raises(PrimefsError, match=f"already reverted by {plain[:10]}"):
        harness.revert(ws, change)
    assert head(ws) == plain and clean(ws)
    # reverting the plain revert redoes the change: then it is live again and may be reverted
    again = harness.revert(ws, plain)
    assert h.get("note", "n").body == "two\n" and trailers(ws, again)["Primefs-Reverts"] == plain
    rows = {r["sha"]: r for r in harness.log(ws)}
    assert rows[plain]["reverted_by"] == again and rows[change]["reverted_by"] is None
    redo = harness.revert(ws, change)
    assert h.get("note", "n").body == "one\n" and {r["sha"]: r for r in harness.log(ws)}[change]["reverted_by"] == redo
    # `git revert --reference` names the commit by an abbreviated sha
    other = h.put("memory", "k", "v")
    git(ws, "revert", "--reference", "--no-edit", other)
    assert {r["sha"]: r for r in harness.log(ws)}[other]["reverted_by"] == head(ws)
    assert harness.log(ws, limit=1)[0]["reverts"] == other


def test_revert_reports_a_git_failure_whole_and_leaves_the_tree(ws, h):
    sha = h.put("note", "n", "hello")
    git(ws, "config", "commit.gpgsign", "true")  # git revert fails writing its commit; primefs commits too
    git(ws, "config", "gpg.program", "false")
    with pytest.raises(PrimefsError) as err:
        harness.revert(ws, sha)
    msg = str(err.value)
    assert msg.startswith(f"cannot revert {sha[:10]} (harness(note/n): add - hello): git revert failed: ")
    assert "gpg failed to sign the data" in msg and "failed to write commit object" in msg  # not cut
    assert "\n" not in msg and "hint:" not in msg
    assert head(ws) == sha and clean(ws) and h.get("note", "n").body == "hello\n"


def test_an_agent_may_not_change_what_a_person_wrote(ws, h):
    """A kernel (source "agent") replaced a skill a person had made, and every session that imported it ran
    the kernel's code as itself (found by an attack). Entries a person wrote (`harness put`, or by hand)
    are the person's: an agent may add its own, and change its own and other agents'."""
    h.put("skill", "greet", "Say hello.", description="Greets", files={"greet.py": "def hello():\n    return 'hi'\n"},
          source="user")
    (ws.harness / "notes" / "hand.md").write_text("---\nname: hand\n---\nWritten by hand.\n")
    harness.commit_user_edits(ws)
    before = head(ws)
    for change in (lambda: h.put("skill", "greet", None, files={"greet.py": "import os\n"}, session="s1"),
                   lambda: h.put("note", "hand", "Rewritten.", session="s1"),
                   lambda: h.delete("skill", "greet", session="s1"),
                   lambda: h.delete("note", "hand", session="s1")):
        with pytest.raises(PrimefsError, match="written by a person"):
            change()
    assert head(ws) == before and "return 'hi'" in (ws.harness / "skills" / "greet" / "greet.py").read_text()
    h.put("note", "mine", "An agent's note.", session="s1")
    assert h.put("note", "mine", "Another agent's edit.", session="s2") is not None
    assert h.delete("note", "mine", session="s2") is not None
    assert h.put("note", "hand", "The person's edit.", source="user") is not None  # the person, always
