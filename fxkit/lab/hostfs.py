"""Reading a file inside a lab host from the controller, without trusting what the host put there.

The controller reaches a host's files through ``/proc/PID/root`` of the host's PID 1. A path
walked from there resolves an absolute symlink against the *controller's* root: a root in the
host who makes its log a link to ``/etc/shadow`` would have the controller read the real one.
So every name is opened relative to a descriptor of the host's root, one component at a time,
none followed if it is a link, and only a regular file is read: at most its last ``limit``
bytes, opened non-blocking, so a FIFO, a device or a huge sparse file never blocks the
controller nor fills its memory. The controller writes nothing into a running host.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Iterator

#: What a read takes at most (the end of the file: a log's newest lines).
MAX_READ = 16 * 2**20
_FOLDER = os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC


@contextlib.contextmanager
def root_of(pid: int) -> Iterator[int]:
    """A descriptor of the root folder process ``pid`` sees; OSError while that is still the
    controller's own (a host that has not yet moved into its own root)."""
    fd = os.open(f"/proc/{pid}/root", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        here, own = os.fstat(fd), os.stat("/")
        if (here.st_dev, here.st_ino) == (own.st_dev, own.st_ino):
            raise OSError(errno.ENOENT, "the process still sees the controller's root", str(pid))
        yield fd
    finally:
        os.close(fd)


def read_tail(root: int, path: str, limit: int = MAX_READ) -> bytes:
    """The last ``limit`` bytes of the regular file ``path`` (relative, no ``..``) under the
    folder descriptor ``root``; OSError if a component is a link or the file is not regular."""
    parts = path.split("/")
    if any(part in ("", ".", "..") for part in parts):
        raise ValueError(f"not a plain relative path: {path!r}")
    with contextlib.ExitStack() as opened:
        here = root
        for folder in parts[:-1]:
            here = os.open(folder, _FOLDER, dir_fd=here)
            opened.callback(os.close, here)
        fd = os.open(parts[-1], _FILE, dir_fd=here)
        opened.callback(os.close, fd)
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise OSError(errno.EINVAL, "not a regular file", path)
        return os.pread(fd, limit, max(0, info.st_size - limit))
