"""Every operation that changes a system, for real over SSH on lab hosts (fxkit.lab).

Each one runs in check mode with diff (which must change nothing on the host), then for real, then
again (which must change nothing more); the host's state is read back over SSH each time. Lab
hosts have their own /etc, /var and /usr (overlays), a read-only /proc/sys and /sys, no systemd,
no CAP_SYS_MODULE, and a non-root user ``fxkit`` that becomes root with a sudo password.
"""

from __future__ import annotations

import logging
import shlex
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from fxkit.connection.base import Connection
from fxkit.facts import FactCache
from fxkit.lab import Fleet
from fxkit.ops.base import OpContext, Result, Status
from fxkit.ops.files import directory, file
from fxkit.ops.kernel import kernel_cmdline, module, sysctl
from fxkit.ops.lines import line
from fxkit.ops.packages import packages
from fxkit.ops.systemd import service, unit
from fxkit.ops.users import group_member

pytestmark = pytest.mark.lab


def sh(conn: Connection, command: str) -> str:
    """Run a command that must succeed on the host; its stdout."""
    result = conn.run(command)
    assert result.ok, result
    return result.stdout


def converge(
    conn: Connection,
    op: Callable[..., Result],
    *args: Any,
    state: Callable[[], Any],
    become: bool = False,
    **kwargs: Any,
) -> tuple[Result, Result, Result]:
    """Check mode (with diff), then the change, then the same again; asserts that check mode left
    ``state()`` as it was and that the third run changed nothing. Returns the three results."""

    def run(check: bool) -> Result:
        ctx = OpContext(conn, FactCache(conn), check=check, diff=True, become=become)
        return op(ctx, *args, **kwargs)

    before = state()
    preview = run(check=True)
    assert preview.changed and preview.msg.startswith("would "), preview
    assert state() == before, "check mode changed the host"
    applied = run(check=False)
    assert applied.changed, applied
    assert state() != before
    again = run(check=False)
    assert not again.changed and not again.failed, again
    assert not run(check=True).changed
    return preview, applied, again


def test_group_member_runs_usermod_on_the_hosts_etc_group(root: Connection) -> None:
    sh(
        root,
        "id opsuser >/dev/null 2>&1 || useradd opsuser; getent group opsgrp || groupadd opsgrp",
    )

    def groups() -> tuple[str, str]:
        return sh(root, "id -nG opsuser"), sh(root, "grep -E '^(video|opsgrp):' /etc/group")

    preview, applied, again = converge(
        root, group_member, "opsuser", ["video", "opsgrp"], state=groups
    )
    assert preview.diff == "groups of opsuser: opsuser -> opsuser video opsgrp\n"
    assert applied.msg == "added opsuser to video, opsgrp"
    assert set(sh(root, "id -nG opsuser").split()) == {"opsuser", "video", "opsgrp"}
    assert "video:x:44:opsuser" in groups()[1]
    assert again.status is Status.OK
    assert (
        group_member(OpContext(root, FactCache(root)), "no-such-user", "video").msg
        == "no such user: no-such-user"
    )


def test_sysctl_is_persisted_and_the_read_only_proc_sys_is_skipped(root: Connection) -> None:
    name, conf = "net.core.somaxconn", "/etc/sysctl.d/90-fxkit.conf"
    live = int(sh(root, "cat /proc/sys/net/core/somaxconn"))
    want = live + 1

    preview, applied, again = converge(root, sysctl, name, want, state=lambda: root.get(conf))
    assert preview.diff == f"--- /dev/null\n+++ {conf}\n@@ -0,0 +1 @@\n+{name} = {want}\n"
    assert applied.msg == (f"created {conf}; persisted; applies at boot: /proc/sys is read-only")
    assert root.get(conf) == f"{name} = {want}\n".encode()
    assert int(sh(root, "cat /proc/sys/net/core/somaxconn")) == live  # the real kernel: untouched
    # The live part still cannot be applied: skipped each time, never "changed" again.
    assert again.status is Status.SKIPPED
    assert again.msg == "content as wanted; persisted; applies at boot: /proc/sys is read-only"
    # The value the kernel already has is simply ok.
    same = sysctl(OpContext(root, FactCache(root)), name, live, file="/etc/sysctl.d/91-fxkit.conf")
    assert same.changed and same.msg.endswith(f"{name} is {live}")
    assert (
        sysctl(
            OpContext(root, FactCache(root)), name, live, file="/etc/sysctl.d/91-fxkit.conf"
        ).status
        is Status.OK
    )


def test_module_is_persisted_and_its_load_skipped(root: Connection) -> None:
    load, options = "/etc/modules-load.d/fxkit_lab.conf", "/etc/modprobe.d/fxkit_lab.conf"

    def persisted() -> tuple[bytes | None, bytes | None]:
        return root.get(load), root.get(options)

    preview, applied, again = converge(root, module, "fxkit_lab", {"debug": 1}, state=persisted)
    assert "+options fxkit_lab debug=1\n" in preview.diff
    assert persisted() == (b"fxkit_lab\n", b"options fxkit_lab debug=1\n")
    assert sh(root, f"stat -c %a {load} {options}") == "644\n644\n"
    assert "loads at boot:" in applied.msg and again.status is Status.SKIPPED
    reason = again.msg.rpartition("loads at boot: ")[2]
    assert reason in ("modprobe is not installed", "/sys/module is read-only"), again
    assert sh(root, "test ! -e /sys/module/fxkit_lab && echo absent") == "absent\n"


def test_kernel_cmdline_on_the_hosts_grub_file(root: Connection) -> None:
    grub = "/etc/default/grub"
    sh(root, "mkdir -p /etc/default")
    root.put(grub, b'GRUB_DEFAULT=0\nGRUB_CMDLINE_LINUX_DEFAULT="quiet iommu=off"\n')

    preview, applied, again = converge(
        root, kernel_cmdline, ["iommu=pt", "amd_iommu=on"], state=lambda: root.get(grub)
    )
    assert '+GRUB_CMDLINE_LINUX_DEFAULT="quiet iommu=pt amd_iommu=on"' in preview.diff
    assert preview.msg.endswith("; reboot required") and preview.data["reboot_required"]
    assert root.get(grub) == (
        b'GRUB_DEFAULT=0\nGRUB_CMDLINE_LINUX_DEFAULT="quiet iommu=pt amd_iommu=on"\n'
    )
    assert applied.msg == (
        f"updated {grub}; update-grub not found: regenerate the boot config; reboot required"
    )
    assert applied.data["reboot_required"] and again.msg == "kernel arguments present"


def test_unit_is_installed_and_service_skipped_without_systemd(root: Connection) -> None:
    path = "/etc/systemd/system/fxkit-lab.service"
    content = "[Unit]\nDescription=fxkit lab\n\n[Service]\nExecStart=/bin/true\n"
    preview, applied, again = converge(
        root, unit, "fxkit-lab.service", content, state=lambda: root.get(path)
    )
    no_systemd = "systemd is not running on this host (PID 1 is sshd)"
    assert preview.msg == f"would create {path}; daemon-reload skipped: {no_systemd}"
    assert applied.msg == f"created {path}; daemon-reload skipped: {no_systemd}"
    assert root.get(path) == content.encode()
    assert sh(root, f"stat -c %U:%a {path}") == "root:644\n"
    assert again.status is Status.OK

    for check in (True, False):
        result = service(
            OpContext(root, FactCache(root), check=check),
            "fxkit-lab.service",
            enabled=True,
            state="started",
        )
        assert result.status is Status.SKIPPED
        assert result.msg == f"{no_systemd}: fxkit-lab.service not managed"


def test_directory_and_file_owned_by_another_user(root: Connection, sudo_user: str) -> None:
    top, conf = "/srv/fxkit-owned/sub", "/srv/fxkit-owned/sub/app.conf"

    def stat(path: str) -> Callable[[], str]:
        return lambda: root.run(f"stat -c %F:%U:%G:%a {shlex.quote(path)}").stdout

    preview, _, _ = converge(
        root, directory, top, mode="0750", owner=sudo_user, group=sudo_user, state=stat(top)
    )
    assert preview.diff == "state: absent -> directory\n"
    assert stat(top)() == f"directory:{sudo_user}:{sudo_user}:750\n"

    preview, applied, _ = converge(
        root, file, conf, "port = 80\n", mode=0o640, owner=sudo_user, state=stat(conf)
    )
    assert stat(conf)() == f"regular file:{sudo_user}:root:640\n"
    assert root.get(conf) == b"port = 80\n"

    # Only attributes: group to the user, then back, each step idempotent.
    preview, applied, _ = converge(root, file, conf, group=sudo_user, state=stat(conf))
    assert preview.diff == f"group: root -> {sudo_user}\n"
    assert applied.msg == f"changed group root -> {sudo_user} of {conf}"
    # New content keeps the owner the file had (the temp file copies it before the rename).
    assert file(OpContext(root, FactCache(root)), conf, "port = 81\n").changed
    assert stat(conf)() == f"regular file:{sudo_user}:{sudo_user}:640\n"
    assert sh(root, "ls -A /srv/fxkit-owned/sub") == "app.conf\n"  # no temp file left behind


def test_become_as_the_non_root_user_with_a_password(
    fleet: Fleet, sudo_user: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)  # paramiko's transport log included
    password = fleet.become_password()
    target, conf = "/etc/fxkit-become.conf", "/etc/sysctl.d/92-fxkit-become.conf"
    results: list[Result] = []
    with (
        fleet.connect("lab01") as root,
        fleet.connect("lab01", ansible_user=sudo_user, ansible_become_password=password) as user,
    ):
        assert user.run("id -un").stdout == f"{sudo_user}\n"

        def owned() -> str:
            return root.run(f"stat -c %U:%a {target} && cat {target}").stdout

        results += converge(
            user, file, target, "secret = 1\n", mode="0600", become=True, state=owned
        )
        assert owned() == "root:600\nsecret = 1\n"
        assert user.run(f"cat {target}").rc != 0  # really root's, unreadable to the user
        # A change of a root-only file: its diff needs the old content, read through sudo too.
        results += converge(user, file, target, "secret = 2\n", become=True, state=owned)
        assert "-secret = 1\n+secret = 2\n" in results[-2].diff
        assert owned() == "root:600\nsecret = 2\n"
        assert sh(root, "ls -A /etc | grep -c '[.]fxkit[.]' || true") == "0\n"  # no temp files
        results += converge(
            user, line, conf, "vm.swappiness = 7", become=True, state=lambda: root.get(conf)
        )
        assert sh(root, f"stat -c %U {conf}") == "root\n"
        # Without become the same change fails, and says why.
        denied = file(OpContext(user, FactCache(user)), "/etc/fxkit-denied", "x")
        assert denied.failed and "Permission denied" in denied.msg, denied
        results.append(denied)
    for result in results:
        assert password not in repr(result)
    assert caplog.records and password not in caplog.text


@pytest.fixture
def apt_repo(root: Connection) -> Iterator[str]:
    """A package, ``fxkit-test-pkg`` 1.0, in a local file: apt repository of the host; apt's index
    knows it (refreshed from that source alone: nothing goes to the network)."""
    tools = sh(root, "for t in apt-get dpkg-deb dpkg-scanpackages; do command -v $t; done")
    if len(tools.split()) < 3:
        pytest.skip("needs apt-get, dpkg-deb and dpkg-scanpackages (dpkg-dev) on the lab hosts")
    sh(
        root,
        "set -e; rm -rf /srv/repo /tmp/pkg; "
        "mkdir -p /srv/repo /tmp/pkg/DEBIAN /tmp/pkg/usr/share/doc/fxkit-test-pkg; "
        "echo 'fxkit lab test package' > /tmp/pkg/usr/share/doc/fxkit-test-pkg/README; "
        "printf '%s\\n' 'Package: fxkit-test-pkg' 'Version: 1.0' 'Architecture: all' "
        "'Maintainer: fxkit <fxkit@localhost>' 'Description: fxkit lab test package' "
        "> /tmp/pkg/DEBIAN/control; "
        "dpkg-deb --root-owner-group --build /tmp/pkg /srv/repo/fxkit-test-pkg_1.0_all.deb; "
        "cd /srv/repo && dpkg-scanpackages --multiversion . > Packages 2>/dev/null",
    )
    sources = "/etc/apt/sources.list.d/fxkit-test.list"
    root.put(sources, b"deb [trusted=yes] file:/srv/repo ./\n")
    sh(
        root,
        f"apt-get update -q -o Dir::Etc::SourceList={sources} -o Dir::Etc::SourceParts=- "
        "-o APT::Get::List-Cleanup=0",
    )
    yield "fxkit-test-pkg"
    root.run(f"dpkg --purge fxkit-test-pkg; rm -f {sources}")


def test_packages_install_and_remove_with_apt(root: Connection, apt_repo: str) -> None:
    def installed() -> str:
        return root.run(f"dpkg-query -W -f '${{Version}} ${{db:Status-Status}}' {apt_repo}").stdout

    readme = f"/usr/share/doc/{apt_repo}/README"
    preview, applied, again = converge(root, packages, [apt_repo], state=installed)
    assert preview.diff == f"{apt_repo}: absent -> present\n"
    assert applied.msg == f"installed {apt_repo}" and again.msg == "packages present"
    assert installed() == "1.0 installed"
    assert root.get(readme) == b"fxkit lab test package\n"
    assert packages(OpContext(root, FactCache(root)), f"{apt_repo}=1.0").status is Status.OK
    missing = packages(OpContext(root, FactCache(root)), f"{apt_repo}=2.0")
    assert missing.failed and "'2.0' for 'fxkit-test-pkg' was not found" in missing.msg, missing

    # converge()'s own ``state`` is the read-back: the package state goes through _remove.
    preview, applied, again = converge(root, _remove, apt_repo, state=installed)
    assert preview.diff == f"{apt_repo}: 1.0 -> absent\n"
    assert applied.msg == f"removed {apt_repo}" and again.msg == "packages absent"
    assert installed() in ("", "1.0 not-installed", "1.0 config-files")
    assert root.get(readme) is None


def _remove(ctx: OpContext, name: str) -> Result:
    return packages(ctx, name, state="absent")


def test_usermod_and_apt_through_become(fleet: Fleet, sudo_user: str, apt_repo: str) -> None:
    password = fleet.become_password()
    with (
        fleet.connect("lab01") as root,
        fleet.connect("lab01", ansible_user=sudo_user, ansible_become_password=password) as user,
    ):
        results = converge(
            user,
            group_member,
            sudo_user,
            "video",
            become=True,
            state=lambda: sh(root, f"id -nG {sudo_user}"),
        )
        assert "video" in sh(root, f"id -nG {sudo_user}").split()

        def installed() -> str:
            return root.run(f"dpkg-query -W -f '${{db:Status-Status}}' {apt_repo}").stdout

        results += converge(user, packages, apt_repo, become=True, state=installed)
        assert installed() == "installed"
        results += converge(user, _remove, apt_repo, become=True, state=installed)
        assert installed() != "installed"
    for result in results:
        assert password not in repr(result)
