"""Outputs written whole or not at all: a temporary name beside the target, renamed into place once
complete (:func:`atomic_output`, a file or a folder), after :func:`check_output_path` refused an
output that exists, is an input or lies inside one."""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
from collections.abc import Iterator

from .arrays import FileFormatError

__all__ = ["atomic_output", "check_output_path"]


def _overlaps(a: str, b: str) -> bool:
    """Whether one of two paths is the other or lies inside it (symlinks resolved)."""
    ra, rb = os.path.realpath(a), os.path.realpath(b)
    return ra == rb or ra.startswith(rb.rstrip(os.sep) + os.sep) or rb.startswith(ra.rstrip(os.sep) + os.sep)


def check_output_path(path: str, force: bool, inputs: tuple[str, ...] = (), directory: bool = False) -> None:
    """Refuse an output that exists (without ``force``), is an input, lies inside an input folder
    (or holds one), or has no writable folder. ``directory``: the output is a folder."""
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise FileFormatError(f"{path}: the folder {folder} does not exist")
    if not os.access(folder, os.W_OK):
        raise FileFormatError(f"{path}: the folder {folder} is not writable")
    for src in inputs:
        if os.path.exists(path) and os.path.samefile(path, src):
            raise FileFormatError(f"{path}: is also the input; the input is never overwritten")
        if os.path.isdir(src) and _overlaps(path, src):
            raise FileFormatError(
                f"{path}: lies inside the input folder {src} (or holds it); write the output elsewhere"
            )
    if os.path.isdir(path) and not directory:
        raise FileFormatError(f"{path}: is a folder")
    if os.path.exists(path) and directory and not os.path.isdir(path):
        raise FileFormatError(f"{path}: exists and is not a folder")
    if os.path.exists(path) and not force:
        raise FileFormatError(f"{path}: exists; pass --force to overwrite it")


#: Errors of a write that ran out of room (disk full, quota, file size limit).
_NO_ROOM = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)


@contextlib.contextmanager
def atomic_output(
    path: str | os.PathLike[str], force: bool = False, inputs: tuple[str, ...] = (), directory: bool = False
) -> Iterator[str]:
    """Yield a temporary path beside ``path`` (an empty folder with ``directory``); rename it to
    ``path`` if the block completes, else remove it (on any exception, KeyboardInterrupt
    included). A write that runs out of room becomes a :class:`FileFormatError` saying so."""
    path = os.fspath(path)
    check_output_path(path, force, inputs, directory)
    folder, base = os.path.split(os.path.abspath(path))
    tmp = os.path.join(folder, f".partial-{os.getpid()}-{base}")  # same suffix: writers go by it
    old = os.path.join(folder, f".replaced-{os.getpid()}-{base}")
    if directory:
        os.mkdir(tmp)
    try:
        try:
            yield tmp
        except OSError as exc:
            if exc.errno in _NO_ROOM:
                raise FileFormatError(
                    f"{path}: writing failed ({exc.strerror or exc}); no output was written"
                ) from None
            raise
        if directory and os.path.isdir(path):  # --force on an existing folder: swap, then remove it
            os.rename(path, old)
        os.replace(tmp, path)
    finally:
        for leftover in (tmp, old):
            if os.path.isdir(leftover) and not os.path.islink(leftover):
                shutil.rmtree(leftover, ignore_errors=True)
            else:
                with contextlib.suppress(FileNotFoundError):
                    os.remove(leftover)
