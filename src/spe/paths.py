"""What a path that should be a regular file is instead, for one-line messages.

"does not exist" for a FIFO, a folder, ``/dev/zero`` or a symbolic link loop sends the user
looking for a typo; each is named as what it is. Checked with ``stat`` only: opening a FIFO
would block until something writes to it.
"""

from __future__ import annotations

import errno
import os
import stat

__all__ = ["not_a_file"]


def not_a_file(path: str | os.PathLike) -> str | None:
    """None if ``path`` is a regular file (or a link to one); else what it is, as the end of a
    sentence: ``does not exist``, ``is a folder``, ``is a FIFO (named pipe)``, ``is a device
    file``, ``is a socket``, ``is a symbolic link loop``, ``is a broken symbolic link (to X)``."""
    try:
        mode = os.stat(path).st_mode
    except OSError as err:
        if err.errno == errno.ELOOP:
            return "is a symbolic link loop"
        if os.path.islink(path):
            return f"is a broken symbolic link (to {os.readlink(path)})"
        if err.errno == errno.ENOTDIR:
            return "does not exist (a folder on its path is a file)"
        if err.errno == errno.ENOENT:
            return "does not exist"
        return f"cannot be read ({err.strerror})"
    if stat.S_ISREG(mode):
        return None
    if stat.S_ISDIR(mode):
        return "is a folder"
    if stat.S_ISFIFO(mode):
        return "is a FIFO (named pipe)"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "is a device file"
    if stat.S_ISSOCK(mode):
        return "is a socket"
    return "is not a regular file"
