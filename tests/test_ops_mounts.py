"""mount: fstab(5) entries on a temp fstab through LocalConnection (states that mount nothing),
and the escaping and validation of fields. Mounting on real hosts: test_ops_lab_transfer.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from fxkit.connection.base import RunResult
from fxkit.connection.local import LocalConnection
from fxkit.facts.base import FactCache
from fxkit.facts.capabilities import CAP_SYS_ADMIN, Capabilities
from fxkit.ops.base import OpContext, OpError, Status
from fxkit.ops.mounts import escape, fstab_line, mount, unescape, updated_fstab

# Ubuntu 24.04's installer writes this header (with the root entry by UUID).
UBUNTU_FSTAB = """\
# /etc/fstab: static file system information.
#
# Use 'blkid' to print the universally unique identifier for a
# device; this may be used with UUID= as a more robust way to name devices
# that works even if disks are added and removed. See fstab(5).
#
# <file system> <mount point>   <type>  <options>       <dump>  <pass>
# / was on /dev/nvme0n1p2 during curtin installation
/dev/disk/by-uuid/5a7d2f1e-3c4b-4e8a-9b61-0f2d3c4e5a6b / ext4 defaults 0 1
/swap.img	none	swap	sw	0	0
"""
UUID = "UUID=0b3c4f5e-8d4a-4c7e-9f1a-2a6e3c1d9b7f"


def make_ctx(check: bool = False, diff: bool = False) -> OpContext:
    conn = LocalConnection("localhost")
    return OpContext(conn, FactCache(conn), check=check, diff=diff)


def test_fields_are_escaped_as_fstab_5_says() -> None:
    assert escape("/srv/my models\tx\\y") == "/srv/my\\040models\\011x\\134y"
    assert unescape(escape("/srv/my models\tx\\y")) == "/srv/my models\tx\\y"
    assert fstab_line(UUID, "/mnt/my models", "xfs", ["defaults", "_netdev", "nofail"], 0, 2) == (
        f"{UUID} /mnt/my\\040models xfs defaults,_netdev,nofail 0 2"
    )


def test_an_entry_replaces_the_mount_points_lines_in_place() -> None:
    lines = UBUNTU_FSTAB.splitlines()
    nfs = "nfs1:/export/models /mnt/models nfs4 _netdev,nofail 0 0"
    added = updated_fstab(lines, "/mnt/models", nfs)
    assert added == [*lines, nfs]
    # The same fields, other spacing: kept as written. Other fields: replaced where it was.
    assert updated_fstab(added, "/mnt/models", nfs.replace(" ", "\t")) == added
    changed = nfs.replace("nofail", "nofail,ro")
    assert updated_fstab([*added, "# end"], "/mnt/models", changed) == [*lines, changed, "# end"]
    # Duplicates of the mount point go; the first one's place is kept.
    assert updated_fstab([nfs, "x /y z d 0 0", nfs], "/mnt/models", changed) == [
        changed,
        "x /y z d 0 0",
    ]
    assert updated_fstab(added, "/mnt/models", None) == lines
    spaced = updated_fstab(lines, "/mnt/my models", "LABEL=m /mnt/my\\040models ext4 defaults 0 0")
    assert updated_fstab(spaced, "/mnt/my models", None) == lines  # matched unescaped


def test_mount_present_absent_on_a_file(tmp_path: Path) -> None:
    fstab = tmp_path / "fstab"
    fstab.write_text(UBUNTU_FSTAB)
    args = ("/mnt/models", UUID, "xfs")
    kwargs = {"opts": "defaults,_netdev,nofail", "passno": 2, "fstab": str(fstab)}

    preview = mount(make_ctx(check=True, diff=True), *args, state="present", **kwargs)
    assert preview.msg == f"would update {fstab}" and fstab.read_text() == UBUNTU_FSTAB
    assert preview.diff.endswith(f"+{UUID} /mnt/models xfs defaults,_netdev,nofail 0 2\n")
    assert mount(make_ctx(), *args, state="present", **kwargs).changed
    assert (
        fstab.read_text() == UBUNTU_FSTAB + f"{UUID} /mnt/models xfs defaults,_netdev,nofail 0 2\n"
    )
    again = mount(make_ctx(), *args, state="present", **kwargs)
    assert again.status is Status.OK and again.msg == f"{fstab} entry as wanted"
    # Not mounted here: unmounted has nothing to do now (the entry stays).
    unmounted = mount(make_ctx(), *args, state="unmounted", **kwargs)
    assert unmounted.status is Status.OK
    assert unmounted.msg == f"{fstab} entry as wanted; /mnt/models not mounted"
    gone = mount(make_ctx(), "/mnt/models", state="absent", fstab=str(fstab))
    assert gone.changed and fstab.read_text() == UBUNTU_FSTAB
    assert mount(make_ctx(), "/mnt/models", state="absent", fstab=str(fstab)).msg == (
        f"{fstab} entry absent; /mnt/models not mounted"
    )
    missing = tmp_path / "none"
    assert mount(make_ctx(), "/mnt/x", state="absent", fstab=str(missing)).status is Status.OK
    assert not missing.exists()


def test_a_mounted_path_with_a_changed_entry_is_remounted(tmp_path: Path) -> None:
    """Check mode only: this machine may have CAP_SYS_ADMIN; /proc is mounted everywhere."""
    fstab = tmp_path / "fstab"
    ctx = make_ctx(check=True)
    result = mount(ctx, "/proc", "proc", "proc", opts="defaults", fstab=str(fstab))
    if CAP_SYS_ADMIN in ctx.fact(Capabilities):
        assert result.msg == f"would create {fstab}; would remount /proc"
        assert result.data["commands"][-1] == f"mount --fstab {fstab} -o remount -- /proc"
    else:
        assert result.status is Status.CHANGED and result.msg.startswith(f"would create {fstab}; ")
        assert "remount /proc skipped: this host lacks CAP_SYS_ADMIN" in result.msg
    assert not fstab.exists()


def test_capabilities_parse_proc_status() -> None:
    # CapEff of a Docker container's root with the default capabilities (no CAP_SYS_ADMIN).
    out = RunResult("", 0, "CapEff:\t00000000a80425fb\n", "")
    caps = Capabilities().parse(out)
    assert CAP_SYS_ADMIN not in caps and 0 in caps and 31 in caps  # chown, setfcap
    assert CAP_SYS_ADMIN in Capabilities().parse(
        RunResult("", 0, "CapEff:\t000001ffffffffff\n", "")
    )


@pytest.mark.parametrize(
    ("args", "kwargs", "match"),
    [
        (("mnt/x", UUID, "xfs"), {}, "bad mount point"),
        (("/mnt/x/", UUID, "xfs"), {}, "bad mount point"),
        (("/mnt/x",), {}, "needs src and fstype"),
        (("/mnt/x", UUID, "xfs"), {"opts": "defaults, nofail"}, "bad mount options"),
        (("/mnt/x", UUID, "xfs"), {"opts": ""}, "bad mount options"),
        (("/mnt/x", UUID, "x fs"), {}, "bad src"),
        (("/mnt/x", UUID, "xfs"), {"passno": -1}, "bad passno"),
        (("/mnt/x", UUID, "xfs"), {"state": "mount"}, "unknown state"),
    ],
)
def test_bad_arguments(args: tuple, kwargs: dict, match: str) -> None:
    with pytest.raises(OpError, match=match):
        mount(make_ctx(), *args, **kwargs)
