"""dasknn's messages: the `dasknn` logger hierarchy, and what `verbose` means for it.

Every module logs to `logging.getLogger(__name__)`, whatever the verbosity; `verbose` maps to a
level (`verbose_level`: 0 warnings only, 1 INFO, 2 DEBUG, 3 `TRACE`, the tuner's probes). A fit
with verbose >= 1 shows them on stderr when the user configured no logging (`verbose_logging`);
the `dasknn` command has its own handler (`command_logging`), prints each warning as one line and
strips dask's records of their tracebacks (`one_line_warnings`, `one_line_logs`). Progress bars
are tqdm's, not log records.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = [
    "FORMAT",
    "TRACE",
    "command_logging",
    "one_line_logs",
    "one_line_warnings",
    "quiet_logging",
    "verbose_level",
    "verbose_logging",
]

TRACE = 5
"""The level of the tuner's probes, below DEBUG: shown from verbose=3."""
logging.addLevelName(TRACE, "TRACE")
FORMAT = "[dasknn] %(message)s"
LEVELS = {0: logging.WARNING, 1: logging.INFO, 2: logging.DEBUG}


def verbose_level(verbose: int) -> int:
    """The logging level `verbose` shows: 0 WARNING, 1 INFO, 2 DEBUG, 3 and more TRACE."""
    return LEVELS.get(int(verbose), TRACE)


class _Stderr(logging.Handler):
    """Writes each record as a line on the stderr of the moment (a redirected one too) through
    `tqdm.write`, which lifts a progress bar drawn there above the line instead of running into it."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            from tqdm import tqdm

            tqdm.write(self.format(record), file=sys.stderr)
        except Exception:
            self.handleError(record)


def _stderr_handler(level: int) -> logging.Handler:
    """A `_Stderr` handler from `level` on, lines prefixed "[dasknn] "."""
    handler = _Stderr()
    handler.setLevel(level)
    handler.setFormatter(logging.Formatter(FORMAT))
    return handler


@contextmanager
def verbose_logging(verbose: int) -> Iterator[None]:
    """For the duration of a fit with `verbose` >= 1: the `dasknn` logger's level set to
    `verbose_level(verbose)` when the application has not set it, and a stderr handler added when
    logging is not configured at all (no handler on `dasknn` or on the root). Undone afterwards;
    with verbose=0 logging is left as it is (warnings still reach stderr through Python's
    last-resort handler)."""
    logger = logging.getLogger("dasknn")
    if verbose < 1:
        yield
        return
    level, old = verbose_level(verbose), logger.level
    if old == logging.NOTSET:
        logger.setLevel(level)
    added = None
    if not logger.handlers and not logging.getLogger().handlers:
        added = _stderr_handler(level)
        logger.addHandler(added)
    try:
        yield
    finally:
        logger.setLevel(old)
        if added is not None:
            logger.removeHandler(added)


@contextmanager
def command_logging(verbose: int) -> Iterator[None]:
    """The `dasknn` command's logging: dasknn's messages from `verbose_level(verbose)` on, on
    stderr (the command's results go to stdout), for the duration of the command."""
    logger = logging.getLogger("dasknn")
    level, old, propagate = verbose_level(verbose), logger.level, logger.propagate
    handler = _stderr_handler(level)
    logger.addHandler(handler)
    logger.setLevel(level)
    logger.propagate = False  # one copy of each line, whatever the root logger has
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old)
        logger.propagate = propagate


def one_line_warnings(command: str):
    """`warnings.showwarning` printing each warning as one line, `dasknn <command>: warning: ...`
    (Python's shows two: the message with its source file, then the source line)."""

    def show(message, category, filename, lineno, file=None, line=None) -> None:
        print(f"dasknn {command}: warning: {' '.join(str(message).split())}", file=sys.stderr, flush=True)

    return show


def one_line_logs() -> None:
    """Dask's log records on stderr without their tracebacks (the command's `--debug` keeps them):
    a failure of the cluster shows as log lines and then the command's one line, not as pages of
    traceback."""

    def strip(record: logging.LogRecord) -> bool:
        if record.exc_info:
            name = record.exc_info[0].__name__ if record.exc_info[0] else "error"
            record.msg = f"{record.getMessage()} ({name}: {record.exc_info[1]})".strip()
            record.args, record.exc_info, record.exc_text = None, None, None
        return True

    for log in (logging.getLogger("distributed"), logging.getLogger()):
        for handler in log.handlers:
            handler.addFilter(strip)


def quiet_logging() -> None:
    """No more log lines on stderr: a failed command's own line stays the last one."""
    logging.disable(logging.CRITICAL)
