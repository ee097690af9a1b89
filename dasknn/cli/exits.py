"""How a `dasknn` command ends: its exit code, the one line a failure or a signal ends with
(`dasknn <command>: <what failed>: <what to do>`), SIGTERM raised as Ctrl-C is, and the process's
quick end once a command finished."""

from __future__ import annotations

import errno
import logging
import os
import signal
import sys

EXIT_TARGET_REACHED = 0
EXIT_BUDGET_OUT = 1
EXIT_BAD_INPUT = 2
EXIT_CLUSTER_FAILURE = 3
EXIT_INTERNAL_ERROR = 4
EXIT_LOCAL_IO = 5
EXIT_DIVERGED = 6
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as shells report it
EXIT_TERMINATED = 143  # 128 + SIGTERM
"""`dasknn` exit codes: 0 target reached (or a command done: `predict` scored or wrote), 1 the
time budget ran out first, 2 bad input (options, files, data; for `predict` also a folder that is
no saved model, or one of a newer format), 3 the cluster failed (scheduler unreachable or lost,
workers lost), 4 anything else (a bug: rerun with --debug and report the traceback), 5 a local
file could not be written or read (disk full, permission denied, read-only folder: the path is
named), 6 training diverged (X not scaled, or a learning rate too high), 130 interrupted
(SIGINT, Ctrl-C), 143 terminated (SIGTERM)."""

MEANINGS = {
    EXIT_TARGET_REACHED: "target reached",
    EXIT_BUDGET_OUT: "time budget ran out",
    EXIT_BAD_INPUT: "bad input",
    EXIT_CLUSTER_FAILURE: "cluster failure",
    EXIT_INTERNAL_ERROR: "internal error",
    EXIT_LOCAL_IO: "local I/O failure (disk full, permission denied)",
    EXIT_DIVERGED: "training diverged",
    EXIT_INTERRUPTED: "interrupted",
    EXIT_TERMINATED: "terminated",
}
"""Each exit code in a few words: the `dasknn --help` epilog."""

_LOCAL_IO_ERRNOS = {
    errno.ENOSPC,
    errno.EDQUOT,
    errno.EROFS,
    errno.EACCES,
    errno.EPERM,
    errno.EFBIG,
    errno.EIO,
}
"""OSError numbers of a local file-system failure (never a cluster's)."""

_BAD_INPUT = (
    ValueError,
    KeyError,
    ImportError,
    FileNotFoundError,
    FileExistsError,
    NotADirectoryError,
    IsADirectoryError,
    PermissionError,
)


def failure(err: BaseException) -> tuple[int, str]:
    """(exit code, one line naming what failed and what to do) for an error that ends a command."""
    from dasknn.engine.dask.recovery import ClusterError, SchedulerError, WorkerLostError, is_worker_loss

    text = str(err.args[0]) if isinstance(err, KeyError) and err.args else str(err)
    text = " ".join(text.split())
    if isinstance(err, KeyError) and " " not in text:  # a bare key ('X') says nothing by itself
        text = f"missing {text!r} (KeyError)"
    local = _local_io(err)
    if local:
        return EXIT_LOCAL_IO, local
    if isinstance(err, SchedulerError):
        return EXIT_CLUSTER_FAILURE, f"cluster failure: {text}"
    if isinstance(err, WorkerLostError):
        return EXIT_CLUSTER_FAILURE, (
            f"cluster failure: {text}; start workers again (`dask worker <scheduler>`) and rerun "
            "(with --checkpoint-dir, add --resume to continue from the last checkpoint)"
        )
    if isinstance(err, ClusterError):
        return EXIT_CLUSTER_FAILURE, f"cluster failure: {text}"
    if isinstance(err, FloatingPointError):
        return EXIT_DIVERGED, _diverged(text)
    if isinstance(err, _BAD_INPUT):
        return EXIT_BAD_INPUT, f"error: {text}"
    if is_worker_loss(err) or type(err).__module__.startswith("distributed"):
        return EXIT_CLUSTER_FAILURE, (
            f"cluster failure: {type(err).__name__}: {text}; check that the scheduler and workers are "
            "up (`dask scheduler`, `dask worker`), then rerun"
        )
    return EXIT_INTERNAL_ERROR, (
        f"internal error: {type(err).__name__}: {text}; rerun with --debug and report the traceback"
    )


def _diverged(text: str) -> str:
    """The line for a fit that diverged (a FloatingPointError: the loop's rollbacks ran out, or
    every rate the tuner tried blew up): what happened, and its likely causes."""
    said = text if text.startswith("training diverged") else f"training diverged: {text}"
    return (
        f"{said}; likely causes: X not scaled (the nets expect inputs of order 1, e.g. 8-bit pixels "
        "/ 255) or a learning rate too high (lower --learning-rate, or let the tuner choose it: "
        "--learning-rate auto)"
    )


def _local_io(err: BaseException) -> str:
    """The line for a local file-system failure (an OSError naming its path), else ""."""
    for e in (err, err.__cause__, err.__context__):
        if isinstance(e, OSError) and e.errno in _LOCAL_IO_ERRNOS and e.filename:
            return (
                f"local I/O failure: {e.strerror}: {e.filename}; free space there or choose a folder "
                "you can write (--checkpoint-dir, --output), then rerun"
            )
    return ""


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised in the main thread as Ctrl-C's KeyboardInterrupt is."""


def _terminate(signum, frame) -> None:
    raise Terminated


def raise_on_sigterm() -> None:
    """From now on SIGTERM raises `Terminated` in the main thread: the command ends as on Ctrl-C."""
    signal.signal(signal.SIGTERM, _terminate)


def interrupted(args, err: KeyboardInterrupt) -> tuple[int, str]:
    """(exit code, one line) for SIGINT or SIGTERM: which, and the checkpoint a --resume continues from."""
    from dasknn.engine.checkpoint import list_checkpoints

    code, word = (
        (EXIT_TERMINATED, "terminated (SIGTERM)")
        if isinstance(err, Terminated)
        else (EXIT_INTERRUPTED, "interrupted (SIGINT)")
    )
    where = getattr(args, "checkpoint_dir", None)
    if not where:
        return code, word
    found = list_checkpoints(where)
    if not found:
        return code, f"{word}; no checkpoint written in {where} yet"
    return code, f"{word}; the last checkpoint is {found[-1]}: rerun with --resume to continue from it"


def end_process(code: int) -> None:
    """End the process of a command that finished, at once (`os._exit`), when nothing it started
    still runs (no child process, no thread but daemon ones): the interpreter's own teardown of
    the modules it imported comes after every file is written and the cluster closed, and only
    costs time. Otherwise the normal exit, whose atexit handlers close what is left."""
    import multiprocessing
    import threading

    others = [t for t in threading.enumerate() if t is not threading.current_thread() and not t.daemon]
    if multiprocessing.active_children() or others:
        return
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except (BrokenPipeError, ValueError):  # the reader left (`dasknn train | head`), or closed
        pass
    logging.shutdown()
    os._exit(code)
