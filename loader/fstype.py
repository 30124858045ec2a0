"""Which filesystem a file is on, and whether its requests are slow enough to need many in flight.

``statfs(2)``'s ``f_type`` names the filesystem (the magic numbers of ``linux/magic.h`` and of
each filesystem's own source). On network and FUSE filesystems every request may pay a network
(or daemon) round trip; whether it does is measured (:func:`request_ms`): where a request takes
:data:`SLOW_REQUEST_MS` or more, the loader's default is parallel O_DIRECT reads (the kernel
splits each into many requests at once), not buffered reads that wait for one readahead window
after another; where it answers faster, the local rule holds.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import time
from pathlib import Path

from .files import open_regular

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


#: A request to a network or FUSE filesystem this slow or slower (the fastest of
#: :data:`PROBES` uncached 4 KiB reads) makes it "slow" storage. Measured on the 2-core VM
#: (docs/BENCHMARKS.md, "Results for issue 26 §3-4, second pass"), a 1.98 GB checkpoint through
#: the benchmark's FUSE passthrough: with no added delay a request took 0.014-0.018 ms and reading
#: through the page cache (the local rule) beat O_DIRECT (median 1.0 against 0.65 GB/s); with
#: 0.05 ms added it took 0.13-0.16 ms and the two were even (0.73 against 0.86); with 0.1 ms
#: added, 0.20 ms, and O_DIRECT won every round (1.10-1.58 against 0.73-0.90 GB/s).
SLOW_REQUEST_MS = 0.1
#: Uncached reads timed per device; the fastest counts (a busy machine only adds to a read).
PROBES = 3
_PROBE = 4096

_LATENCY: dict[int, float | None] = {}


def request_ms(path: Path) -> float | None:
    """The fastest of :data:`PROBES` O_DIRECT 4 KiB reads spread over ``path``, in ms: the
    storage's round trip (O_DIRECT skips the page cache). None where the file cannot be read
    that way (O_DIRECT refused, or an empty file). Measured once per device for the life of
    the process."""
    try:
        dev = os.stat(path).st_dev
    except OSError:
        return None
    if dev not in _LATENCY:
        _LATENCY[dev] = _probe(path)
    return _LATENCY[dev]


def _probe(path: Path) -> float | None:
    direct = getattr(os, "O_DIRECT", 0)
    if not direct:
        return None
    try:
        fd = open_regular(path, direct)
    except OSError:
        return None
    buffer = mmap.mmap(-1, _PROBE)  # page-aligned, as O_DIRECT needs
    try:
        blocks = os.fstat(fd).st_size // _PROBE
        times = []
        for k in range(PROBES if blocks else 0):
            start = time.perf_counter()
            os.preadv(fd, [buffer], blocks * k // PROBES * _PROBE)
            times.append(time.perf_counter() - start)
        return min(times) * 1e3 if times else None
    except OSError:
        return None
    finally:
        buffer.close()
        os.close(fd)


def slow_storage(path: Path) -> str | None:
    """The name of the network or FUSE filesystem ``path`` is on where its requests take
    :data:`SLOW_REQUEST_MS` or more (or cannot be timed), else None (local, or answering as
    fast as a local disk)."""
    name = remote_fs(path)
    if name is None:
        return None
    ms = request_ms(path)
    return name if ms is None or ms >= SLOW_REQUEST_MS else None
