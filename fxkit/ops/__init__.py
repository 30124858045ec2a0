"""Idempotent operations, by name: what a role's Host API exposes (``host.file(...)``)."""

from __future__ import annotations

from fxkit.ops.apt import apt_pin, apt_repository, package_hold
from fxkit.ops.base import OpContext, Operation, OpError, Result, Status
from fxkit.ops.boot import reboot
from fxkit.ops.checkpoints import stage
from fxkit.ops.commands import command
from fxkit.ops.files import directory, file, link
from fxkit.ops.filesystems import filesystem
from fxkit.ops.instances import instance, instance_ready
from fxkit.ops.kernel import kernel_cmdline, module, sysctl
from fxkit.ops.lines import block, line
from fxkit.ops.mounts import mount
from fxkit.ops.packages import packages
from fxkit.ops.python import git, virtualenv
from fxkit.ops.sysfs import attribute
from fxkit.ops.systemd import dropin, service, unit
from fxkit.ops.transfer import copy, download
from fxkit.ops.users import group, group_member, user
from fxkit.ops.wait import wait_for

#: Every operation by the name a role calls it with.
OPERATIONS: dict[str, Operation] = {
    op.__name__: op
    for op in (
        directory,
        file,
        link,
        line,
        block,
        command,
        packages,
        unit,
        service,
        sysctl,
        module,
        kernel_cmdline,
        group_member,
        virtualenv,
        git,
        dropin,
        wait_for,
        reboot,
        attribute,
        group,
        user,
        apt_repository,
        apt_pin,
        package_hold,
        copy,
        download,
        mount,
        filesystem,
        instance,
        instance_ready,
        stage,
    )
}

__all__ = ["OPERATIONS", "OpContext", "OpError", "Operation", "Result", "Status"]
