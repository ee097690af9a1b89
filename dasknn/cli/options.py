"""What the commands' parsers share: argparse with an option error in one line, and the argparse
types of more than one command."""

from __future__ import annotations

import argparse
import math
from pathlib import Path

from dasknn.cli.exits import EXIT_BAD_INPUT


class Parser(argparse.ArgumentParser):
    """argparse with an option error in one line and a pointer to --help (not the usage block)."""

    def error(self, message: str):
        self.exit(
            EXIT_BAD_INPUT, f"{self.prog}: error: {' '.join(message.split())}; see `{self.prog} --help`\n"
        )

    def parse_known_args(self, args=None, namespace=None):
        """argparse takes `--flag=--` as an empty list, past its choices and type: refused here."""
        namespace, extras = super().parse_known_args(args, namespace)
        for action in self._actions:
            value = getattr(namespace, action.dest, None)
            if action.option_strings and action.nargs is None and isinstance(value, list) and not value:
                self.error(f"argument {'/'.join(action.option_strings)}: expected one value, got '--'")
        return namespace, extras


def positive(kind):
    """An argparse type: a finite `kind` > 0."""

    def parse(text):
        value = kind(text)
        if not (value > 0 and math.isfinite(value)):
            raise argparse.ArgumentTypeError(f"must be > 0 and finite, got {text}")
        return value

    parse.__name__ = kind.__name__
    return parse


def file_to_write(what: str, suffixes: tuple[str, ...]):
    """An argparse type: a file ending in one of `suffixes`, in a folder (one that cannot be
    written: exit 5, local I/O, when the command writes)."""

    def parse(text: str) -> str:
        path = Path(text)
        if path.suffix not in suffixes:
            ends = " or ".join(suffixes)
            raise argparse.ArgumentTypeError(f"the {what} must end in {ends}, got {text!r}")
        folder = path.resolve().parent
        if not folder.is_dir() or path.is_dir():
            raise argparse.ArgumentTypeError(f"cannot write {text!r}: {folder} is not a folder")
        return text

    return parse


def add_model_flag(parser) -> None:
    """`--model`, the saved model's folder, as `dasknn predict` and `dasknn export` take it."""
    parser.add_argument("--model", required=True, help="the saved model's folder (model.json, arrays.npz)")
