"""Reading a cluster file without trusting it: the bytes to plain data, or a SpecFileError.

    data = read_data(Path("clusters/localhost.yaml"))   # dict, list, str, ... as YAML/JSON gives

What this refuses, each with a message naming the file (and the line where there is one):
anything but a regular file (a FIFO would block, /dev/zero never ends), more than
MAX_FILE_BYTES (MAX_JSON_BYTES for JSON), bytes that are not UTF-8, nesting deeper than
MAX_DEPTH (the parsers recurse), YAML anchors and aliases (`&a`/`*a`: a few lines can
expand to gigabytes), and a key given twice in one YAML mapping (the last one would win
silently).
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

import yaml

MAX_FILE_BYTES = 1024 * 1024
# JSON has no aliases to expand, and a run's plan.json (`tfo run plan.json`) takes ~1.5 KB a
# task: 1,000 tasks on lab hosts are 1.5 MB.
MAX_JSON_BYTES = 64 * 1024 * 1024
MAX_DEPTH = 64
_MERGE_TAG = "tag:yaml.org,2002:merge"


class SpecFileError(Exception):
    """The file cannot be read as a cluster file; the message names it."""


def read_data(path: Path) -> Any:
    text = _read_text(path)
    if path.suffix == ".json":
        return _parse_json(path, text)
    return _parse_yaml(path, text)


def _read_text(path: Path) -> str:
    try:
        # O_NONBLOCK: opening a FIFO must not wait for a writer; it is refused below.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise SpecFileError(f"{path}: no such cluster file") from None
    except OSError as err:
        raise SpecFileError(f"{path}: cannot read: {err.strerror}") from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise SpecFileError(f"{path}: not a regular file ({_kind(mode)}); give the path of "
                            "a YAML or JSON cluster file")
    limit = MAX_JSON_BYTES if path.suffix == ".json" else MAX_FILE_BYTES
    with os.fdopen(fd, "rb") as f:
        try:
            data = f.read(limit + 1)
        except OSError as err:
            raise SpecFileError(f"{path}: cannot read: {err.strerror}") from None
    if len(data) > limit:
        raise SpecFileError(f"{path}: larger than {limit:,} bytes; a cluster file is "
                            "a few lines (put large job data in a file of its own)")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        before = data[:err.start]
        line, column = before.count(b"\n") + 1, err.start - (before.rfind(b"\n") + 1) + 1
        raise SpecFileError(f"{path}: not UTF-8 text: byte 0x{data[err.start]:02x} at line "
                            f"{line}, column {column}; save the file as UTF-8") from None


def _kind(mode: int) -> str:
    kinds = [(stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"),
             (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
             (stat.S_ISSOCK, "a socket")]
    return next((name for test, name in kinds if test(mode)), "not a plain file")


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    seen: set[str] = set()
    for key, _ in pairs:
        if key in seen:
            raise _DuplicateKey(key)
        seen.add(key)
    return dict(pairs)


class _DuplicateKey(Exception):
    pass


def _parse_json(path: Path, text: str) -> Any:
    try:
        data = json.loads(text, object_pairs_hook=_unique_keys)
    except _DuplicateKey as err:
        raise SpecFileError(f"{path}: duplicate key {err.args[0]!r} in one object; give each "
                            "key once") from None
    except json.JSONDecodeError as err:
        raise SpecFileError(f"{path}: not valid JSON at line {err.lineno}, column {err.colno}: "
                            f"{err.msg}") from None
    except RecursionError:
        raise SpecFileError(f"{path}: nested more than {MAX_DEPTH} levels deep") from None
    except ValueError as err:  # e.g. an integer of more digits than Python converts
        raise SpecFileError(f"{path}: not valid JSON: {err}") from None
    if _depth(data) > MAX_DEPTH:
        raise SpecFileError(f"{path}: nested more than {MAX_DEPTH} levels deep")
    return data


def _depth(data: Any) -> int:
    """How deeply lists and dicts nest; iterative, so any depth is measured safely."""
    deepest, stack = 0, [(data, 1)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, dict | list):
            deepest = max(deepest, depth)
            stack.extend((v, depth + 1) for v in (value.values() if isinstance(value, dict)
                                                   else value))
    return deepest


class _Refused(yaml.MarkedYAMLError):
    """Valid YAML we do not accept in a cluster file."""


class _StrictLoader(yaml.SafeLoader):
    """yaml.safe_load without anchors and aliases, duplicate keys or deep nesting."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        event = self.peek_event()
        if event.anchor is not None:
            sign = "*" if isinstance(event, yaml.AliasEvent) else "&"
            raise _Refused(problem=f"YAML anchors and aliases ({sign}{event.anchor}) are not "
                           "accepted in a cluster file; write the value out",
                           problem_mark=event.start_mark)
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                raise _Refused(problem=f"nested more than {MAX_DEPTH} levels deep",
                               problem_mark=event.start_mark)
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> Any:
        if isinstance(node, yaml.MappingNode):
            first: dict[Any, yaml.Node] = {}
            for key_node, _ in node.value:
                if key_node.tag == _MERGE_TAG:
                    continue
                key = self.construct_object(key_node, deep=True)
                try:
                    earlier = first.setdefault(key, key_node)
                except TypeError:  # unhashable: the base class says so
                    continue
                if earlier is not key_node:
                    raise _Refused(problem=f"duplicate key {key!r} (first at line "
                                   f"{earlier.start_mark.line + 1}); give each key once",
                                   problem_mark=key_node.start_mark)
        return super().construct_mapping(node, deep=deep)


def _parse_yaml(path: Path, text: str) -> Any:
    loader = None
    try:
        loader = _StrictLoader(text)  # checks for unprintable characters at once
        return loader.get_single_data()
    except _Refused as err:
        mark = err.problem_mark
        raise SpecFileError(f"{path}: line {mark.line + 1}, column {mark.column + 1}: "
                            f"{err.problem}") from None
    except yaml.reader.ReaderError as err:
        line = text.count("\n", 0, err.position) + 1
        raise SpecFileError(f"{path}: not valid YAML at line {line}: character "
                            f"#x{err.character:04x} is not allowed in YAML text") from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(err, "problem", None) or str(err)
        raise SpecFileError(f"{path}: not valid YAML{where}: {problem}") from None
    except ValueError as err:  # e.g. an integer of more digits than Python converts
        raise SpecFileError(f"{path}: not valid YAML: {err}") from None
    finally:
        if loader is not None:
            loader.dispose()
