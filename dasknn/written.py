"""Files that appear complete or not at all, and local write failures that name their file.

`written(path)` yields a temporary path beside `path` (same folder, same suffix, so writers that
choose a format by the suffix choose the same one) and renames it onto `path` once the block
ends; if the block fails, the temporary file or folder is removed, and an OSError is raised again
naming `path` (numpy's, pandas' and netCDF's write errors often name no file, or the temporary
one). `check_writable(folder)` refuses a read-only or forbidden folder before any work, and
`new_folder(path)` removes a folder it created when what was to fill it failed.
"""

from __future__ import annotations

import errno
import os
import shutil
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

__all__ = ["check_writable", "new_folder", "written"]


@contextmanager
def written(path: str | os.PathLike) -> Iterator[Path]:
    """A temporary path to write `path`'s content to (a file, or a folder the block creates),
    renamed onto `path` when the block ends; an earlier `path` is replaced only then (a folder
    too). On failure nothing of the temporary stays, and an OSError names `path`."""
    target = Path(path)
    tmp = target.with_name(f".{target.stem}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}{target.suffix}")
    try:
        yield tmp
        _replace(tmp, target)
    except Exception as err:
        # a writer's error on a file system with no space left is the full disk, whatever it says
        # (netCDF's is EACCES, or a RuntimeError "NetCDF: HDF error")
        full = _full(target.parent)
        _remove(tmp)
        if full or isinstance(err, OSError):
            code = errno.ENOSPC if full else err.errno
            raise OSError(code, os.strerror(code) if code else str(err), str(target)) from err
        raise
    except BaseException:
        _remove(tmp)
        raise


def _replace(tmp: Path, target: Path) -> None:
    """`tmp` onto `target`; a folder `target` is moved aside first, and deleted once replaced."""
    if not (tmp.is_dir() and target.is_dir()):
        os.replace(tmp, target)
        return
    old = target.with_name(f".{target.name}.old-{uuid.uuid4().hex[:8]}")
    os.replace(target, old)
    try:
        os.replace(tmp, target)
    except BaseException:
        os.replace(old, target)
        raise
    shutil.rmtree(old, ignore_errors=True)


def _full(folder: Path) -> bool:
    try:
        return os.statvfs(folder).f_bavail == 0
    except OSError:
        return False


def _remove(tmp: Path) -> None:
    if tmp.is_dir() and not tmp.is_symlink():
        shutil.rmtree(tmp, ignore_errors=True)
    else:
        tmp.unlink(missing_ok=True)


def check_writable(folder: str | os.PathLike) -> None:
    """OSError (EROFS or EACCES, naming `folder`) unless files can be created in `folder`, an
    existing folder."""
    folder = Path(folder)
    if os.access(folder, os.W_OK) and not _read_only(folder):
        return
    code = errno.EROFS if _read_only(folder) else errno.EACCES
    raise OSError(code, os.strerror(code), str(folder))


def _read_only(folder: Path) -> bool:
    try:
        return bool(os.statvfs(folder).f_flag & os.ST_RDONLY)
    except OSError:
        return False


@contextmanager
def new_folder(path: str | os.PathLike) -> Iterator[Path]:
    """`path` as a folder (created with its parents if missing) for the block; if the block
    fails, the folder is removed again when the block created it and left it empty."""
    folder = Path(path)
    created = not folder.exists()
    folder.mkdir(parents=True, exist_ok=True)
    try:
        yield folder
    except BaseException:
        if created and folder.is_dir() and not any(folder.iterdir()):
            folder.rmdir()
        raise
