"""systemd units: template and instance names (checked against the real ``systemd-escape``),
unit files and drop-ins written to temp directories, and when daemon-reload runs.

No systemd runs here (nor on lab hosts), so the reload tests use a STAND-IN: ``SystemdHost`` is
this machine's LocalConnection that reports systemd as PID 1, and ``systemctl`` on its PATH is a
script that records its arguments and answers is-enabled/is-active like systemctl for a
disabled, inactive unit. What they show is which systemctl commands fxkit runs, and how often.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from fxkit.connection.base import RunResult
from fxkit.connection.local import LocalConnection
from fxkit.facts import FactCache, InitSystem
from fxkit.ops.base import OpContext, OpError, Status
from fxkit.ops.systemd import dropin, service, unit, unit_instance

UNIT = "[Unit]\nDescription=vLLM %i\n\n[Service]\nExecStart=/usr/bin/vllm serve --port 80%i\n"
ENV = "[Service]\nEnvironment=HF_HOME=/mnt/hf\n"


def local_ctx(check: bool = False) -> OpContext:
    conn = LocalConnection("localhost")
    return OpContext(conn, FactCache(conn), check=check, diff=True)


@pytest.mark.parametrize(
    "name",
    [
        "vllm.service",
        "vllm@.service",
        "vllm@0.service",
        "getty@tty1.service",
        "nvme@-dev-nvme0n1.service",
        "a\\x2db.service",
        "sys-kernel-config.mount",
        "x@a@b.timer",
    ],
)
def test_good_unit_names(name: str) -> None:
    service(local_ctx(check=True), name)  # no error (skipped or ok, whatever the host)


@pytest.mark.parametrize(
    "name",
    ["vllm", "vllm@", "@.service", "a b.service", "a;rm.service", "a\\q.service", "x.conf", "-"],
)
def test_bad_unit_names(name: str) -> None:
    with pytest.raises(OpError, match="bad unit name"):
        unit(local_ctx(), name, UNIT)
    with pytest.raises(OpError, match="bad unit name"):
        service(local_ctx(), name, state="started")


def test_a_template_cannot_be_started() -> None:
    with pytest.raises(OpError, match=r"vllm@\.service is a template: it cannot be started") as exc:
        service(local_ctx(), "vllm@.service", state="started")
    assert exc.value.hint == "name an instance, e.g. vllm@0.service"


@pytest.mark.skipif(not shutil.which("systemd-escape"), reason="systemd-escape is not installed")
@pytest.mark.parametrize("instance", ["0", "/dev/nvme0n1", "/dev/sda 1", "a-b/c.d_é:x", ".hidden"])
def test_unit_instance_escapes_as_systemd_escape(instance: str) -> None:
    real = subprocess.run(
        ["systemd-escape", "--template=vllm@.service", instance],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert unit_instance("vllm@.service", instance) == real


def test_unit_instance_needs_a_template() -> None:
    with pytest.raises(OpError, match="not a template unit"):
        unit_instance("vllm.service", "0")


def test_template_unit_and_drop_in_files(tmp_path: Path) -> None:
    preview = unit(local_ctx(check=True), "vllm@.service", UNIT, unit_dir=str(tmp_path))
    assert preview.changed and not (tmp_path / "vllm@.service").exists()
    unit(local_ctx(), "vllm@.service", UNIT, unit_dir=str(tmp_path))
    assert (tmp_path / "vllm@.service").read_text() == UNIT
    result = dropin(local_ctx(), "vllm@.service", "10-env", ENV, unit_dir=str(tmp_path))
    path = tmp_path / "vllm@.service.d" / "10-env.conf"
    assert result.changed and path.read_text() == ENV
    assert oct(path.stat().st_mode & 0o777) == "0o644"
    again = dropin(local_ctx(), "vllm@.service", "10-env.conf", ENV, unit_dir=str(tmp_path))
    assert again.status is Status.OK
    for bad in ("../x", "a b", ".conf", ""):
        with pytest.raises(OpError, match="bad drop-in name"):
            dropin(local_ctx(), "vllm@.service", bad, ENV, unit_dir=str(tmp_path))


class SystemdHost(LocalConnection):
    """This machine, reporting systemd as PID 1 (see the module docstring)."""

    def run(self, command: str, **kwargs) -> RunResult:  # type: ignore[no-untyped-def]
        if command == InitSystem.cmd:
            return RunResult(command, 0, "systemd\n", "")
        return super().run(command, **kwargs)


@pytest.fixture
def systemctl_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A recording ``systemctl`` first on PATH; returns the file its calls go to."""
    log, bin_dir = tmp_path / "systemctl.log", tmp_path / "bin"
    bin_dir.mkdir()
    script = bin_dir / "systemctl"
    script.write_text(
        f'#!/bin/sh\necho "$*" >> {log}\n'
        'case "$1" in is-enabled) echo disabled; exit 1;; is-active) echo inactive; exit 3;; esac\n'
    )
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{Path('/usr/bin')}:{Path('/bin')}")
    log.touch()
    return log


def test_several_unit_changes_reload_once_before_the_service(
    tmp_path: Path, systemctl_log: Path
) -> None:
    conn = SystemdHost("localhost")
    ctx = OpContext(conn, FactCache(conn))
    units = str(tmp_path / "units")
    first = unit(ctx, "vllm@.service", UNIT, unit_dir=units, daemon_reload=False)
    assert first.msg == f"created {units}; created {units}/vllm@.service; daemon-reload pending"
    second = dropin(ctx, "vllm@.service", "10-env", ENV, unit_dir=units, daemon_reload=False)
    assert second.msg.endswith("; daemon-reload pending")
    assert systemctl_log.read_text() == ""  # nothing reloaded yet
    started = service(ctx, "vllm@0.service", enabled=True, state="started")
    assert started.changed and started.msg == "daemon-reload, enable, start vllm@0.service: done"
    assert systemctl_log.read_text().splitlines() == [
        "is-enabled -- vllm@0.service",
        "is-active -- vllm@0.service",
        "daemon-reload",
        "enable -- vllm@0.service",
        "start -- vllm@0.service",
    ]
    # Nothing changed since: no reload, by the unit nor by the next service call.
    assert unit(ctx, "vllm@.service", UNIT, unit_dir=units).status is Status.OK
    service(ctx, "vllm@1.service", state="started")
    assert systemctl_log.read_text().count("daemon-reload") == 1
    # A change with the default daemon_reload=True reloads at once.
    changed = dropin(ctx, "vllm@.service", "10-env", ENV + "Nice=5\n", unit_dir=units)
    assert changed.msg.endswith("; daemon-reload done")
    assert systemctl_log.read_text().count("daemon-reload") == 2


def test_a_pending_reload_runs_even_when_the_service_is_as_wanted(
    tmp_path: Path, systemctl_log: Path
) -> None:
    conn = SystemdHost("localhost")
    ctx = OpContext(conn, FactCache(conn), check=True, diff=True)
    unit(ctx, "fx.service", UNIT, unit_dir=str(tmp_path), daemon_reload=False)
    preview = service(ctx, "fx.service", state="stopped")  # inactive already
    assert preview.msg == "would daemon-reload fx.service"
    assert preview.data["commands"] == ["systemctl daemon-reload"]
    assert preview.diff == "daemon-reload: unit files changed\n"
    assert service(ctx, "fx.service", state="stopped").status is Status.OK  # reported once
    assert "daemon-reload" not in systemctl_log.read_text()  # check mode ran nothing
