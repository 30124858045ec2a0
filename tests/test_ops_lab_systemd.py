"""Template units, instances and drop-ins over SSH on a lab host. Without systemd (PID 1 is
sshd) the files converge and every systemctl step is skipped with the reason; the order and
count of systemctl commands where systemd runs: tests/test_ops_systemd.py."""

from __future__ import annotations

import pytest
from test_ops_lab import converge, sh

from fxkit.connection.base import Connection
from fxkit.facts import FactCache
from fxkit.ops.base import OpContext, Status
from fxkit.ops.systemd import dropin, service, unit, unit_instance

pytestmark = pytest.mark.lab

NO_SYSTEMD = "systemd is not running on this host (PID 1 is sshd)"
UNIT = "[Unit]\nDescription=fxkit lab %i\n\n[Service]\nExecStart=/bin/sleep infinity\n"
DROPIN = "[Service]\nEnvironment=FXKIT_LAB=1\n"


def test_template_unit_drop_in_and_instances(root: Connection) -> None:
    template = "/etc/systemd/system/fxkit-lab@.service"
    preview, applied, again = converge(
        root, unit, "fxkit-lab@.service", UNIT, state=lambda: root.get(template)
    )
    assert preview.msg == f"would create {template}; daemon-reload skipped: {NO_SYSTEMD}"
    assert root.get(template) == UNIT.encode() and again.status is Status.OK

    conf = "/etc/systemd/system/fxkit-lab@.service.d/10-env.conf"
    preview, applied, again = converge(
        root, dropin, "fxkit-lab@.service", "10-env", DROPIN, state=lambda: root.get(conf)
    )
    assert f"+++ {conf}\n" in preview.diff and "+Environment=FXKIT_LAB=1\n" in preview.diff
    assert applied.msg == (
        "created /etc/systemd/system/fxkit-lab@.service.d; "
        f"created {conf}; daemon-reload skipped: {NO_SYSTEMD}"
    )
    assert sh(root, f"stat -c %U:%a {conf}") == "root:644\n"

    instance = unit_instance("fxkit-lab@.service", "/dev/nvme0n1")
    assert instance == "fxkit-lab@-dev-nvme0n1.service"
    result = service(OpContext(root, FactCache(root)), instance, enabled=True, state="started")
    assert result.status is Status.SKIPPED
    assert result.msg == f"{NO_SYSTEMD}: {instance} not managed"


def test_a_pending_reload_is_dropped_where_systemd_is_missing(root: Connection) -> None:
    ctx = OpContext(root, FactCache(root))
    result = unit(ctx, "fxkit-pending.service", UNIT, daemon_reload=False)
    assert result.msg == "created /etc/systemd/system/fxkit-pending.service; daemon-reload pending"
    assert ctx.pending == {"daemon-reload"}
    assert service(ctx, "fxkit-pending.service", state="started").status is Status.SKIPPED
    assert ctx.pending == set()
