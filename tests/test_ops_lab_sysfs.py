"""attribute over SSH on a lab host. Its /sys is the real kernel's, mounted read-only in the host:
the real attributes are read and compared, and a change is skipped with that reason (the real
kernel is never touched). The write path runs on a regular file of the host (an attribute file
behaves as one: read, compare, write), as root and as the sudo user with and without become."""

from __future__ import annotations

import glob
from pathlib import Path

import pytest
from test_ops_lab import converge, sh

from fxkit.connection.base import Connection
from fxkit.facts import FactCache
from fxkit.facts.sysfs import normalize_attribute
from fxkit.lab import SUDO_USER, Fleet
from fxkit.ops.base import OpContext, Status
from fxkit.ops.sysfs import attribute

pytestmark = pytest.mark.lab


def test_real_sysfs_is_compared_and_a_change_skipped(root: Connection) -> None:
    mtu = "/sys/class/net/lo/mtu"
    current = sh(root, f"cat {mtu}").strip()
    assert attribute(OpContext(root, FactCache(root)), mtu, current).msg == f"{mtu} is {current}"
    for check in (True, False):
        result = attribute(OpContext(root, FactCache(root), check=check), mtu, 1500)
        assert result.status is Status.SKIPPED
        assert result.msg == (
            f"/sys is mounted read-only on this host: {mtu} stays {current} (wanted 1500)"
        )
    assert sh(root, f"cat {mtu}").strip() == current


@pytest.mark.skipif(not glob.glob("/sys/block/*/queue/scheduler"), reason="no block devices")
def test_real_scheduler_choice_list(root: Connection) -> None:
    path = sorted(glob.glob("/sys/block/*/queue/scheduler"))[0]
    selected = normalize_attribute(Path(path).read_text())  # e.g. "[none] mq-deadline kyber bfq"
    assert attribute(OpContext(root, FactCache(root)), path, selected).status is Status.OK


def test_nvmet_configfs_missing_is_skipped(root: Connection) -> None:
    path = "/sys/kernel/config/nvmet/ports/1/addr_trtype"
    result = attribute(OpContext(root, FactCache(root)), path, "rdma")
    assert result.status is Status.SKIPPED
    assert result.msg == f"{path} does not exist on this host (no such device, driver or object)"


def test_write_compare_on_a_file_of_the_host(fleet: Fleet, root: Connection) -> None:
    path = "/srv/fxattr/addr_trtype"
    sh(root, f"mkdir -p /srv/fxattr && printf 'tcp\\n' > {path} && chmod 644 {path}")
    preview, applied, _ = converge(root, attribute, path, "rdma", state=lambda: root.get(path))
    assert preview.diff == f"{path}: tcp -> rdma\n"
    assert applied.msg == f"set {path} to rdma" and root.get(path) == b"rdma"

    password = fleet.become_password()
    if password is None:
        pytest.skip("sudo is not installed: lab hosts have no non-root user")
    with fleet.connect("lab01", ansible_user=SUDO_USER, ansible_become_password=password) as user:
        denied = attribute(OpContext(user, FactCache(user)), path, "tcp")
        assert denied.failed
        assert denied.msg == f"permission denied: cannot write {path}; run it as root (become)"
        converge(user, attribute, path, "tcp", become=True, state=lambda: root.get(path))
        assert root.get(path) == b"tcp"


def test_a_write_only_attribute_is_written_every_time(fleet: Fleet, root: Connection) -> None:
    password = fleet.become_password()
    if password is None:
        pytest.skip("sudo is not installed: lab hosts have no non-root user")
    path = f"/home/{SUDO_USER}/apply"  # mode 0200 like a configfs trigger (bnxt_re cc/apply)
    sh(root, f"install -m 0200 -o {SUDO_USER} /dev/null {path}")
    with fleet.connect("lab01", ansible_user=SUDO_USER, ansible_become_password=password) as user:
        for _ in range(2):
            result = attribute(OpContext(user, FactCache(user), diff=True), path, 1)
            assert result.changed and result.msg == f"set {path} to 1; it cannot be read back"
            assert result.diff.startswith(f"{path}: unreadable (cat: {path}: Permission denied)")
    assert root.get(path) == b"1"
