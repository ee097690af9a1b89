"""What makes a saved folder (a checkpoint, a saved model) data that is checked before it is used.

`manifest.json` records each file's size and SHA-256, so that any changed, cut or swapped byte of a
file it covers is refused as damaged or edited. A hash catches damage, not a forger who recomputes
it: the readers check their documents' schema on their own. `parse_json` reads a document strictly
(no NaN or Infinity, no repeated key, nesting refused cleanly), and `array_names` lists the arrays
a document names, which must be the writer's `a0, a1, ...` in document order: arrays renamed or
swapped in the JSON are refused even with a recomputed hash.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

__all__ = ["FORMAT", "NAME", "array_names", "check", "check_array_names", "parse_json", "write"]

NAME, FORMAT = "manifest.json", "dasknn-manifest"


def _entry(blob: bytes) -> dict[str, Any]:
    return {"bytes": len(blob), "sha256": hashlib.sha256(blob).hexdigest()}


def write(folder: str | os.PathLike, names: tuple[str, ...]) -> None:
    """Write `folder`/manifest.json over the files `names` of `folder` (flushed and fsynced)."""
    folder = Path(folder)
    doc = {"format": FORMAT, "files": {name: _entry((folder / name).read_bytes()) for name in names}}
    with open(folder / NAME, "wb") as f:
        f.write(json.dumps(doc, indent=1).encode())
        f.flush()
        os.fsync(f.fileno())


def check(folder: str | os.PathLike, names: tuple[str, ...], blobs: dict[str, bytes]) -> str:
    """What is wrong with `folder`'s files `names` (their bytes in `blobs`) against its manifest:
    "" when they match it, or when there is no manifest (the caller decides whether one is due)."""
    path = Path(folder) / NAME
    if not path.exists():
        return ""
    try:
        doc = parse_json(path.read_bytes())
        files = doc["files"]
        ok = doc["format"] == FORMAT and isinstance(files, dict) and set(doc) == {"format", "files"}
    except (OSError, ValueError, KeyError, TypeError) as err:
        return f"{NAME} is unreadable ({err}): damaged or edited"
    if not ok or set(files) != set(names):
        return f"{NAME} does not list the files {sorted(names)}: damaged or edited"
    for name in names:
        if files[name] != _entry(blobs[name]):
            return f"{name} does not match its size and SHA-256 in {NAME}: damaged or edited"
    return ""


def _refuse_constant(word: str) -> Any:
    raise ValueError(f"{word} is not a JSON number")


def _no_repeats(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)
    if len(out) != len(pairs):
        seen: set[str] = set()
        twice = next(k for k, _ in pairs if k in seen or seen.add(k))
        raise ValueError(f"the key {twice!r} appears twice in one object")
    return out


def parse_json(blob: bytes | str) -> Any:
    """The JSON document in `blob`, strictly: a ValueError for anything else, nesting too deep for
    Python included (a RecursionError never escapes)."""
    try:
        text = blob.decode() if isinstance(blob, bytes) else blob
        return json.loads(text, parse_constant=_refuse_constant, object_pairs_hook=_no_repeats)
    except RecursionError:
        raise ValueError("it is nested too deeply") from None
    except UnicodeDecodeError as err:
        raise ValueError(f"it is not UTF-8 text ({err})") from None


def array_names(obj: Any, out: list | None = None) -> list:
    """The `{"__array__": name}` references in `obj`, in document order."""
    out = [] if out is None else out
    stack = [obj]
    while stack:  # iterative: a deep document cannot overflow Python's stack here
        item = stack.pop()
        if isinstance(item, dict):
            if "__array__" in item:
                out.append(item["__array__"])
            stack.extend(reversed(list(item.values())))
        elif isinstance(item, list):
            stack.extend(reversed(item))
    return out


def check_array_names(names: list, stored: list[str]) -> str:
    """What is wrong with the arrays a document `names` (in document order) given the names `stored`
    in its arrays.npz: "" when they are the writer's a0, a1, ... in order, each stored once."""
    expected = [f"a{i}" for i in range(len(names))]
    if names != expected:
        at = next(i for i, (a, b) in enumerate(zip(names, expected, strict=False)) if a != b)
        return (
            f"its arrays are not named in the order they were written (array {at} is "
            f"{names[at]!r}, not {expected[at]!r}): renamed or edited"
        )
    if sorted(stored) != sorted(expected):
        extra = sorted(set(stored) - set(expected))
        missing = sorted(set(expected) - set(stored))
        return f"arrays.npz holds arrays {extra} it does not name, or lacks {missing}"
    return ""
