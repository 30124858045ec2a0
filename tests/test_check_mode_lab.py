"""Check mode holds by construction: every operation, run in check mode against a real lab host,
leaves the host byte-identical, and reports the change and the commands it would have run.

One case per operation (the test fails when an operation has none). Each case would change the
host; check mode must only say so. The host's state is compared two ways: nothing under the
writable folders has an mtime after a marker (a write, a new, renamed or deleted entry anywhere
shows), and a listing of /etc, /root, /opt, /srv, /home and /tmp (type, mode, owners, size,
mtime: a chmod or chown shows), with the sha256 of every file under /etc, /root, /home and
/tmp, is the same before and after. (Not ctimes: the lab's /etc and /var are overlays over hard
links to the real machine's files, whose ctimes change when another fleet links them.)
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from fxkit.connection.base import Connection
from fxkit.facts import FactCache
from fxkit.lab import Fleet
from fxkit.ops import OPERATIONS
from fxkit.ops.base import OpContext, Status

pytestmark = pytest.mark.lab

WRITABLE = "/etc /var /usr /opt /srv /root /home /tmp /run"
LISTED = "/etc /root /opt /srv /home /tmp"
HASHED = "/etc /root /home /tmp"
MARKER = "/run/fxkit-check-marker"
UNIT = "[Unit]\nDescription=check mode\n[Service]\nExecStart=/bin/true\n"

#: operation -> (args, kwargs): a call that would change a lab host.
CASES: dict[str, tuple[tuple[Any, ...], dict[str, Any]]] = {
    "directory": (("/opt/fxkit-check/deep",), {"mode": "0750"}),
    "file": (("/etc/hostname",), {"content": "renamed\n", "mode": "0600", "backup": True}),
    "link": (("/opt/fxkit-check-link", "fxkit-check-target"), {}),
    "line": (("/etc/security/limits.conf", "*  soft  memlock  unlimited"), {}),
    "block": (("/etc/hosts", "10.0.0.1 fx100-a"), {}),
    "command": (("touch /root/ran",), {"creates": "/root/ran", "unless": "false"}),
    "packages": ((["nvme-cli"],), {"update_cache": True}),
    "unit": (("vllm@.service", UNIT), {}),
    "service": (("ssh.service",), {"enabled": True, "state": "started"}),
    "sysctl": (("vm.swappiness", 7), {}),
    "module": (("nvme_rdma",), {"params": {"k": 1}}),
    "kernel_cmdline": ((["iommu=pt"],), {"grub_file": "/etc/default/grub"}),
    "group_member": (("fxkit", ["adm"]), {}),
    "virtualenv": (("/opt/fxkit-check-venv", ["pip"]), {}),
    "git": (("/srv/fxkit-check.git", "/opt/fxkit-check-src", "main"), {}),
    "dropin": (("vllm@.service", "limits", "[Service]\nLimitMEMLOCK=infinity\n"), {}),
    "wait_for": ((), {"path": "/root/never", "timeout": 5}),
    "instance": (("fxcheck@a0.service", ["sleep", "100"], {"A": "1"}), {}),
    "stage": (("/srv/nfs/model", "/srv/fast/model"), {"command": "/opt/fxkit-none/bin/fxkit"}),
    "instance_ready": (("fxcheck@a0.service", "http://127.0.0.1:18999/v1/models", "m"), {}),
    "reboot": ((), {}),
    "attribute": (("/sys/kernel/mm/transparent_hugepage/enabled", "never"), {}),
    "group": (("render",), {"gid": 4242, "system": True}),
    "user": (("vllm",), {"groups": ["adm"], "shell": "/bin/sh"}),
    "apt_repository": (
        ("rocm", "https://repo.radeon.com/rocm/apt/7.2.2", "noble", "main"),
        {"keyring": "/etc/apt/keyrings/rocm.gpg", "architectures": "amd64", "update": True},
    ),
    "apt_pin": (("rocm-pin-600", "release o=repo.radeon.com", 600), {}),
    "package_hold": ((["openssh-server"],), {}),
    "copy": ((__file__, "/opt/fxkit-check-copy.py"), {"mode": "0600"}),
    "download": (("file:///etc/os-release", "/opt/fxkit-check-download", "0" * 64), {}),
    "mount": (
        ("/srv/fxkit-check-mnt", "UUID=0b3c4f5e-8d4a-4c7e-9f1a-2a6e3c1d9b7f", "xfs"),
        {"opts": "defaults,_netdev,nofail"},
    ),
    "filesystem": (("/root/fxkit-check-fs.img", "xfs"), {"label": "check"}),
}


@pytest.fixture(scope="module")
def host(lab_fleet) -> Iterator[Connection]:
    fleet: Fleet = lab_fleet(1, name="checkmode")
    with fleet.connect("lab01") as conn:
        setup = conn.run(
            "set -e; mkdir -p /etc/default; "
            "printf 'GRUB_CMDLINE_LINUX_DEFAULT=\"quiet\"\\n' > /etc/default/grub; "
            "getent passwd fxkit >/dev/null || useradd fxkit; "
            "truncate -s 300M /root/fxkit-check-fs.img"
        )
        assert setup.ok, setup
        yield conn


def snapshot(conn: Connection) -> str:
    listing = conn.run(
        f"for d in {LISTED}; do [ -d $d ] && find $d -xdev -printf '%p %y %m %U %G %s %T@\\n'; "
        f"done | sort; for d in {HASHED}; do [ -d $d ] && find $d -xdev -type f "
        "-exec sha256sum {} +; done | sort"
    )
    assert listing.ok, listing
    return listing.stdout


def modified_since_marker(conn: Connection) -> list[str]:
    found = conn.run(
        f"for d in {WRITABLE}; do [ -d $d ] && find $d -newer {MARKER} ! -path {MARKER}; done"
    )
    assert found.ok, found
    return found.stdout.split()


def test_every_operation_has_a_case() -> None:
    assert set(CASES) == set(OPERATIONS)


@pytest.mark.parametrize("name", sorted(CASES))
def test_check_mode_leaves_the_host_byte_identical(host: Connection, name: str) -> None:
    args, kwargs = CASES[name]
    before = snapshot(host)
    assert host.run(f"touch {MARKER} && sleep 0.05").ok
    ctx = OpContext(host, FactCache(host), check=True, diff=True)
    result = OPERATIONS[name](ctx, *args, **kwargs)
    assert result.status in (Status.CHANGED, Status.SKIPPED), result
    assert modified_since_marker(host) == [], f"check mode changed the host: {result}"
    assert snapshot(host) == before
    if result.changed:
        assert result.msg.startswith("would "), result
        assert result.data.get("commands"), f"no command it would have run: {result}"
        assert result.diff or name == "command", f"no diff in check mode with --diff: {result}"
