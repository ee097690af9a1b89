"""Warnings attributed to the user's line: the first frame of the call stack outside dasknn."""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

__all__ = ["warn_user"]

_PACKAGE = str(Path(__file__).resolve().parent)


def _inside(filename: str) -> bool:
    try:
        return str(Path(filename).resolve()).startswith(_PACKAGE)
    except (OSError, ValueError):
        return False


def warn_user(message: str, category: type[Warning] = UserWarning) -> None:
    """`warnings.warn(message, category)` with the stacklevel of the first caller outside dasknn,
    so the warning names the user's file and line, however deep in the package it is raised."""
    frame = sys._getframe(0)
    level = 1
    while frame.f_back is not None and _inside(frame.f_code.co_filename):
        frame = frame.f_back
        level += 1
    warnings.warn(message, category, stacklevel=level)
