"""packages, systemd, users: against the real machine only read-only (check mode, facts) and the
skip-with-reason paths; unit files into a temp directory. Full changes run on lab hosts."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from fxkit.connection.local import LocalConnection
from fxkit.facts import FactCache, InitSystem
from fxkit.ops.base import OpContext, OpError, Status
from fxkit.ops.packages import packages, parse_spec, version_matches
from fxkit.ops.systemd import service, unit
from fxkit.ops.users import group_member

NO_SYSTEMD = not Path("/run/systemd/system").is_dir()
HAS_DPKG = Path("/usr/bin/dpkg-query").exists()


def make_ctx(check: bool = False, diff: bool = False) -> OpContext:
    conn = LocalConnection("localhost")
    return OpContext(conn, FactCache(conn), check=check, diff=diff)


@pytest.mark.skipif(not HAS_DPKG, reason="needs a Debian-family machine")
def test_packages_installed_is_ok_and_absent_would_install() -> None:
    assert packages(make_ctx(), ["bash", "coreutils"]).status is Status.OK
    result = packages(make_ctx(check=True, diff=True), ["bash", "fxkit-absent-pkg"])
    assert result.changed and result.msg == "would install fxkit-absent-pkg"
    assert result.diff == "fxkit-absent-pkg: absent -> present\n"
    assert packages(make_ctx(check=True), "fxkit-absent-pkg", state="absent").status is Status.OK
    removal = packages(make_ctx(check=True), ["bash"], state="absent")
    assert removal.changed and removal.msg == "would remove bash"


@pytest.mark.skipif(not HAS_DPKG, reason="needs a Debian-family machine")
def test_packages_pinned_versions_in_check_mode() -> None:
    version = subprocess.run(
        ["dpkg-query", "-W", "-f", "${Version}", "bash"], capture_output=True, text=True
    ).stdout
    assert packages(make_ctx(check=True), f"bash={version}").status is Status.OK
    result = packages(make_ctx(check=True, diff=True), "bash=0.1-fxkit")
    assert result.msg == "would install bash=0.1-fxkit"
    assert result.diff == f"bash: {version} -> 0.1-fxkit\n"


def test_package_specs() -> None:
    assert parse_spec("curl=7.88.1-10+deb12u5") == ("curl", "7.88.1-10+deb12u5")
    assert parse_spec("libstdc++6") == ("libstdc++6", None)
    with pytest.raises(OpError, match="bad package name"):
        parse_spec("curl; rm -rf /")
    with pytest.raises(OpError, match="bad package name"):
        parse_spec("-oDebug=1")
    assert version_matches("1:2.38-4", "2.38")
    assert version_matches("5.2.15-2+b8", "5.2.15-2+b8")
    assert not version_matches("5.2.15-2", "5.2")


@pytest.mark.skipif(not NO_SYSTEMD, reason="checks the no-systemd path")
def test_service_is_skipped_without_systemd() -> None:
    ctx = make_ctx()
    pid1 = ctx.facts.get(InitSystem)
    result = service(ctx, "nginx.service", enabled=True, state="started")
    assert result.status is Status.SKIPPED
    assert (
        result.msg
        == f"systemd is not running on this host (PID 1 is {pid1}): nginx.service not managed"
    )


@pytest.mark.skipif(not NO_SYSTEMD, reason="checks the no-systemd path")
def test_unit_installed_daemon_reload_skipped(tmp_path: Path) -> None:
    content = "[Unit]\nDescription=fxkit test\n[Service]\nExecStart=/bin/true\n"
    result = unit(make_ctx(check=True, diff=True), "fx.service", content, unit_dir=str(tmp_path))
    assert result.changed and "+ExecStart=/bin/true" in result.diff
    assert not (tmp_path / "fx.service").exists()
    result = unit(make_ctx(), "fx.service", content, unit_dir=str(tmp_path))
    assert result.changed and "daemon-reload skipped: systemd is not running" in result.msg
    assert (tmp_path / "fx.service").read_text() == content
    assert (tmp_path / "fx.service").stat().st_mode & 0o777 == 0o644
    assert unit(make_ctx(), "fx.service", content, unit_dir=str(tmp_path)).status is Status.OK


def test_unit_directory_missing_on_a_host_without_systemd(tmp_path: Path) -> None:
    # A minimal container without the systemd package has no /etc/systemd/system at all.
    unit_dir = tmp_path / "etc" / "systemd" / "system"
    preview = unit(make_ctx(check=True), "fx.service", "[Unit]\n", unit_dir=str(unit_dir))
    assert preview.changed and not (tmp_path / "etc").exists()
    result = unit(make_ctx(), "fx.service", "[Unit]\n", unit_dir=str(unit_dir))
    assert result.changed and result.msg.startswith(f"created {unit_dir}; created {unit_dir}/fx")
    assert (unit_dir / "fx.service").read_text() == "[Unit]\n"
    assert unit(make_ctx(), "fx.service", "[Unit]\n", unit_dir=str(unit_dir)).status is Status.OK


def test_unit_names_are_checked(tmp_path: Path) -> None:
    with pytest.raises(OpError, match="bad unit name"):
        unit(make_ctx(), "../../etc/passwd", "x", unit_dir=str(tmp_path))
    with pytest.raises(OpError, match="unknown state"):
        service(make_ctx(), "a.service", state="running")


def test_group_member_read_only() -> None:
    user = subprocess.run(["id", "-un"], capture_output=True, text=True).stdout.strip()
    group = subprocess.run(["id", "-gn"], capture_output=True, text=True).stdout.strip()
    assert group_member(make_ctx(), user, [group]).status is Status.OK
    result = group_member(make_ctx(check=True, diff=True), user, [group, "fxkit-new-group"])
    assert result.changed and result.msg == f"would add {user} to fxkit-new-group"
    assert result.diff.endswith(" fxkit-new-group\n")
    missing = group_member(make_ctx(), "fxkit-no-such-user", "users")
    assert missing.failed and missing.msg == "no such user: fxkit-no-such-user"
