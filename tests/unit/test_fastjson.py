"""orjson where it is fast, json where orjson refuses: nothing that encoded or decoded before fails now."""
import json

from primefs.store import fastjson


def test_what_orjson_refuses_goes_through_json():
    odd = {"name": "a\ud800b", "big": 2 ** 70, 3: "an int key", "when": object}  # surrogate, >64-bit, non-str key
    assert json.loads(fastjson.dumps(odd))["big"] == 2 ** 70
    assert fastjson.loads('{"x": NaN}')["x"] != fastjson.loads('{"x": NaN}')["x"]  # NaN, as json reads it
    plain = {"id": "s1", "usage": {"calls": 2, "cost_usd": 0.5}, "result": "é ✓", "n": None}
    line = fastjson.dumps(plain)
    assert "\n" not in line and json.loads(line) == plain and fastjson.loads(line) == plain
    assert "é ✓" in line  # UTF-8 as is, not \u escapes
