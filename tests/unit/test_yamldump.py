"""Machine-written YAML (session.yaml, mail front matter) goes through ruamel's safe representer. What it
refuses (ruamel's own types, from a round-trip load, such as a quoted name in a goal's front matter) goes through
the round-trip one, and a failed dump leaves nothing behind that breaks the next."""
from __future__ import annotations

import pytest
from ruamel.yaml.representer import RepresenterError

from primefs.store.frontmatter import dump, dump_yaml, load_yaml, split, yaml_rt


def test_safe_dump_takes_round_trip_types_and_keeps_working_after_a_failure(tmp_path):
    quoted = yaml_rt().load('name: "e1"\ntags: [a, b]\n')
    assert dump_yaml(quoted, safe=True) == 'name: "e1"\ntags: [a, b]\n'
    plain = {"id": "x", "parent": None, "depth": 1, "created": "2026-12-06T01:30:13.709+00:00", "n": [1, 2]}
    text = dump_yaml(plain, safe=True)
    assert text == "id: x\nparent: null\ndepth: 1\ncreated: '2026-12-06T01:30:13.709+00:00'\nn:\n- 1\n- 2\n"
    with pytest.raises(RepresenterError):
        dump_yaml({"a": object()})
    assert dump_yaml(plain, safe=True) == text and dump_yaml({"a": 1}) == "a: 1\n"
    (tmp_path / "s.yaml").write_text(text)
    assert load_yaml(tmp_path / "s.yaml", safe=True) == plain
    meta, body = split(dump({"from": "a", "kind": "result", "to": quoted["name"]}, "hello\n", safe=True))
    assert meta == {"from": "a", "kind": "result", "to": "e1"} and body == "hello\n"

