"""Which run folders a sweep or a sync acts on, and reading a file there without a symlink.

Anyone who can write runs into an experiment can set any tag, so ``stability.output_dir`` says
where a run claims it ran, never where we read, write or upload. A folder is acted on only
when its real path (``os.path.realpath``: every symlink resolved) lies under one of the
caller's own roots: the sweep's ``hydra.sweep.dir``, the folders given to ``stability sync``.
A tag naming anything else is ignored with one logged line.

Inside an accepted folder a file is read through ``open_regular``: no component below the
folder may be a symlink (``O_NOFOLLOW`` on each, relative to the one above), and the file
must be a regular file. A symlink planted as ``config.yaml`` or ``checkpoints/best.pt`` is
never followed to the key or secret it points at.
"""

from __future__ import annotations

import errno
import logging
import os
import stat
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from stability.tracking import journal
from stability.tracking.contract import Tag

log = logging.getLogger(__name__)
# O_NONBLOCK: opening a planted FIFO must not hang the sweep (no effect on a regular file)
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
_DIR_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_DIRECTORY | getattr(os, "O_CLOEXEC", 0)


class NotRegular(OSError):
    """A path below a run folder is a symlink, or not a regular file."""


def under(folder: str | Path, roots: Sequence[str | Path]) -> Path | None:
    """``folder``'s real path when it is one of ``roots`` or below one (realpaths), else None.

    A relative ``folder`` is refused: a tag's relative path would be read against wherever
    the process runs.
    """
    if not os.path.isabs(folder):
        return None
    real = Path(os.path.realpath(folder))
    for root in roots:
        if real.is_relative_to(os.path.realpath(root)):
            return real
    return None


def tagged_folder(run: Any, roots: Sequence[str | Path], doing: str) -> Path | None:
    """The run's ``stability.output_dir`` if it lies under ``roots`` (its real path).

    Args:
        run: an MLflow run.
        roots: the caller's own folders (none: no tag is ever followed).
        doing: what the folder would be used for, for the logged line ("resuming").

    Returns:
        The folder, or None (no tag, or one outside ``roots``: logged, never used).
    """
    tag = run.data.tags.get(Tag.OUTPUT_DIR)
    if not tag:
        return None
    folder = under(tag, roots)
    if folder is None:
        where = ", ".join(str(r) for r in roots) or "(no folder of this command)"
        log.warning("ignoring run %s's stability.output_dir %r (not %s it): not under %s",
                    run.info.run_id, tag[:300], doing, where)
    return folder


def journal_names(folder: str | Path, run_id: str) -> bool:
    """Whether ``folder``'s journal records ``run_id`` as its run (the folder is that run's).

    A folder without a journal, with an unreadable one, or whose journal names another run
    (a new run moved this one's files aside, or a tag pointed at someone else's folder) is
    not that run's: nothing is uploaded from it into that run.
    """
    try:
        r = journal.read(folder)
    except (journal.JournalError, OSError):
        return False
    return r is not None and r.run_id == run_id


def open_regular(folder: str | Path, rel: str) -> int:
    """A read-only descriptor of ``folder/rel``, following no symlink below ``folder``.

    Args:
        folder: a run folder (its own path may hold symlinks: it is resolved first).
        rel: a relative path below it (``checkpoints/best.pt``).

    Raises:
        FileNotFoundError: it does not exist.
        NotRegular: a component is a symlink, or the file is not a regular file.
    """
    *dirs, name = Path(rel).parts
    fd = os.open(os.path.realpath(folder), _DIR_FLAGS)
    try:
        for part in dirs:
            nxt = _open_at(part, _DIR_FLAGS, fd, folder, rel)
            os.close(fd)
            fd = nxt
        out = _open_at(name, _FILE_FLAGS, fd, folder, rel)
    finally:
        os.close(fd)
    if not stat.S_ISREG(os.fstat(out).st_mode):
        os.close(out)
        raise NotRegular(f"{Path(folder) / rel} is not a regular file")
    return out


def _open_at(name: str, flags: int, dir_fd: int, folder: str | Path, rel: str) -> int:
    try:
        return os.open(name, flags, dir_fd=dir_fd)
    except OSError as err:
        if err.errno in (errno.ELOOP, errno.ENOTDIR):  # a symlink where O_NOFOLLOW is
            raise NotRegular(f"{Path(folder) / rel} goes through a symlink") from None
        raise
