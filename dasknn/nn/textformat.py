"""Protobuf text format, read by our own small parser into plain dicts (no protobuf dependency).

Every field maps to a list of its values (fields may repeat); scalars are typed (int, float, bool,
str), enum names stay strings, nested messages are dicts. Malformed input raises `PrototxtError`
with line and column, never another exception type.
"""

from __future__ import annotations

import bisect
import math
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

MAX_DEPTH = 100  # protobuf's own default recursion limit for text format


class PrototxtError(ValueError):
    """A malformed or unsupported prototxt; syntax errors carry `line` and `column` (1-based)."""

    def __init__(
        self, message: str, line: int | None = None, column: int | None = None, source: str | None = None
    ) -> None:
        self.message, self.line, self.column, self.source = message, line, column, source
        where = "" if line is None else f"line {line}:{column}: "
        super().__init__(f"{source}, {where}{message}" if source else f"{where}{message}")


class Message(dict):
    """A parsed message, {field: [values]}, that also keeps where each value was written:
    `positions` {field: [(line, column) per value]} and, on the outermost message, `source`."""

    def __init__(self) -> None:
        super().__init__()
        self.positions: dict[str, list[tuple[int, int]]] = {}
        self.source: str | None = None


# -- text format ----------------------------------------------------------------------------------
_TOKEN = re.compile(
    r"""(?P<skip>[ \t\r\n\f\v]+|\#[^\n]*)
    |(?P<str>"(?:[^"\\\n]|\\.)*"|'(?:[^'\\\n]|\\.)*')
    |(?P<num>-?(?:0[xX][0-9a-fA-F]+|(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?[fF]?)(?![\w.]))
    |(?P<ident>-?[A-Za-z_]\w*)
    |(?P<punct>[{}<>\[\]:,;])""",
    re.VERBOSE | re.ASCII,
)
_ESCAPE = re.compile(
    r"\\(?:([0-7]{1,3})|x([0-9a-fA-F]{1,2})|u([0-9a-fA-F]{4})|U([0-9a-fA-F]{8})|(.))", re.DOTALL
)
_SIMPLE_ESCAPES = {
    "n": "\n",
    "t": "\t",
    "r": "\r",
    "a": "\a",
    "b": "\b",
    "f": "\f",
    "v": "\v",
    "\\": "\\",
    "'": "'",
    '"': '"',
    "?": "?",
}
_CLOSERS = {"{": "}", "<": ">"}


def _position(text: str, pos: int) -> tuple[int, int]:
    return text.count("\n", 0, pos) + 1, pos - text.rfind("\n", 0, pos)


def _tokenize(text: str, error) -> list[tuple[str, str, int]]:
    """(kind, text, offset) of every token, then an "end" token; comments and blanks skipped."""
    tokens, pos = [], 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None:
            char = text[pos]
            raise error(
                "unterminated string"
                if char in "\"'"
                else "malformed number"
                if char in "-.0123456789"
                else f"unexpected character {char!r}",
                pos,
            )
        if m.lastgroup != "skip":
            tokens.append((m.lastgroup, m.group(), pos))
        pos = m.end()
    return [*tokens, ("end", "end of input", len(text))]


def _unquote(body: str, error) -> str:
    """The text of a quoted string's body with C escapes; octal and hex escapes are UTF-8 bytes."""
    out, last = bytearray(), 0
    try:
        for m in _ESCAPE.finditer(body):
            out += body[last : m.start()].encode("utf-8", "surrogatepass")
            octal, hexa, u4, u8, simple = m.groups()
            if octal or hexa:
                if int(octal or "0", 8) > 255:
                    raise error(f"octal escape \\{octal} is above \\377")
                out.append(int(octal, 8) if octal else int(hexa, 16))
            elif u4 or u8:
                out += chr(int(u4 or u8, 16)).encode("utf-8", "surrogatepass")
            elif simple in _SIMPLE_ESCAPES:
                out += _SIMPLE_ESCAPES[simple].encode()
            else:
                raise error(f"unknown escape \\{simple} in a string")
            last = m.end()
        return (out + body[last:].encode("utf-8", "surrogatepass")).decode("utf-8")
    except PrototxtError:
        raise
    except ValueError:  # chr() out of range, invalid UTF-8, lone surrogates
        raise error("string is not valid UTF-8 text") from None


def _scalar(kind: str, text: str, error) -> Any:
    """Typed value of one scalar token: int, float, bool, str, or an enum name kept as str."""
    if kind == "str":
        return _unquote(text[1:-1], error)
    body = text.lstrip("-")
    if kind == "num":
        if body[:2] in ("0x", "0X"):
            return int(text[: len(text) - len(body)] + body[2:], 16)
        if any(c in body for c in ".eEfF"):
            return float(text.rstrip("fF"))
        if len(body) > 1 and body[0] == "0" and not set(body) <= set("01234567"):
            raise error(f"invalid octal number {text}")
        return int(text, 8 if body[0] == "0" else 10)
    if text in ("true", "True", "false", "False"):
        return text in ("true", "True")
    if body.lower() in ("inf", "infinity", "nan"):
        return float(text)
    if text[0] == "-":
        raise error(f"'-' must precede a number, got {text!r}")
    return text


class _Tokens:
    """The tokens of one text, with what the parser asks of them: where an offset lies (line,
    column), which punctuation a token is, a scalar value, and the error naming a place."""

    def __init__(self, text: str, source: str | None) -> None:
        self.text, self.source = text, source
        self.tokens = _tokenize(text, self.error)
        self.newlines = [m.start() for m in re.finditer("\n", text)]

    def error(self, message: str, pos: int) -> PrototxtError:
        return PrototxtError(message, *_position(self.text, pos), source=self.source)

    def where(self, pos: int) -> tuple[int, int]:
        line = bisect.bisect_left(self.newlines, pos)
        return line + 1, pos - (self.newlines[line - 1] if line else -1)

    def punct(self, j: int, chars: str) -> bool:
        return self.tokens[j][0] == "punct" and self.tokens[j][1] in chars

    def value_at(self, j: int) -> tuple[Any, int]:
        """The scalar at token j (adjacent strings joined) and the index after it."""
        tokens, error = self.tokens, self.error
        kind, tok, pos = tokens[j]
        if kind not in ("num", "ident", "str"):
            raise error(f"expected a value, got {tok!r}", pos)
        value = _scalar(kind, tok, lambda m: error(m, pos))
        while kind == "str" and tokens[j + 1][0] == "str":
            j += 1
            value += _scalar("str", tokens[j][1], lambda m, at=tokens[j][2]: error(m, at))
        return value, j + 1

    def scalars(self, i: int, field: str, pos: int, values: list, positions: list) -> int:
        """The value of `field: v` or the values of `field: [v, ...]` at token i, appended to
        `values` (their places to `positions`); the index after them."""
        tokens = self.tokens
        bracketed = self.punct(i, "[")
        i += bracketed
        while not (bracketed and self.punct(i, "]")):
            positions.append(self.where(tokens[i][2] if bracketed else pos))
            value, i = self.value_at(i)
            values.append(value)
            if not bracketed:
                break
            if not self.punct(i, ",]"):
                raise self.error(f"expected ',' or ']' in list {field!r}, got {tokens[i][1]!r}", tokens[i][2])
            i += self.punct(i, ",")
        return i + bracketed


def parse_prototxt(text: str, source: str | None = None) -> dict[str, list]:
    """Parse protobuf text format into a message: {field name: [values in file order]}.

    Every field maps to a list (a schema-free reader cannot tell repeated fields; `get_one` takes
    the single value of an optional one). Values are int (also hex, octal), float (`1e-4`, `-.5`,
    `inf`, `nan`), bool (`true`/`false`), str (either quote, C escapes, adjacent strings joined),
    enum names such as `MAX` as str, or nested messages (`name { }`, `name: { }`, `name < >`) as
    dicts. `#` starts a comment; `,` or `;` may end a field; `field: [1, 2]` lists scalars.
    Malformed input raises `PrototxtError` with line:column (after `source`, when given); messages
    may nest MAX_DEPTH deep. Each message is a `Message`, which also records where its values are.
    The parser is a loop over tokens with an explicit stack: no recursion.
    """
    if not isinstance(text, str):
        raise TypeError(f"parse_prototxt takes text (str), got {type(text).__name__}")
    reader = _Tokens(text, source)
    tokens, error, punct = reader.tokens, reader.error, reader.punct
    stack: list[tuple[Message, str, int]] = [(Message(), "", 0)]  # (message, its closer, its offset)
    stack[0][0].source = source
    i = 0
    while tokens[i][0] != "end":
        kind, tok, pos = tokens[i]
        message, closer, _ = stack[-1]
        if punct(i, "}>"):
            if tok != closer:
                raise error(f"unexpected {tok!r}" + (f", expected {closer!r}" if closer else ""), pos)
            stack.pop()
            i += 1
        elif kind != "ident" or tok[0] == "-":
            raise error(f"expected a field name, got {tok!r}", pos)
        else:
            has_colon = punct(i + 1, ":")
            i += 1 + has_colon
            values, positions = message.setdefault(tok, []), message.positions.setdefault(tok, [])
            if punct(i, "{<"):
                if len(stack) > MAX_DEPTH:
                    raise error(f"messages nested deeper than {MAX_DEPTH} levels", tokens[i][2])
                values.append(Message())
                positions.append(reader.where(pos))
                stack.append((values[-1], _CLOSERS[tokens[i][1]], tokens[i][2]))
                i += 1
                continue
            if not has_colon:
                raise error(f"expected ':' or '{{' after field {tok!r}, got {tokens[i][1]!r}", tokens[i][2])
            i = reader.scalars(i, tok, pos, values, positions)
        i += punct(i, ",;")
    if len(stack) > 1:
        raise error(f"'{'{' if stack[-1][1] == '}' else '<'}' opened here is never closed", stack[-1][2])
    return stack[0][0]


def get_one(message: Mapping[str, list], field: str, default: Any = None) -> Any:
    """The single value of an optional field, `default` if absent; PrototxtError if repeated."""
    return get_typed(message, field, None, default, "message")


def get_typed(message: Mapping[str, list], field: str, kind: Any, default: Any, where: str) -> Any:
    values = message.get(field) or []
    if len(values) > 1:
        raise PrototxtError(f"{where}: field '{field}' is given {len(values)} times")
    if not values:
        return default
    return values[0] if kind is None else _coerce(values[0], kind, f"{where}: field '{field}'")


def get_all_typed(message: Mapping[str, list], field: str, kind: Any, where: str) -> list:
    return [_coerce(v, kind, f"{where}: field '{field}'") for v in message.get(field, [])]


_KIND_NAMES = {
    "float": "a number",
    "int": "an integer",
    "uint": "an integer >= 0",
    "bool": "true or false",
    "str": "a string",
    "msg": "a message { ... }",
}


def _coerce(value: Any, kind: Any, what: str) -> Any:
    """`value` as `kind`: "float", "int", "uint", "bool", "str", "msg" or a tuple of enum names."""
    integer = type(value) is int
    if kind == "float" and (integer or type(value) is float):
        if not math.isfinite(value):  # no Caffe setting means anything as inf or nan
            raise PrototxtError(f"{what} must be a finite number, got {value!r}")
        return float(value)
    if (kind == "int" and integer) or (kind == "uint" and integer and value >= 0):
        return value
    if kind == "bool" and (type(value) is bool or (integer and value in (0, 1))):
        return bool(value)
    if (kind == "str" and isinstance(value, str)) or (kind == "msg" and isinstance(value, dict)):
        return value
    if isinstance(kind, tuple):  # an enum: by name, or by number (Caffe's values are 0, 1, ...)
        if (isinstance(value, str) and value in kind) or (integer and 0 <= value < len(kind)):
            return value if isinstance(value, str) else kind[value]
        kind = "one of " + ", ".join(kind)
    raise PrototxtError(f"{what} must be {_KIND_NAMES.get(kind, kind)}, got {value!r}")


def _is_path(text: str) -> bool:
    """Whether a str passed as a net or solver is a path: one line ending in .prototxt or naming a file."""
    if "\n" in text or text.endswith(".prototxt"):
        return "\n" not in text
    try:
        return Path(text).is_file()
    except (OSError, ValueError):  # too long, or NUL bytes: no file
        return False


def load_message(source: str | os.PathLike | Mapping) -> Mapping:
    """A message from a path, prototxt text, or a message from `parse_prototxt` (passed through).

    A str is a path when it is one line that ends in ".prototxt" or names a file; otherwise text.
    """
    if isinstance(source, Mapping):
        return source
    if isinstance(source, str) and not _is_path(source):
        try:
            return parse_prototxt(source)
        except PrototxtError as err:
            if "\n" in source or {":", "{"} & set(source):
                raise
            raise PrototxtError(
                f"{err.message} (read as text: there is no file {source!r})", err.line, err.column
            ) from None
    try:
        return parse_prototxt(Path(source).read_text(encoding="utf-8"), source=str(source))
    except UnicodeDecodeError as err:
        raise PrototxtError(
            f"not UTF-8 text ({err.reason} at byte {err.start})", source=str(source)
        ) from None
