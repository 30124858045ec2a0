"""reboot on a lab host: PID 1 is sshd and CAP_SYS_BOOT is dropped (fxkit/lab/host-init.sh), so it
is skipped with both reasons, in check mode and for real, and the host stays up with the same
boot id. The reboot-and-wait path needs a host that can reboot: tests/test_ops_reboot.py tests its
logic against a fake connection."""

from __future__ import annotations

import pytest

from fxkit.connection.base import Connection
from fxkit.facts import FactCache
from fxkit.ops.base import OpContext, Status
from fxkit.ops.boot import BOOT_ID, reboot
from fxkit.ops.kernel import kernel_cmdline

pytestmark = pytest.mark.lab


def test_a_lab_host_cannot_reboot_and_says_why(root: Connection) -> None:
    boot_id = root.run(f"cat {BOOT_ID}").stdout
    for check in (True, False):
        result = reboot(OpContext(root, FactCache(root), check=check))
        assert result.status is Status.SKIPPED
        assert result.msg == (
            "cannot reboot this host: PID 1 is sshd, not an init system; "
            "no CAP_SYS_BOOT (a container)"
        )
    assert root.run(f"cat {BOOT_ID}").stdout == boot_id


def test_kernel_cmdline_feeds_reboot(root: Connection) -> None:
    root.run("mkdir -p /etc/default")
    root.put("/etc/default/grub", b'GRUB_CMDLINE_LINUX_DEFAULT="quiet"\n')
    ctx = OpContext(root, FactCache(root))
    changed = kernel_cmdline(ctx, ["iommu=pt"])
    assert changed.data["reboot_required"]
    assert reboot(ctx, required_by=changed).status is Status.SKIPPED  # required, but impossible
    same = kernel_cmdline(ctx, ["iommu=pt"])
    result = reboot(ctx, required_by=same)
    assert result.status is Status.OK and result.msg == "no reboot required"
