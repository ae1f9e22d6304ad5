"""Markdown files with YAML front matter, read and written with ruamel (comments kept)."""
from __future__ import annotations

import io
from pathlib import Path
from typing import Any

from ruamel.yaml import YAML
from ruamel.yaml.error import MarkedYAMLError, YAMLError

from .errors import PrimefsError


class FrontMatterError(PrimefsError):
    """Bad front matter; the message names the file and line."""


def yaml_rt() -> YAML:
    y = YAML()  # round-trip: keeps comments and key order
    y.preserve_quotes = True
    y.width = 4096
    return y


def _yaml_error(path: Path | str, exc: YAMLError, line_offset: int) -> FrontMatterError:
    mark = getattr(exc, "problem_mark", None) if isinstance(exc, MarkedYAMLError) else None
    line = (mark.line + 1 + line_offset) if mark is not None else None
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    where = f"{path}:{line}" if line else f"{path}"
    return FrontMatterError(f"{where}: bad YAML front matter: {problem}")


def split(text: str, path: Path | str = "<text>", safe: bool = False) -> tuple[dict, str]:
    """Return (front matter mapping, body). No front matter: ({}, text).

    `safe`: plain dicts, about twice as fast; for machine-written files nobody edits in place."""
    if not text.startswith("---"):
        return {}, text
    lines = text.split("\n")
    if lines[0].strip() != "---":
        return {}, text
    for i in range(1, len(lines)):
        if lines[i].strip() in ("---", "..."):
            raw = "\n".join(lines[1:i])
            body = "\n".join(lines[i + 1:])
            try:
                data = (YAML(typ="safe") if safe else yaml_rt()).load(raw) if raw.strip() else {}
            except YAMLError as exc:
                raise _yaml_error(path, exc, line_offset=1) from None
            if data is None:
                data = {}
            if not isinstance(data, dict):
                raise FrontMatterError(f"{path}:2: front matter must be a YAML mapping (key: value lines)")
            return data, body.lstrip("\n")
    raise FrontMatterError(f"{path}:1: front matter starts with '---' but has no closing '---'")


def read(path: Path, label: str | None = None, safe: bool = False) -> tuple[dict, str]:
    """`label` names the file in error messages (e.g. a workspace-relative path)."""
    label = label or str(path)
    try:
        text = Path(path).read_bytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        raise PrimefsError(f"{label}: not UTF-8 text (byte {exc.start})") from None
    return split(text, label, safe)


def dump(meta: dict[str, Any], body: str) -> str:
    if not meta:
        return body
    buf = io.StringIO()
    yaml_rt().dump(meta, buf)
    return f"---\n{buf.getvalue()}---\n{body}"


def load_yaml(path: Path, safe: bool = False) -> Any:
    try:
        return (YAML(typ="safe") if safe else yaml_rt()).load(Path(path).read_text(encoding="utf-8"))
    except YAMLError as exc:
        raise _yaml_error(path, exc, line_offset=0) from None
    except UnicodeDecodeError:
        raise PrimefsError(f"{path}: not UTF-8 text") from None


def dump_yaml(data: Any, safe: bool = False) -> str:
    buf = io.StringIO()
    if safe:
        y = YAML(typ="safe")
        y.default_flow_style = False
        y.sort_base_mapping_type_on_output = False
        y.width = 4096
        y.dump(data, buf)
    else:
        yaml_rt().dump(data, buf)
    return buf.getvalue()
