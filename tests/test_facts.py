"""Facts gathered from this machine through LocalConnection, checked against what Python itself
reads; plus parsers fed with output of other systems (RHEL os-release, rpm)."""

from __future__ import annotations

import hashlib
import os
import platform
import re
import subprocess
from pathlib import Path

import pytest

from fxkit.connection.base import RunResult
from fxkit.connection.local import LocalConnection
from fxkit.facts import (
    Cpu,
    FactCache,
    FactError,
    FileStat,
    GroupMembership,
    InitSystem,
    InstalledPackages,
    Kernel,
    Memory,
    ModuleState,
    Mounts,
    OsRelease,
    SysctlState,
    VenvPackages,
)
from fxkit.facts.kernel import sysctl_path
from fxkit.facts.system import OsInfo, SessionMemory


@pytest.fixture
def facts() -> FactCache:
    return FactCache(LocalConnection("localhost"))


def test_os_release_matches_python(facts: FactCache) -> None:
    info = facts.get(OsRelease)
    expected = platform.freedesktop_os_release()
    assert info.id == expected["ID"] and info.version_id == expected.get("VERSION_ID", "")
    if info.id == "debian":
        assert info.family == "debian"


def test_os_family_from_rhel_os_release() -> None:
    # /etc/os-release of Rocky Linux 9 (quoted values, ID_LIKE with several words).
    text = (
        'NAME="Rocky Linux"\nVERSION="9.3 (Blue Onyx)"\nID="rocky"\n'
        'ID_LIKE="rhel centos fedora"\nVERSION_ID="9.3"\n'
        'PRETTY_NAME="Rocky Linux 9.3 (Blue Onyx)"\n'
    )
    info = OsRelease().parse(RunResult("cat /etc/os-release", 0, text, ""))
    assert info == OsInfo(
        "rocky", ("rhel", "centos", "fedora"), "9.3", "Rocky Linux 9.3 (Blue Onyx)"
    )
    assert info.family == "redhat"
    ubuntu = OsRelease().parse(
        RunResult("", 0, 'ID=ubuntu\nID_LIKE=debian\nVERSION_ID="24.04"\n', "")
    )
    assert ubuntu.family == "debian" and ubuntu.version_id == "24.04"


def test_kernel_cpu_memory(facts: FactCache) -> None:
    assert facts.get(Kernel) == os.uname().release
    cpu = facts.get(Cpu)
    assert cpu.count == len(os.sched_getaffinity(0))
    model = re.search(r"^model name\s*:\s*(.*)$", Path("/proc/cpuinfo").read_text(), re.M)
    assert cpu.model == (model[1].strip() if model else "")
    memory = facts.get(Memory)
    total_kb = int(re.search(r"^MemTotal:\s+(\d+) kB", Path("/proc/meminfo").read_text(), re.M)[1])
    assert memory.total == total_kb * 1024 and 0 < memory.available <= memory.total


def test_session_memory_sums_a_session_and_leaves_out_the_others(facts: FactCache) -> None:
    # A session of a shell and two processes, each holding 64 MiB it wrote: the fact's sum
    # against each one's RssAnon read here; this test's own session left out. The second
    # renames itself with a newline and a forged stat line naming PID 1 (the review's attack):
    # PID 1's memory must not be counted.
    hold = (
        "b = bytearray(64 << 20); b[::4096] = b'x' * len(b[::4096]); print('held', flush=True); "
        "import time; time.sleep(600)"
    )
    forge = "import ctypes; ctypes.CDLL(None).prctl(15, b'y\\n1 (z) S 0 0 ', 0, 0, 0); " + hold
    code = f"python3 -c {hold!r} & python3 -c {forge!r}; wait"
    leader = subprocess.Popen(["setsid", "sh", "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert leader.stdout is not None
        # Each says "held" once its 64 MiB are written: no waiting on the clock.
        assert [leader.stdout.readline(), leader.stdout.readline()] == ["held\n", "held\n"]
        members = [
            p for p in Path("/proc").glob("[0-9]*")
            if _field(p / "stat", 3) == str(leader.pid) and _rss_anon(p) >= 64 << 20
        ]  # fmt: skip
        held = facts.get(SessionMemory, leader.pid, os.getsid(0))
        expected = sum(_rss_anon(p) for p in Path("/proc").glob("[0-9]*")
                       if _field(p / "stat", 3) == str(leader.pid))  # fmt: skip
        assert len(members) == 2
        # (the shell's few pages may move between the two reads)
        assert abs(held[leader.pid] - expected) < 1 << 20 and held[leader.pid] >= 128 << 20
        assert os.getsid(0) in held  # this session is one too
        assert facts.get(SessionMemory, 2**22 + 7) == {}  # no such session
    finally:
        os.killpg(leader.pid, 9)
        leader.wait()


def _field(stat: Path, index: int) -> str:
    """Field ``index`` after the command of /proc/PID/stat (0: the state); "" once gone."""
    try:
        return stat.read_text().rpartition(") ")[2].split()[index]
    except (OSError, IndexError):
        return ""


def _rss_anon(proc: Path) -> int:
    try:
        found = re.search(r"^RssAnon:\s+(\d+) kB", (proc / "status").read_text(), re.M)
    except OSError:
        return 0
    return int(found[1]) * 1024 if found else 0


def test_mounts_and_escapes(facts: FactCache) -> None:
    mounts = facts.get(Mounts)
    assert any(m.path == "/" for m in mounts)
    assert any(m.fstype == "proc" for m in mounts)
    # The kernel writes a space in a mount point as \040.
    line = "/dev/sdb1 /mnt/my\\040disk ext4 ro,relatime 0 0\n"
    (mount,) = Mounts().parse(RunResult("cat /proc/mounts", 0, line, ""))
    assert mount.path == "/mnt/my disk" and mount.read_only


def test_init_system_names_pid_1(facts: FactCache) -> None:
    init = facts.get(InitSystem)
    if Path("/run/systemd/system").is_dir():
        assert init == "systemd"
    else:
        assert init == Path("/proc/1/comm").read_text().strip()


def test_facts_are_cached_until_the_host_changes() -> None:
    class Counting(LocalConnection):
        calls = 0

        def run(self, command: str, **kwargs):  # type: ignore[no-untyped-def]
            Counting.calls += 1
            return super().run(command, **kwargs)

    cache = FactCache(Counting("localhost"))
    assert cache.get(Kernel) == cache.get(Kernel) and Counting.calls == 1
    cache.get(Memory)
    assert Counting.calls == 2
    cache.changed()  # an operation changed the host: Memory may be stale, the kernel is not
    cache.get(Kernel), cache.get(Memory)
    assert Counting.calls == 3
    cache.clear()  # a reboot
    cache.get(Kernel)
    assert Counting.calls == 4
    cache.get(Kernel, become=True)  # as root: gathered apart
    assert Counting.calls == 5


def test_file_stat(facts: FactCache, tmp_path: Path) -> None:
    path = tmp_path / "a file\nwith newline"
    path.write_bytes(b"data")
    path.chmod(0o640)
    info = FileStat().parse(LocalConnection("x").run(FileStat().command(str(path))), str(path))
    st = path.stat()
    assert (info.exists, info.type, info.mode, info.uid, info.gid, info.size) == (
        True,
        "file",
        0o640,
        st.st_uid,
        st.st_gid,
        4,
    )
    assert info.sha256 == hashlib.sha256(b"data").hexdigest()
    assert facts.get(FileStat, str(tmp_path)).type == "directory"
    assert not facts.get(FileStat, str(tmp_path / "none")).exists
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "dangling")
    assert facts.get(FileStat, str(link)).type == "link"


def test_file_stat_failure_is_a_fact_error() -> None:
    with pytest.raises(FactError, match="stat of /x"):
        FileStat().parse(RunResult("stat", 1, "", "stat: cannot stat"), "/x")


def test_installed_packages(facts: FactCache) -> None:
    if not Path("/usr/bin/dpkg-query").exists():
        pytest.skip("dpkg-query not on this machine")
    installed = facts.get(InstalledPackages, "bash", "coreutils", "fxkit-no-such-package")
    assert set(installed) == {"bash", "coreutils"}
    bash = subprocess.run(["bash", "-c", "echo $BASH_VERSION"], capture_output=True, text=True)
    upstream = bash.stdout.split("(")[0]  # 5.2.15(1)-release -> 5.2.15
    assert installed["bash"].startswith(upstream)
    assert "bash" in facts.get(InstalledPackages)


def test_installed_packages_rpm_output() -> None:
    # rpm -q --qf '%{NAME}\t%{VERSION}-%{RELEASE}\tinstalled\n' bash nope
    out = "bash\t5.1.8-9.el9\tinstalled\npackage nope is not installed\n"
    assert InstalledPackages().parse(RunResult("rpm -q", 1, out, ""), "bash", "nope") == {
        "bash": "5.1.8-9.el9"
    }


def test_sysctl_state(facts: FactCache, tmp_path: Path) -> None:
    info = facts.get(SysctlState, "kernel.ostype")
    assert info.value == "Linux"
    assert not facts.get(SysctlState, "fxkit.no.such.key").writable
    assert sysctl_path("net.ipv4.conf.eth0/100.rp_filter") == (
        "/proc/sys/net/ipv4/conf/eth0.100/rp_filter"
    )
    fake = tmp_path / "net" / "core"
    fake.mkdir(parents=True)
    (fake / "rmem_max").write_text("4096\t87380\n")
    state = facts.get(SysctlState, "net.core.rmem_max", str(tmp_path))
    assert state.value == "4096 87380" and state.writable


def test_module_state(facts: FactCache) -> None:
    builtin = sorted(os.listdir("/sys/module"))[0]
    assert facts.get(ModuleState, builtin).loaded
    info = facts.get(ModuleState, "fxkit_no_such_module")
    assert not info.loaded
    if not any(Path(d, "modprobe").exists() for d in os.environ["PATH"].split(":")):
        assert info.cannot_load == "modprobe is not installed"


def test_group_membership(facts: FactCache) -> None:
    groups = subprocess.run(["id", "-nG"], capture_output=True, text=True).stdout.split()
    user = subprocess.run(["id", "-un"], capture_output=True, text=True).stdout.strip()
    assert facts.get(GroupMembership, user) == frozenset(groups)
    assert facts.get(GroupMembership, "fxkit-no-such-user") is None


def test_venv_packages_of_our_own_venv(facts: FactCache) -> None:
    import sys

    venv = Path(sys.prefix)
    if venv == Path(sys.base_prefix):
        pytest.skip("tests do not run in a virtualenv")
    packages = facts.get(VenvPackages, str(venv))
    assert packages is not None and packages["pytest"] == pytest.__version__
    assert facts.get(VenvPackages, str(venv / "none")) is None


def test_the_lab_marker_says_lab_host_and_profile() -> None:
    from fxkit.facts.lab import LabInfo, parse_marker

    assert parse_marker("") == LabInfo()
    assert parse_marker('{"lab": true, "profile": null}') == LabInfo(True, None)
    simulated = parse_marker('{"lab": true, "profile": "mi308x"}')
    assert simulated.simulated and simulated.profile == "mi308x"
    for bad in ("{", '{"lab": "yes"}', "[1]", '{"lab": true, "profile": 3}'):
        with pytest.raises(FactError, match=r"host\.json is not what `fxkit lab up` writes"):
            parse_marker(bad)
