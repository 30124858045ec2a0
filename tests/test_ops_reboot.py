"""reboot's logic, against a FAKE connection: no machine here may really reboot (lab hosts lack
CAP_SYS_BOOT and an init; this machine runs the tests). ``RebootingHost`` plays a host that
answers the few commands reboot sends, drops the link when the reboot command has run, refuses
connections for a while and comes back with a new boot id; the clock is a fake one too, so the
waits cost nothing. What a lab host really answers (the skip with its reasons) is tested over
SSH in tests/test_ops_lab_reboot.py."""

from __future__ import annotations

import pytest

from fxkit.connection.base import Connection, RunResult
from fxkit.connection.local import LocalConnection
from fxkit.errors import ConnectionFailed
from fxkit.facts import FactCache, InitSystem, Kernel
from fxkit.ops import boot
from fxkit.ops.base import OpContext, Result, Status, ok
from fxkit.ops.boot import BOOT_ID, reboot

#: CapBnd of a root shell with every capability (a real host), and without CAP_SYS_BOOT (bit 22).
ALL_CAPS = "000001ffffffffff"
NO_SYS_BOOT = f"{int(ALL_CAPS, 16) & ~(1 << 22):016x}"


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


class RebootingHost(Connection):
    """A fake host: ``down_for`` connection attempts are refused after the reboot command; then
    it answers with ``new_boot_id`` (None: it never reboots, the old id stays)."""

    def __init__(
        self,
        init: str = "systemd",
        caps: str = ALL_CAPS,
        down_for: int = 3,
        new_boot_id: str | None = "b2",
    ):
        self.name = "fake"
        self.init, self.caps, self.down_for = init, caps, down_for
        self.boot_id, self.new_boot_id = "b1", new_boot_id
        self.up, self.refusals, self.opens, self.commands = True, 0, 0, []

    def open(self) -> None:
        self.opens += 1
        if not self.up:
            if self.refusals < self.down_for:
                self.refusals += 1
                raise ConnectionFailed(
                    "cannot connect: [Errno 111] Connection refused", where="host fake"
                )
            self.up = True
            self.boot_id = self.new_boot_id or self.boot_id

    def run(
        self,
        command: str,
        *,
        become: bool = False,
        timeout: float | None = None,
        stdin: bytes | None = None,
    ) -> RunResult:
        if not self.up:
            raise ConnectionFailed("connection lost: the SSH transport closed", where="host fake")
        self.commands.append(command)
        answers = {InitSystem.cmd: self.init, f"cat {BOOT_ID}": self.boot_id, Kernel.cmd: "6.8.0"}
        if command in answers:
            return RunResult(command, 0, f"{answers[command]}\n", "")
        if command.startswith("grep '^CapBnd:'"):
            return RunResult(command, 0, f"CapBnd:\t{self.caps}\n", "")
        if "reboot" in command or "shutdown -r" in command:
            self.up = False  # the background reboot takes the host down after the command returns
            return RunResult(command, 0, "", "")
        raise AssertionError(f"unexpected command {command!r}")

    def get(self, path: str, *, become: bool = False) -> bytes | None:
        raise AssertionError("reboot reads no files")

    def put(self, path: str, data: bytes, *, become: bool = False) -> None:
        raise AssertionError("reboot writes no files")

    def close(self) -> None:
        pass


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    fake = FakeClock()
    monkeypatch.setattr(boot, "time", fake)
    return fake


def run(host: Connection, check: bool = False, **kwargs: object) -> tuple[Result, FactCache]:
    facts = FactCache(host)
    return reboot(OpContext(host, facts, check=check), **kwargs), facts  # type: ignore[arg-type]


def test_reboot_waits_for_a_new_boot_id_and_drops_the_facts(clock: FakeClock) -> None:
    host = RebootingHost()
    facts = FactCache(host)
    assert facts.get(Kernel) == "6.8.0"  # a stable fact: only a reboot drops it
    result = reboot(OpContext(host, facts))
    assert result.status is Status.CHANGED, result
    assert result.msg == "rebooted in 15 s"  # pauses 1 + 2 + 4 refused, then 8: back
    assert clock.sleeps == [1.0, 2.0, 4.0, 8.0]
    assert result.data == {"boot_id": "b2", "previous_boot_id": "b1"}
    assert "nohup sh -c 'sleep 1; systemctl reboot'" in host.commands[-2]
    assert host.commands[-1] == f"cat {BOOT_ID}"
    assert facts._cache == {}


def test_sysv_init_reboots_with_shutdown(clock: FakeClock) -> None:
    host = RebootingHost(init="init", down_for=0)
    result, _ = run(host)
    assert result.changed and any("shutdown -r now" in c for c in host.commands)


def test_check_mode_says_it_would_reboot_and_does_not(clock: FakeClock) -> None:
    host = RebootingHost()
    result, _ = run(host, check=True)
    assert result.changed and result.msg == "would reboot (systemctl reboot)"
    assert host.up and not any("reboot" in c for c in host.commands)
    assert clock.sleeps == []


def test_a_host_that_does_not_come_back_times_out_with_the_last_error(clock: FakeClock) -> None:
    result, _ = run(RebootingHost(down_for=1000), timeout=60)
    assert result.failed
    assert result.msg == (
        "the host was not back with a new boot id after 60 s: unreachable: "
        "cannot connect: [Errno 111] Connection refused"
    )
    assert max(clock.sleeps) == 10.0 and clock.now == pytest.approx(60)


def test_a_host_that_answers_with_the_same_boot_id_did_not_reboot(clock: FakeClock) -> None:
    result, _ = run(RebootingHost(down_for=0, new_boot_id=None), timeout=5)
    assert result.failed and result.msg.endswith(
        "it answers with the same boot id: it has not rebooted"
    )


def test_only_when_required(clock: FakeClock) -> None:
    host = RebootingHost()
    nothing = ok("kernel arguments present")
    result, _ = run(host, required_by=nothing)
    assert result.status is Status.OK and result.msg == "no reboot required"
    assert host.commands == []
    needed = Result(Status.CHANGED, "updated /etc/default/grub", data={"reboot_required": True})
    result, _ = run(host, required_by=[nothing, needed])
    assert result.changed and result.msg.startswith("rebooted in ")


@pytest.mark.parametrize(
    ("init", "caps", "reason"),
    [
        ("sshd", ALL_CAPS, "PID 1 is sshd, not an init system"),
        ("systemd", NO_SYS_BOOT, "no CAP_SYS_BOOT (a container)"),
        ("sshd", NO_SYS_BOOT, "PID 1 is sshd, not an init system; no CAP_SYS_BOOT (a container)"),
    ],
)
def test_hosts_that_cannot_reboot_are_skipped(
    clock: FakeClock, init: str, caps: str, reason: str
) -> None:
    host = RebootingHost(init=init, caps=caps)
    for check in (True, False):
        result, _ = run(host, check=check)
        assert (
            result.status is Status.SKIPPED and result.msg == f"cannot reboot this host: {reason}"
        )
    assert host.up


def test_the_machine_fxkit_runs_on_is_never_rebooted() -> None:
    result, _ = run(LocalConnection("localhost"))
    assert result.status is Status.SKIPPED
    assert result.msg == "cannot reboot this host: it is the machine fxkit runs on"
