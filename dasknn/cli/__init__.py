"""The `dasknn` command: `dasknn train`, `predict`, `export`, `experiment`, `info`, `summary`.

One module per command, each with its options (`add_parser`) and what it runs (`run`); `app`
builds the parser and runs a command; `exits` holds the exit codes, the one line a failure or a
signal ends with, and the end of the process.
"""

from dasknn.cli.app import build_parser, main

__all__ = ["build_parser", "main"]
