"""The `dasknn` command's parser and its run: a command's result, or its failure in one line with
its exit code (`exits`)."""

from __future__ import annotations

import argparse
import os
import sys
import warnings

from dasknn import __version__
from dasknn.cli import experiment, export, info, predict, summary, train
from dasknn.cli.exits import EXIT_BUDGET_OUT, MEANINGS, end_process, failure, interrupted, raise_on_sigterm
from dasknn.cli.options import Parser
from dasknn.logs import command_logging, one_line_logs, one_line_warnings, quiet_logging

COMMANDS = (train, predict, export, experiment, info, summary)
"""The command modules, in `dasknn --help`'s order: each adds its parser (`add_parser`)."""


def build_parser() -> argparse.ArgumentParser:
    """The `dasknn` parser: `--version`, `--debug`, and a sub-command per module of `COMMANDS`."""
    parser = Parser(
        prog="dasknn",
        description="The `dasknn` command: `dasknn train`, `predict`, `export`, `experiment`, `info`, "
        "`summary`.",
        epilog="exit codes: " + ", ".join(f"{code} {meaning}" for code, meaning in MEANINGS.items()),
    )
    parser.add_argument("--version", action="version", version=f"dasknn {__version__}")
    parser.add_argument("--debug", action="store_true", help="on a failure, print the traceback too")
    debug = argparse.ArgumentParser(add_help=False)
    debug.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    sub = parser.add_subparsers(dest="command", required=True)
    for command in COMMANDS:
        command.add_parser(sub, [debug])
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the `dasknn` command of `argv` (None: the process's own command line, whose logging,
    signals and end are then the command's to shape); returns its exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    command_line = argv is None
    if command_line and not args.debug:
        import distributed  # noqa: F401  (its logging configuration, which the filter then joins)

        one_line_logs()
    if command_line:
        raise_on_sigterm()
    try:
        with command_logging(getattr(args, "verbose", 1)), warnings.catch_warnings():
            warnings.showwarning = one_line_warnings(args.command)
            code = args.func(args)
    except BrokenPipeError:  # `dasknn train | head`: the reader left; say nothing more
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_BUDGET_OUT
    except KeyboardInterrupt as err:
        return _fail(args, *interrupted(args, err), command_line)
    except Exception as err:
        if args.debug:
            import traceback

            traceback.print_exc()
        return _fail(args, *failure(err), command_line)
    if command_line:
        end_process(code)
    return code


def _fail(args, code: int, line: str, command_line: bool) -> int:
    """Print a failed command's one line on stderr, after its output and as the last line."""
    sys.stdout.flush()
    if command_line:
        quiet_logging()  # the closing clusters' log lines would bury the one line
    print(f"dasknn {args.command}: {line}", file=sys.stderr, flush=True)
    return code
