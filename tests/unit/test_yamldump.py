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



SAFE_CASES = [
    "sandbox: off\nx: yes\ny: 010\nz: 0o10\nd: 2026-12-06\nt: 2026-12-06T19:17:00Z\nf: 1e3\nn: ~\nb: true\n",
    "a: &x [1, 2]\nb: *x\n", "<<: {a: 1}\nb: 2\n", "- 1\n- 2.5\n- .inf\n", "k: 'quoted'\nm: \"\\u00e9\"\n",
    "%YAML 1.1\n---\nx: yes\n", "x: !!binary aGVsbG8=\n", "just text", "{a: [b, {c: d}]}", "",
    "a: 1\na: 2\n", "a: [1\n", "x: \"\\ud800\"\n", "x: !!python/object:os.system echo\n",
]


@pytest.mark.parametrize("raw", SAFE_CASES)
def test_the_safe_load_gives_what_ruamels_safe_load_gives(raw):
    """Machine-written YAML is read by ruamel's C loader put together once (frontmatter._CSafeLoader), not at
    each load: the same values, the same errors, YAML 1.2's types (`off` stays a string)."""
    from ruamel.yaml import YAML

    from primefs.store.frontmatter import _safe_load

    def outcome(load):
        try:
            return repr(load(raw))
        except Exception as exc:  # noqa: BLE001 - compared, whatever it is
            return type(exc).__name__

    assert outcome(_safe_load) == outcome(lambda r: YAML(typ="safe").load(r) if "ud800" not in r
                                          else YAML(typ="safe", pure=True).load(r))


def test_a_safe_load_leaves_nothing_for_the_cycle_collector():
    """ruamel's own safe load made a loader class and YAML 1.2's tables at each call: ~100 objects in cycles,
    freed only by the cycle collector, in a runner that reads session.yaml and mail all day; primefs's own
    loader then still left itself (it refers to itself), 5 objects a load. Counted in a process of its own:
    in this one, other tests' threads make garbage too."""
    import subprocess
    import sys

    from primefs.store.frontmatter import _CSafeLoader

    assert _CSafeLoader is not None  # ruamel.yaml.clib is a dependency
    code = ("import gc\nfrom primefs.store.frontmatter import _safe_load\n"
            "raw = \"id: 1733512345.abcdef12\\nfrom: user\\nkind: user\\ncreated: '2026-12-06T19:17:00+00:00'\\n\"\n"
            "_safe_load(raw)\ngc.collect()\ngc.disable()\nfor _ in range(100):\n    _safe_load(raw)\n"
            "print(gc.collect())\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert int(out.stdout) < 100, out.stdout  # (5 a load before)
