"""Which filesystem a file is on: network and FUSE filesystems need many reads in flight.

``statfs(2)``'s ``f_type`` names the filesystem (the magic numbers of ``linux/magic.h`` and of
each filesystem's own source). On these every request pays a network (or daemon) round trip, so
the loader's default there is parallel O_DIRECT reads (the kernel splits each into many requests
at once), not buffered reads that wait for one readahead window after another.
"""

from __future__ import annotations

import ctypes
import os
from pathlib import Path

#: f_type -> name: network, cluster and FUSE filesystems (linux/magic.h; Lustre, GPFS, BeeGFS,
#: WekaFS... from their own sources).
REMOTE = {
    0x6969: "nfs",
    0x517B: "smb",
    0xFF534D42: "cifs",
    0xFE534D42: "smb2",
    0x65735546: "fuse",
    0x0BD00BD0: "lustre",
    0x47504653: "gpfs",
    0x00C36400: "ceph",
    0x01021997: "9p",
    0x6B414653: "afs",
    0x5346414F: "openafs",
    0x7461636F: "ocfs2",
    0x01161970: "gfs2",
    0x19830326: "beegfs",
    0x20030528: "orangefs",
    0x73757245: "coda",
}


class _StatFs(ctypes.Structure):
    # struct statfs on 64-bit Linux begins with f_type (a long); the rest is not read here.
    _fields_ = [("f_type", ctypes.c_long), ("_rest", ctypes.c_byte * 128)]


_libc = ctypes.CDLL(None, use_errno=True)


def fs_magic(path: Path) -> int | None:
    """``statfs(path).f_type`` (unsigned), or None where statfs fails."""
    buf = _StatFs()
    if _libc.statfs(os.fsencode(path), ctypes.byref(buf)) != 0:
        return None
    return buf.f_type & 0xFFFFFFFF


_BY_DEVICE: dict[int, str | None] = {}


def remote_fs(path: Path) -> str | None:
    """The name of the network or FUSE filesystem ``path`` is on, or None (local, or unknown).

    Asked once per device (``st_dev``) for the life of the process."""
    try:
        dev = os.stat(path).st_dev
    except OSError:
        return None
    if dev not in _BY_DEVICE:
        _BY_DEVICE[dev] = REMOTE.get(fs_magic(path) or 0)
    return _BY_DEVICE[dev]
