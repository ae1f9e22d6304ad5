"""store/approvals.py on its own: the `approve:` policy (checked, merged) and the request files."""
from __future__ import annotations

import pytest

from primefs.errors import PrimefsError
from primefs.store import approvals
from primefs.store.approvals import check_approve, policy


def test_a_goal_adds_to_the_workspace_policy_and_never_loosens_it():
    ws = check_approve({"cells": ["network"], "children": 5, "default": "approve", "timeout_s": 600}, "primefs.yaml")
    goal = check_approve({"cells": "shutil\\.rmtree", "tools": ["send_mail"], "children": 2, "cost_usd": 1},
                         "goals/g.md")
    p = policy(ws, goal)
    assert p.cells == ("network", "shutil\\.rmtree") and p.tools == {"send_mail"} and p.children == 2
    assert p.cost_usd == (1.0,) and p.timeout_s == 600 and p.default == "deny"  # the goal's default: deny
    assert p.cell_rule("import urllib.request") == "network" and p.cell_rule("shutil.rmtree('x')") == "shutil\\.rmtree"
    assert p.cell_rule("print('networking')") is None  # a shorthand matches names, not any text
    assert not policy(None, None) and policy(None, {"children": 0, "default": "deny"})


@pytest.mark.parametrize("value, words", [
    ("yes", "`approve:` must be a mapping"),
    ({"tools": [1]}, "approve.tools must be a list of tool names"),
    ({"cells": [""]}, "approve.cells must be a list of patterns"),
    ({"children": True}, "approve.children must be a whole number"),
    ({"cost_usd": [-1]}, "approve.cost_usd must be a cost in USD"),
])
def test_bad_values_name_the_setting(value, words):
    with pytest.raises(PrimefsError, match="goals/g.md: ") as exc:
        check_approve(value, "goals/g.md")
    assert words in str(exc.value)


def test_request_files_are_numbered_listed_and_answered(tmp_path):
    approvals.write(tmp_path, 1, {"n": 1, "status": "waiting", "what": "run a cell"},
                    "# Approval 1\n\n```python\nx = 1\n```\n")
    (tmp_path / "approvals" / "2.md").write_text("---\nstatus: [\n---\n")
    assert approvals.numbers(tmp_path) == [1, 2]
    rows = approvals.listing(tmp_path)
    assert rows[0]["status"] == "waiting" and rows[1]["status"] == "broken" and "approvals/2.md" in rows[1]["problem"]
    assert [r["n"] for r in approvals.listing(tmp_path, waiting_only=True)] == [1]
    approvals.answered(tmp_path, 1, "denied", by="ann", via="cli", reason="no")
    meta, body = approvals.read(tmp_path, 1)
    assert (meta["status"], meta["by"], meta["reason"]) == ("denied", "ann", "no")
    assert approvals.code_of(body) == "x = 1"
    assert body.rstrip().endswith("denied by ann: no")
