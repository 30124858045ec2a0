"""The lab fleet: real hosts (namespaces + overlayfs + sshd, a relay each) started and stopped by
PID. The escape attempts are in test_lab_escape.py."""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from fxkit.cli.lab import lab
from fxkit.lab import Fleet, LabError, base, hostfs, resources

pytestmark = pytest.mark.lab

CAP_SYS_MODULE, CAP_SYS_BOOT, CAP_SYS_TIME, CAP_SYS_ADMIN = 16, 22, 25, 21


def _files(fleet: Fleet) -> dict[str, tuple[int, bytes]]:
    """Every file of the state directory but the logs, with mtime and content: a host's log and
    its relay's, where socat notes a client that hung up while sshd still wrote to it ("E write(1,
    ...): Broken pipe"), whenever that happens."""
    return {
        str(p.relative_to(fleet.dir)): (p.stat().st_mtime_ns, p.read_bytes())
        for p in sorted(fleet.dir.rglob("*"))
        if p.is_file() and p.name not in ("log", "relay.log")
    }


def test_up_is_idempotent_grows_and_down_stops_only_its_processes(lab_fleet):
    fleet = lab_fleet(2, name="lifecycle")
    pids = {s.name: s.pid for s in fleet.status()}
    before = _files(fleet)

    assert Fleet(fleet.dir).up(2) == []  # a second `lab up 2` (a new process) changes nothing
    assert _files(fleet) == before
    assert {s.name: s.pid for s in Fleet(fleet.dir).status()} == pids

    assert fleet.up(3) == ["lab03"]
    status = fleet.status()
    assert [(s.name, s.up) for s in status] == [("lab01", True), ("lab02", True), ("lab03", True)]
    assert all(0 < s.memory_bytes < 64 * 2**20 for s in status)

    inventory = yaml.safe_load(fleet.inventory.read_text())
    hosts = inventory["all"]["children"]["lab"]["hosts"]
    assert list(hosts) == ["lab01", "lab02", "lab03"]
    assert hosts["lab03"]["ansible_host"] == fleet.address("lab03")
    assert len(fleet.known_hosts.read_text().splitlines()) == 3

    all_pids = [s.pid for s in status] + [fleet.hosts[s.name]["relay"]["pid"] for s in status]
    cgroups = [Path(folder) for s in status for folder in fleet.hosts[s.name]["cgroups"]]
    assert sorted(fleet.down()) == ["lab01", "lab02", "lab03"]
    assert not any(Path(f"/proc/{pid}").exists() for pid in all_pids)
    assert not any(folder.exists() for folder in cgroups)  # nor their cgroups
    assert not fleet.dir.exists()
    assert Fleet(fleet.dir).status() == []


def test_a_file_written_on_one_host_is_seen_nowhere_else(lab_fleet):
    fleet = lab_fleet(2)
    probe = f"/etc/fxkit-probe-{secrets.token_hex(4)}"
    with fleet.connect("lab01") as one, fleet.connect("lab02") as two:
        one.put(probe, b"written on lab01\n")
        assert one.get(probe) == b"written on lab01\n"
        assert two.get(probe) is None
        assert one.run("hostname").stdout.strip() == "lab01"
        assert two.run("hostname").stdout.strip() == "lab02"
    assert not Path(probe).exists()


def test_a_host_cannot_write_the_real_machine(lab_fleet):
    fleet = lab_fleet(1)
    # The host's / is its own (in memory): what it writes there never reaches the real one.
    root_probe = Path("/") / f".lab-probe-{secrets.token_hex(4)}"
    with fleet.connect("lab01") as conn:
        assert conn.run(f"touch {root_probe} && test -e {root_probe}").ok
        # Write the kernel setting's own value back: even if this worked it would change nothing.
        swappiness = conn.run(
            "v=$(cat /proc/sys/vm/swappiness) && echo $v > /proc/sys/vm/swappiness"
        )
        assert swappiness.rc != 0 and "Read-only file system" in swappiness.stderr
        bounding = int(conn.run("sed -n 's/^CapBnd:\\t//p' /proc/self/status").stdout, 16)
        for cap in (CAP_SYS_MODULE, CAP_SYS_BOOT, CAP_SYS_TIME, CAP_SYS_ADMIN):
            assert not bounding & (1 << cap), f"capability {cap} is still in the bounding set"
        # The real machine's private host keys are not visible inside.
        assert conn.run("cat /etc/ssh/ssh_host_rsa_key").rc != 0
        # Nor the real root's home: /root starts with only the lab's authorized_keys.
        inside = set(conn.run("ls -A /root").stdout.split())
        assert ".ssh" in inside and not inside & (set(os.listdir("/root")) - {".ssh"})
    assert not root_probe.exists()


def test_a_stopped_host_frees_its_address_and_comes_back(lab_fleet):
    fleet = lab_fleet(2, name="restart")
    relay = fleet.hosts["lab02"]["relay"]["pid"]
    assert fleet.stop("lab02")
    assert not Path(f"/proc/{relay}").exists()  # its relay went with it: the address is free
    assert [s.up for s in fleet.status()] == [True, False]
    assert fleet.up(2) == ["lab02"]
    with fleet.connect("lab02") as conn:
        assert conn.run("hostname").stdout.strip() == "lab02"
    assert "Accepted publickey" in fleet.sshd_log("lab02")


def test_a_hosts_file_is_read_by_its_end_and_never_through_a_link(tmp_path):
    (tmp_path / "var" / "log").mkdir(parents=True)
    (tmp_path / "var" / "log" / "sshd.log").write_bytes(b"old lines\n" * 100 + b"newest\n")
    (tmp_path / "link").symlink_to("var")
    root = os.open(tmp_path, os.O_PATH | os.O_DIRECTORY)
    try:
        assert hostfs.read_tail(root, "var/log/sshd.log", 7) == b"newest\n"
        assert hostfs.read_tail(root, "var/log/sshd.log").count(b"old lines") == 100
        with pytest.raises(NotADirectoryError):  # a link on the way, even one inside
            hostfs.read_tail(root, "link/log/sshd.log")
        with pytest.raises(ValueError, match="not a plain relative path"):
            hostfs.read_tail(root, "var/../var/log/sshd.log")
    finally:
        os.close(root)


@pytest.mark.skipif(os.geteuid() != 0, reason="the base layer keeps owners: needs root")
def test_the_base_layer_holds_only_what_every_user_may_read(tmp_path):
    layer = tmp_path / "base"
    real = {path: Path(path).read_bytes() for path in ("/etc/passwd", "/etc/group")}
    base.build(layer, "ssh-ed25519 AAAA lab\n", "fxkit:$6$salt$hash")
    for path in layer.rglob("*"):
        info = path.lstat()
        if path.is_file() and not path.is_symlink():
            generated = {"etc/shadow", "etc/gshadow", "etc/sudoers", "etc/sudoers.d/fxkit-lab"}
            relative = str(path.relative_to(layer))
            assert (
                info.st_mode & 0o004
                or relative in generated
                or relative.startswith(("root/", "home/"))
            ), f"{relative} is not world-readable on this machine"
    assert not list((layer / "etc" / "ssh").glob("ssh_host_*"))
    shadow = dict(line.split(":")[:2] for line in (layer / "etc/shadow").read_text().splitlines())
    assert shadow.pop("fxkit") == "$6$salt$hash" and set(shadow.values()) == {"*"}
    assert (layer / "root/.ssh/authorized_keys").read_text() == "ssh-ed25519 AAAA lab\n"
    assert "fxkit:x:" in (layer / "etc/passwd").read_text()
    assert not (layer / "var/lib/apt/lists").exists() or not [
        p for p in (layer / "var/lib/apt/lists").iterdir() if p.name != "partial"
    ]
    assert {path: Path(path).read_bytes() for path in real} == real  # linked, never written


def test_cli_up_status_down(lab_fleet, tmp_path):
    lab_fleet(1)  # skips where the lab cannot run
    state = tmp_path / "cli-lab"
    fleet = Fleet(state, prefix=f"127.99.{secrets.randbelow(256)}")
    env = {"FXKIT_LAB_DIR": str(state), "FXKIT_LAB_PREFIX": fleet.prefix}
    runner = CliRunner()
    try:
        up = ["up", "2", "--memory", "1GiB", "--pids", "500"]
        result = runner.invoke(lab, up, env=env, catch_exceptions=False)
        assert result.exit_code == 0, result.output
        assert str(fleet.inventory) in result.output
        assert "tmpfs:       0.5 GiB each" in result.output
        result = runner.invoke(lab, ["status"], env=env, catch_exceptions=False)
        assert "lab02" in result.output and "up" in result.output
        assert fleet.address("lab02") in result.output
        assert "limits: 1.0 GiB of memory and 500 processes a host" in result.output
        assert Fleet(state).limits == resources.Limits(memory=2**30, pids=500)
        result = runner.invoke(lab, ["up", "2", "--pids", "600"], env=env)
        assert isinstance(result.exception, LabError), result.output  # the CLI prints it plainly
        assert "not 1.0 GiB of memory and 600 processes" in str(result.exception)
    finally:
        result = runner.invoke(lab, ["down"], env=env, catch_exceptions=False)
    assert "2 host(s) stopped" in result.output
    assert not state.exists()


def test_a_second_fleet_on_the_same_addresses_is_refused(lab_fleet, tmp_path):
    fleet = lab_fleet(1)
    other = Fleet(tmp_path / "other", prefix=fleet.prefix)
    with pytest.raises(LabError, match="already in use") as info:
        other.up(1)
    assert "--prefix" in info.value.hint
    other.down()


def test_changing_the_prefix_of_a_running_fleet_is_refused(lab_fleet):
    fleet = lab_fleet(1)
    with pytest.raises(LabError, match="run `fxkit lab down` first"):
        Fleet(fleet.dir, prefix="127.1.1")


def test_where_the_hosts_cgroups_go_on_v2_hybrid_and_v1_machines(tmp_path):
    (tmp_path / "v2").mkdir()
    (tmp_path / "v2" / "cgroup.controllers").write_text("cpuset cpu io memory hugetlb pids\n")
    (tmp_path / "unified").mkdir()
    (tmp_path / "unified" / "cgroup.controllers").write_text("\n")  # all bound to v1
    v2 = f"29 23 0:26 / {tmp_path}/v2 rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n"
    assert resources.placement(v2, "0::/user.slice/session-3.scope\n") == {
        "memory": tmp_path / "v2",  # not under our own cgroup: it holds processes
        "pids": tmp_path / "v2",
    }
    hybrid = (  # as the machine this was written on: v1 controllers, an empty v2 hierarchy
        "35 31 0:32 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n"
        "39 31 0:36 / /sys/fs/cgroup/pids rw - cgroup cgroup rw,pids\n"
        f"41 31 0:38 / {tmp_path}/unified rw - cgroup2 cgroup2 rw\n"
    )
    own = "8:pids:/\n4:memory:/process_api/6ac6\n0::/\n"
    assert resources.placement(hybrid, own) == {
        "memory": Path("/sys/fs/cgroup/memory/process_api/6ac6"),
        "pids": Path("/sys/fs/cgroup/pids"),
    }
    with pytest.raises(resources.Unavailable, match=r"no pids controller.*offers none"):
        resources.placement(hybrid.replace("rw,pids", "rw,freezer"), own)


def test_too_little_memory_or_too_few_processes_are_refused(tmp_path):
    for option, value, said in (("--memory", "8MiB", "64 MiB at least"), ("--pids", "3", "3")):
        result = CliRunner().invoke(lab, ["up", "1", "--dir", str(tmp_path), option, value])
        assert result.exit_code == 2 and said in result.output and option in result.output
    assert not any(tmp_path.iterdir())


def test_bad_prefix_is_refused(tmp_path):
    with pytest.raises(LabError, match="not three octets"):
        Fleet(tmp_path, prefix="10.0.0")


@pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("setpriv"), reason="needs root to drop it"
)
def test_without_root_it_says_so():
    with tempfile.TemporaryDirectory(prefix="fxkit-nobody-") as home:
        os.chmod(home, 0o777)
        result = subprocess.run(
            ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
             sys.executable, "-m", "fxkit", "lab", "up", "1", "--dir", f"{home}/lab"],
            capture_output=True, text=True, timeout=60, env={**os.environ, "HOME": home},
        )  # fmt: skip
    assert result.returncode == 2
    assert "needs root" in result.stderr and "Traceback" not in result.stderr
