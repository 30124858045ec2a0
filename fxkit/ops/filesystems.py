"""Filesystems on block devices, made only where there is nothing: never over data.

The device is probed with ``blkid -p`` (:class:`~fxkit.facts.filesystems.BlockSignature`): a
filesystem of the wanted type is left as it is; any other signature (another filesystem, a
partition table, LVM, an ambivalent probe, an unreadable device) fails the step and changes
nothing. Only a device on which blkid finds nothing gets ``mkfs``, and the command that runs it
probes again first (the device may have changed since it was read) and calls mkfs without its
force option, so mkfs's own check refuses an existing filesystem too.

A device another host may write (a namespace of an NVMe-oF target that several hosts connect)
is made by one host only, its owner: on the others (``owner`` names the owner) an empty device
is never formatted, since two hosts' mkfs, or one host's mkfs under another's mounted
filesystem, destroys data. They wait for the owner's filesystem instead (``wait`` seconds: the
owner may make it in the same run), then fail saying to run the owner first.
"""

from __future__ import annotations

import re
from shlex import quote

from fxkit.facts.filesystems import BlockSignature
from fxkit.ops.base import OpContext, OpError, Result, failed, ok, skipped

_FSTYPE = re.compile(r"[a-z0-9]+")
#: mkfs options that set a label, by filesystem (mkfs.xfs -L is at most 12 characters).
_LABEL = {"xfs": ("-L", 12), "ext4": ("-L", 16)}
#: How mkfs is told to be quiet.
_QUIET = {"xfs": "-q", "ext4": "-q"}


def filesystem(
    ctx: OpContext,
    device: str,
    fstype: str = "xfs",
    label: str | None = None,
    owner: str | None = None,
    wait: float = 0.0,
) -> Result:
    """Ensure ``device`` holds a filesystem of ``fstype``: made with ``mkfs`` when the device is
    empty (blkid finds no signature at all), left alone when it has one of that type, and a
    failure, changing nothing, when it holds anything else. ``data["uuid"]`` is the filesystem's
    UUID when there is one. With ``owner`` (the host that makes it, not this one) an empty
    device is never formatted: it waits up to ``wait`` seconds for the owner's filesystem, then
    fails saying to run the owner first (in check mode: skipped, since the owner may be about
    to make it).

    Example::

        host.filesystem("/dev/nvme1n1", "xfs", label="models")
        host.filesystem("/dev/nvme1n1", "xfs", owner="gpu01")   # a reader: gpu01 makes it
    """
    if not device.startswith("/") or "\0" in device:
        raise OpError(f"bad device {device!r}", hint="an absolute path, e.g. /dev/nvme1n1")
    if fstype not in _LABEL or not _FSTYPE.fullmatch(fstype):
        raise OpError(f"unsupported filesystem {fstype!r}", hint=f"one of {', '.join(_LABEL)}")
    option, longest = _LABEL[fstype]
    if label is not None and (not re.fullmatch(r"[A-Za-z0-9_.-]+", label) or len(label) > longest):
        raise OpError(f"bad {fstype} label {label!r}", hint=f"up to {longest} of A-Z a-z 0-9 _ . -")
    found = ctx.fresh(BlockSignature, device)
    if owner and wait > 0 and found.empty and not found.error and not ctx.check:
        tries = max(1, int(wait // 2))
        ctx.read(
            f"for i in $(seq {tries}); do blkid -p -o value -s TYPE -- {quote(device)} | "
            "grep -q . && exit 0; sleep 2; done; exit 1",
            timeout=wait + 30,
        )
        found = ctx.fresh(BlockSignature, device)
    if not found.exists:
        return failed(f"{device} does not exist")
    if found.error:
        return failed(f"{device} cannot be probed, so it is left alone: {found.error}")
    if found.fstype == fstype:
        return ok(f"{device} has {found.what}", uuid=found.uuid)
    if not found.empty:
        return failed(
            f"{device} holds {found.what}, not {fstype}: fxkit never formats over data "
            "(wipe it by hand with wipefs if its data may go, or choose another device)"
        )
    if owner:
        why = (
            f"{device} holds no filesystem yet and {owner} owns it: only the owner makes its "
            "filesystem"
        )
        if ctx.check:
            return skipped(f"{why} (it may in this run)")
        waited = f" (waited {wait:g} s)" if wait > 0 else ""
        return failed(f"{why}{waited}; run the play on {owner} first, then here")
    q = quote(device)
    labelled = f"{option} {quote(label)} " if label else ""
    command = (
        f'e=$(blkid -p -- {q} 2>&1); [ $? -eq 2 ] && [ -z "$e" ] || '
        f"{{ printf '%s is not empty any more (blkid: %s); not formatted\\n' {q} \"$e\" >&2; "
        "exit 3; }; "
        f"mkfs.{fstype} {_QUIET[fstype]} {labelled}-- {q}"
    )
    made = ctx.change(
        command,
        would=f"make {fstype} on {device}",
        done=f"made {fstype} on {device}",
        diff=f"{device}: no signature -> {fstype}\n",
    )
    if made.changed and not ctx.check:
        made.data["uuid"] = ctx.fresh(BlockSignature, device).uuid
    return made
