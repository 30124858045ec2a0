"""A virtio balloon's free page reporting: whether this VM hands free memory back to its host.

With the device's REPORTING feature, the guest's ``page_reporting`` reports free blocks of
``page_reporting_order`` (9: 2 MiB) and up to the host, which takes their memory back; the next
allocation of such a block costs the host a fault to back it again. On the development VM that
is what slows a load after the page cache of another one was evicted (docs/BENCHMARKS.md,
"Several local ranks: the VM's free page reporting"), so the load benchmarks record it. Linux
only; a bare-metal machine has none of it.
"""

from __future__ import annotations

from pathlib import Path

#: VIRTIO_BALLOON_F_REPORTING, the device feature bit (include/uapi/linux/virtio_balloon.h).
REPORTING_BIT = 5
#: What the kernel's page_reporting shows of its settings and counters.
SETTINGS = ("page_reporting_order", "min_free_ms")
COUNTER = "reported_kib"
PARAMETERS = "module/page_reporting/parameters"


def reporting(root: Path = Path("/sys")) -> str | None:
    """``on (page_reporting_order 9, min_free_ms 0)`` where a virtio balloon reports free pages
    (each virtio device's ``features`` is a string of 0/1, bit 0 first), else None. Settings the
    kernel does not show are left out (``min_free_ms`` is not upstream's)."""
    devices = root / "bus/virtio/drivers/virtio_balloon"
    for features in sorted(devices.glob("virtio*/features")):
        bits = features.read_text().strip()
        if len(bits) > REPORTING_BIT and bits[REPORTING_BIT] == "1":
            params = root / PARAMETERS
            shown = [
                f"{name} {(params / name).read_text().strip()}"
                for name in SETTINGS
                if (params / name).is_file()
            ]
            return f"on ({', '.join(shown)})" if shown else "on"
    return None


def reported_bytes(root: Path = Path("/sys")) -> int | None:
    """Bytes of free memory reported to the host since boot, where the kernel counts them (the
    development VM's does, in ``reported_kib``; upstream's does not): None elsewhere."""
    try:
        return int((root / PARAMETERS / COUNTER).read_text()) << 10
    except (OSError, ValueError):
        return None
