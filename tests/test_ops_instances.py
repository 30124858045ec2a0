"""Service instances where systemd runs the host: which systemctl commands fxkit runs, and when.

No systemd runs here, so, as in tests/test_ops_systemd.py, a STAND-IN: this machine's
LocalConnection reporting systemd as PID 1, and a ``systemctl`` first on PATH that records its
arguments and keeps the unit's state in a file (``restart`` makes it active, ``stop`` inactive).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from test_ops_systemd import SystemdHost

from fxkit.facts import FactCache
from fxkit.ops.base import OpContext, OpError, Status
from fxkit.ops.instances import InstanceReady, InstanceStarted, instance

UNIT = "vllm@tp4-0.service"
ARGV = ["/opt/venv/bin/vllm", "serve", "/mnt/models/m"]


@pytest.fixture
def systemctl(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    log, state, bin_dir = tmp_path / "systemctl.log", tmp_path / "active", tmp_path / "bin"
    bin_dir.mkdir()
    script = bin_dir / "systemctl"
    script.write_text(
        f'#!/bin/sh\necho "$*" >> {log}\n'
        f'case "$1" in restart) touch {state};; stop|disable) rm -f {state};;\n'
        f"  is-active) if [ -e {state} ]; then echo active; else echo inactive; exit 3; fi;;\n"
        "esac\n"
    )
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    log.touch()
    return log


def run(tmp_path: Path, env: dict[str, str], state: str = "started", check: bool = False):
    conn = SystemdHost("localhost")
    ctx = OpContext(conn, FactCache(conn), check=check, diff=True)
    return instance(ctx, UNIT, ARGV, env, state, str(tmp_path / "state"), str(tmp_path / "log"))


def calls(log: Path) -> list[str]:
    return [line for line in log.read_text().splitlines() if not line.startswith("is-active")]


def test_systemd_starts_enables_and_restarts_only_on_change(tmp_path: Path, systemctl: Path):
    env = {"HIP_VISIBLE_DEVICES": "0,1,2,3"}
    preview = run(tmp_path, env, check=True)
    assert preview.msg == f"would start {UNIT} under systemd (stopped)"
    assert calls(systemctl) == []
    # What it reports of the instance, typed: the rollout reads it back from the results.
    would = InstanceStarted(unit=UNIT, backend="systemd", restarted=True)
    assert InstanceStarted.read(preview.data) == would  # no start time in check mode

    started = run(tmp_path, env)
    assert started.changed and started.data["backend"] == "systemd"
    assert calls(systemctl) == [f"enable -q -- {UNIT}", f"restart -- {UNIT}"]
    assert (tmp_path / "state" / f"{UNIT}.json").exists()
    report = InstanceStarted.read(started.data)
    assert report is not None and report.restarted and report.pid == 0
    assert report.started_at is not None and InstanceReady.read(started.data) is None

    same = run(tmp_path, env)
    assert same.status is Status.OK
    assert InstanceStarted.read(same.data) == report.model_copy(update={"restarted": False})
    assert len(calls(systemctl)) == 2  # running as configured: nothing

    changed = run(tmp_path, {"HIP_VISIBLE_DEVICES": "4,5,6,7"})
    assert changed.msg == f"restarted {UNIT} under systemd (configuration changed)"
    assert calls(systemctl)[2:] == [f"enable -q -- {UNIT}", f"restart -- {UNIT}"]

    assert run(tmp_path, env, state="stopped").changed
    # Disabled too (not back at boot), and a failed state cleared.
    assert calls(systemctl)[-2:] == [f"disable -q --now -- {UNIT}", f"reset-failed -- {UNIT}"]
    assert not (tmp_path / "state" / f"{UNIT}.json").exists()


@pytest.mark.parametrize(
    ("unit", "argv", "env"),
    [
        ("vllm@.service", ARGV, {}),  # a template
        ("vllm.socket", ARGV, {}),
        (UNIT, [], {}),
        (UNIT, ARGV, {"BAD NAME": "x"}),
        (UNIT, ARGV, {"A": "two\nlines"}),
    ],
)
def test_bad_instances_are_refused(unit: str, argv: list[str], env: dict[str, str]) -> None:
    conn = SystemdHost("localhost")
    with pytest.raises(OpError):
        instance(OpContext(conn, FactCache(conn)), unit, argv, env)
