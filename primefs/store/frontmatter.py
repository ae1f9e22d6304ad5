"""Markdown files with YAML front matter, and YAML files: read and written with ruamel (comments kept).

Every workspace file is read through here: whatever is wrong with it (missing, a folder, a link out of
the workspace, too big, not UTF-8, bad or too deeply nested YAML) becomes one FileProblem that names
the file (and the line where YAML says), never another exception.
"""
from __future__ import annotations

import io
import os
import re
import stat
from pathlib import Path
from typing import Any

from ruamel.yaml import YAML
from ruamel.yaml.error import MarkedYAMLError, YAMLError
from ruamel.yaml.representer import RepresenterError

from primefs.errors import PrimefsError
from primefs.store.fsutil import open_regular


class FileProblem(PrimefsError):
    """A workspace file that cannot be used; the message names it and says why."""


class FrontMatterError(FileProblem):
    """Bad front matter or YAML; the message names the file and line."""


MAX_BYTES = 1_000_000  # front matter files and YAML a person writes: goals, harness entries, config
MAX_DEPTH = 32  # deeper nesting is never meant (and ruamel's recursion would crash on thousands)
MAX_VALUES = 200_000  # values after expanding YAML aliases (a "billion laughs" file)


def _why(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return f"{type(exc).__name__}: {exc}"


def read_text(path: Path, label: str | None = None, max_bytes: int = MAX_BYTES, root: Path | None = None) -> str:
    """A regular file's UTF-8 text. `root`: a symbolic link must point inside it."""
    label = label or str(path)
    try:
        if root is not None:  # the file, or a folder on its way, may be a link out of the workspace
            target = Path(path).resolve()
            if not target.is_relative_to(Path(root).resolve()):
                raise FileProblem(f"{label}: a symbolic link to {target}, outside the workspace")
        st = os.stat(path)
        if not stat.S_ISREG(st.st_mode):
            raise FileProblem(f"{label}: not a regular file")
        if st.st_size > max_bytes:
            raise FileProblem(f"{label}: {st.st_size:,} bytes, over the limit of {max_bytes:,}")
        with open_regular(path, follow=True) as f:  # never blocks (a FIFO swapped in after the stat)
            data = f.read(max_bytes + 1)
    except FileProblem:
        raise
    except (OSError, ValueError, RuntimeError) as exc:  # ENOENT, EISDIR, ENAMETOOLONG, NUL in path, loops
        raise FileProblem(f"{label}: cannot be read: {_why(exc)}") from None
    if len(data) > max_bytes:
        raise FileProblem(f"{label}: over the limit of {max_bytes:,} bytes")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise FileProblem(f"{label}: not UTF-8 text (byte {exc.start})") from None


_SURROGATE = re.compile("[\ud800-\udfff]")


def check_shape(data, label: str) -> Any:
    """Refuse deep nesting and alias bombs (iteratively: no recursion to exhaust)."""
    stack, seen = [(data, 1)], 0
    while stack:
        value, depth = stack.pop()
        seen += 1
        if seen > MAX_VALUES:
            raise FileProblem(f"{label}: too many values (over {MAX_VALUES:,}, YAML aliases included)")
        if isinstance(value, str):
            # a legal YAML escape ("\ud800") that no file, terminal or database can take
            if bad := _SURROGATE.search(value):
                raise FileProblem(f"{label}: a lone surrogate (\\u{ord(bad[0]):x}) is not text")
            continue
        if isinstance(value, dict):
            children = [*value.keys(), *value.values()]
        elif isinstance(value, (list, tuple)):
            children = list(value)
        else:
            continue
        if depth > MAX_DEPTH and children:
            raise FileProblem(f"{label}: nested deeper than {MAX_DEPTH} levels")
        stack.extend((c, depth + 1) for c in children)
    return data


def _flow_depth(raw: str) -> int:
    """How deep [ and { nest (quotes not considered: an overestimate, which only errs on the safe side)."""
    depth = best = 0
    for ch in re.findall(r"[\[\]{}]", raw):
        depth = depth + 1 if ch in "[{" else max(0, depth - 1)
        best = max(best, depth)
    return best


def _load(raw: str, label: str, safe: bool, line_offset: int):
    # ruamel takes minutes on a few thousand nested [ (found by fuzzing): refuse before parsing
    if _flow_depth(raw) > 2 * MAX_DEPTH:
        raise FileProblem(f"{label}: nested deeper than {MAX_DEPTH} levels")
    try:
        data = _safe_load(raw) if safe else yaml_rt().load(raw)
    except YAMLError as exc:
        raise _yaml_error(label, exc, line_offset) from None
    except RecursionError:
        raise FileProblem(f"{label}: YAML nested too deeply") from None
    except Exception as exc:  # noqa: BLE001 - ruamel can raise other things on strange input
        raise FileProblem(f"{label}: bad YAML: {_why(exc)}") from None
    return check_shape(data, label)


def _safe_load(raw: str):
    """The C parser (ruamel.yaml.clib) where it is installed: 4x faster on what primefs writes. What it refuses
    is parsed again by the pure one, which says what is wrong as it always did and accepts a little more
    (a lone surrogate's escape, which the caller then names)."""
    try:
        if _CSafeLoader is None:
            return YAML(typ="safe").load(raw)
        loader = _CSafeLoader(raw)
        try:
            return loader.get_single_data()
        finally:
            loader.dispose()
            loader.__dict__.clear()  # it refers to itself (as parser, composer, resolver's loader): no cycle left
    except Exception:  # noqa: BLE001 - the pure parser's verdict is the one given
        return YAML(typ="safe", pure=True).load(raw)


try:
    from ruamel.yaml.constructor import SafeConstructor
    from ruamel.yaml.cyaml import CParser
    from ruamel.yaml.resolver import VersionedResolver

    class _CSafeLoader(CParser, SafeConstructor, VersionedResolver):
        """What `YAML(typ="safe").load` puts together at each call (ruamel.yaml's main.py), put together once:
        there each load made a new loader class and the tables of YAML 1.2's implicit types, ~100 objects
        left for the cycle collector (a runner parses session.yaml and mail all day). 2-3x as fast."""
        _tables: dict = {}  # YAML version -> implicit types (filled once per version, then only read)

        def __init__(self, stream: str):
            CParser.__init__(self, stream)
            self._parser = self._composer = self
            SafeConstructor.__init__(self, loader=self)
            self.allow_duplicate_keys = False
            VersionedResolver.__init__(self, version=None, loadumper=self)
            self._version_implicit_resolver = self._tables

    _CSafeLoader("a: 1").get_single_data()  # the tables, built here (threads then only read them)
except Exception:  # noqa: BLE001 - no C parser, or a ruamel.yaml this does not fit: its own way
    _CSafeLoader = None


def loads_yaml(raw: str, label: str, safe: bool = False) -> Any:
    """YAML text already read (e.g. a member of an archive), checked as load_yaml checks a file."""
    return _load(raw, label, safe, 0)


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
    return FrontMatterError(f"{where}: bad YAML{' front matter' if line_offset else ''}: {problem}")


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
            data = _load(raw, str(path), safe, 1) if raw.strip() else {}
            if data is None:
                data = {}
            if not isinstance(data, dict):
                raise FrontMatterError(f"{path}:2: front matter must be a YAML mapping (key: value lines)")
            return data, body.lstrip("\n")
    raise FrontMatterError(f"{path}:1: front matter starts with '---' but has no closing '---'")


def read(path: Path, label: str | None = None, safe: bool = False, max_bytes: int = MAX_BYTES,
         root: Path | None = None) -> tuple[dict, str]:
    """`label` names the file in error messages (e.g. a workspace-relative path)."""
    label = label or str(path)
    return split(read_text(path, label, max_bytes, root), label, safe)


def dump(meta: dict[str, Any], body: str, safe: bool = False) -> str:
    """A file with front matter; `safe`: machine-written (dump_yaml)."""
    if not meta:
        return body
    return f"---\n{dump_yaml(meta, safe)}---\n{body}"


def load_yaml(path: Path, safe: bool = False, label: str | None = None, max_bytes: int = MAX_BYTES,
              root: Path | None = None) -> Any:
    label = label or str(path)
    return _load(read_text(path, label, max_bytes, root), label, safe, 0)


def dump_yaml(data: Any, safe: bool = False) -> str:
    """YAML text of `data`; `safe`: machine-written plain data (session.yaml, mail), through the safe representer,
    ~3x as fast as the round-trip one, which still takes what it refuses (ruamel's own types, from a round-trip
    load). A YAML object is made for each call: one kept per thread made a runner's memory grow twice as fast
    (bench/leaks.py, side by side)."""
    if safe:
        y = YAML(typ="safe")
        y.default_flow_style = False
        y.sort_base_mapping_type_on_output = False
        y.width = 4096
        try:
            return _dumped(y, data)
        except RepresenterError:
            pass
    return _dumped(yaml_rt(), data)


def _dumped(y: YAML, data: Any) -> str:
    buf = io.StringIO()
    y.dump(data, buf)
    return buf.getvalue()
