"""Escape attempts from a lab host (issue 8): each one runs as root inside a host, over SSH, and
must fail. Where the attempt needs a target on the real machine (a shared-memory segment, a key,
a socket, a terminal, a file), the test makes it here first and hands the probe what it needs.

Each probe is a small Python program (the host's /usr/bin/python3) that makes the attempt and
prints one JSON line: ``{"escaped": bool, "detail": "what happened"}``. See docs/lab.md, "Threat
model", for what the lab protects and what it does not.
"""

from __future__ import annotations

import ctypes
import json
import os
import platform
import secrets
import shlex
import socket
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from fxkit.lab import Fleet, resources

pytestmark = pytest.mark.lab

REPO = Path(__file__).resolve().parents[1]
HOST_PYTHON = "/usr/bin/python3"
#: add_key, keyctl and perf_event_open by machine (asm/unistd_64.h, asm-generic/unistd.h).
SYSCALLS = {
    "x86_64": {"add_key": 248, "keyctl": 250, "perf_event_open": 298},
    "aarch64": {"add_key": 217, "keyctl": 219, "perf_event_open": 241},
}
PROBE_HEADER = """\
import ctypes, errno, json, os, socket, stat, sys
args = json.loads(sys.stdin.read())
libc = ctypes.CDLL(None, use_errno=True)
def done(escaped, detail):
    print(json.dumps({"escaped": escaped, "detail": detail}))
    sys.exit(0)
def err():
    return errno.errorcode.get(ctypes.get_errno(), str(ctypes.get_errno()))
if os.geteuid() != 0:
    sys.exit("the probe must run as root")
"""


#: Small, to be reached quickly: the host's tmpfs mounts hold 128 MiB each.
LIMITS = resources.Limits(memory=256 * 2**20, pids=128)


@pytest.fixture(scope="module")
def fleet(lab_fleet) -> Fleet:
    # Its own: the probes write into their host's files, and fill its memory and process table.
    return lab_fleet(1, name="escape", limits=LIMITS)


@pytest.fixture
def root(fleet: Fleet) -> Iterator:
    # Each command in an SSH session of its own: a probe writes into every descriptor on the
    # host, and the host-side helper's stdin and stdout are the run's own line to the host
    # (pipes to sshd, inside it), which the marker would garble.
    with fleet.connect("lab01", fxkit_host_helper=False) as conn:
        yield conn


def probe(conn, code: str, **args) -> str:
    """Run ``code`` as root on the host; assert that it reports no escape; return its detail."""
    source = PROBE_HEADER + code
    result = conn.run(
        f"{HOST_PYTHON} -c {shlex.quote(source)}", stdin=json.dumps(args).encode(), timeout=60
    )
    assert result.rc == 0, f"probe failed to run: {result}\n{code}"
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["escaped"] is False, f"ESCAPED: {report['detail']}\nthe attempt:\n{code}"
    return report["detail"]


def syscall_numbers() -> dict[str, int]:
    numbers = SYSCALLS.get(platform.machine())
    if numbers is None:
        pytest.skip(f"no syscall numbers for {platform.machine()} in this test")
    return numbers


# -- IPC ----------------------------------------------------------------------------------------


def test_a_shared_memory_segment_of_the_real_machine_is_out_of_reach(root) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.shmat.restype = ctypes.c_void_p
    key = secrets.randbelow(2**30) + 1
    shmid = libc.shmget(key, 4096, 0o1666)  # IPC_CREAT | rw for everyone
    assert shmid >= 0, os.strerror(ctypes.get_errno())
    try:
        address = libc.shmat(shmid, None, 0)
        ctypes.memmove(address, b"real machine's segment\0", 23)
        libc.shmdt(ctypes.c_void_p(address))
        detail = probe(
            root,
            """
libc.shmat.restype = ctypes.c_void_p
shmid = libc.shmget(args["key"], 0, 0o666)
if shmid < 0:
    done(False, f"shmget(key) -> {err()}")
address = libc.shmat(shmid, None, 0)
if address in (None, ctypes.c_void_p(-1).value):
    done(False, f"shmat -> {err()}")
seen = ctypes.string_at(address, 23)
ctypes.memmove(address, b"overwritten by the host", 23)
done(True, f"read {seen!r} and overwrote it")
""",
            key=key,
        )
        assert "ENOENT" in detail
    finally:
        libc.shmctl(shmid, 0, None)  # IPC_RMID


# -- terminals ------------------------------------------------------------------------------


def test_a_terminal_of_the_real_machine_cannot_be_written_or_read(root) -> None:
    master, slave = os.openpty()
    try:
        path = os.ttyname(slave)
        rdev = os.stat(path).st_rdev
        marker = f"written-by-a-lab-host-{secrets.token_hex(4)}"
        detail = probe(
            root,
            """
found = []
for path in [args["path"]] + ["/dev/pts/" + n for n in os.listdir("/dev/pts") if n.isdigit()]:
    try:
        fd = os.open(path, os.O_RDWR | os.O_NOCTTY | os.O_NONBLOCK)
    except OSError as exc:
        found.append(f"open {path}: {errno.errorcode[exc.errno]}")
        continue
    os.write(fd, (args["marker"] + "\\n").encode())
    found.append(f"wrote to {path}")
    os.close(fd)
try:
    os.mknod("/tmp/pts", stat.S_IFCHR | 0o600, args["rdev"])
    fd = os.open("/tmp/pts", os.O_RDWR | os.O_NOCTTY)
    os.write(fd, (args["marker"] + "\\n").encode())
    done(True, "made the real terminal's device node and wrote to it")
except OSError as exc:
    found.append(f"mknod of the terminal: {errno.errorcode[exc.errno]}")
done(False, "; ".join(found))
""",
            path=path,
            rdev=rdev,
            marker=marker,
        )
        os.set_blocking(master, False)
        try:
            arrived = os.read(master, 65536).decode(errors="replace")
        except BlockingIOError:
            arrived = ""
        assert marker not in arrived, f"the host wrote into {path}: {detail}"
        assert "mknod of the terminal: EPERM" in detail
    finally:
        os.close(master)
        os.close(slave)


# -- the kernel keyring -------------------------------------------------------------------------


def test_a_key_in_the_real_roots_keyrings_cannot_be_read(root) -> None:
    numbers = syscall_numbers()
    libc = ctypes.CDLL(None, use_errno=True)
    secret = f"real-root-secret-{secrets.token_hex(8)}".encode()
    serials = []
    for keyring in (-4, -3):  # KEY_SPEC_USER_KEYRING, KEY_SPEC_SESSION_KEYRING
        serial = libc.syscall(
            numbers["add_key"],
            b"user",
            f"fxkit-escape-{secrets.token_hex(4)}".encode(),
            secret,
            len(secret),
            keyring,
        )
        if serial < 0:
            pytest.skip(f"cannot add a key here: {os.strerror(ctypes.get_errno())}")
        serials.append(serial)
    try:
        detail = probe(
            root,
            """
buf = ctypes.create_string_buffer(256)
tried = []
for serial in args["serials"]:
    n = libc.syscall(args["keyctl"], 11, serial, buf, 256)  # KEYCTL_READ
    if n >= 0:
        done(True, f"read key {serial}: {buf.raw[:n]!r}")
    tried.append(f"read key {serial}: {err()}")
for ring in (-4, -3, -5):  # user, session, user-session keyrings: what they link
    n = libc.syscall(args["keyctl"], 11, ring, buf, 256)
    linked = [int.from_bytes(buf.raw[i:i + 4], "little") for i in range(0, max(n, 0), 4)]
    if set(linked) & set(args["serials"]):
        done(True, f"keyring {ring} links the real root's key")
    tried.append(f"keyring {ring}: {len(linked)} keys, none of the real root's")
done(False, "; ".join(tried))
""",
            serials=serials,
            keyctl=numbers["keyctl"],
        )
        assert "EACCES" in detail or "ENOKEY" in detail
    finally:
        for serial in serials:
            libc.syscall(numbers["keyctl"], 21, serial)  # KEYCTL_INVALIDATE


# -- the network ----------------------------------------------------------------------------


def test_no_packet_socket_to_sniff_with(root) -> None:
    detail = probe(
        root,
        """
tried = []
for family, kind, proto in ((socket.AF_PACKET, socket.SOCK_RAW, socket.htons(3)),  # ETH_P_ALL
                            (socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_TCP)):
    try:
        s = socket.socket(family, kind, proto)
    except OSError as exc:
        tried.append(f"socket({family.name}, {kind.name}): {errno.errorcode[exc.errno]}")
        continue
    s.settimeout(2)
    try:
        data = s.recv(65535)
        done(True, f"{family.name} socket captured {len(data)} bytes")
    except OSError:
        done(True, f"opened a {family.name} raw socket")
done(False, "; ".join(tried))
""",
    )
    assert detail.count("EPERM") == 2


def test_the_host_has_only_its_own_loopback_and_no_route_out(root) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as outside:
        outside.bind(("127.0.0.1", 0))
        outside.listen()
        outside.settimeout(0.5)
        port = outside.getsockname()[1]
        detail = probe(
            root,
            """
links = sorted(os.listdir("/sys/class/net")) if os.path.isdir("/sys/class/net") else None
names = [line.split(":")[0].strip() for line in open("/proc/net/dev").read().splitlines()[2:]]
routes = [line.split()[1] for line in open("/proc/net/route").read().splitlines()[1:]]
if names != ["lo"] or routes:
    done(True, f"interfaces {names}, IPv4 routes {routes}")
try:
    socket.create_connection(("127.0.0.1", args["port"]), timeout=2).close()
    done(True, f"connected to the real machine's 127.0.0.1:{args['port']}")
except OSError as exc:
    done(False, f"interfaces {names}, no routes; 127.0.0.1:{args['port']}: {exc.strerror}")
""",
            port=port,
        )
        with pytest.raises(TimeoutError):
            outside.accept()
    assert "interfaces ['lo']" in detail and "refused" in detail


def test_an_abstract_unix_socket_of_the_real_machine_is_out_of_reach(root) -> None:
    name = f"\0fxkit-escape-{secrets.token_hex(4)}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as outside:
        outside.bind(name)
        outside.listen()
        outside.settimeout(0.5)
        detail = probe(
            root,
            """
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
try:
    s.connect(args["name"])
    done(True, "connected to the real machine's abstract socket")
except OSError as exc:
    done(False, f"connect: {errno.errorcode[exc.errno]}")
""",
            name=name,
        )
        with pytest.raises(TimeoutError):
            outside.accept()
    assert "ECONNREFUSED" in detail


# -- the kernel -----------------------------------------------------------------------------


def test_the_kernel_log_cannot_be_written_or_read(root) -> None:
    detail = probe(
        root,
        """
tried = []
for path, flags in (("/dev/kmsg", os.O_WRONLY), ("/proc/kmsg", os.O_RDONLY)):
    try:
        fd = os.open(path, flags | os.O_NONBLOCK)
        done(True, f"opened {path}")
    except OSError as exc:
        tried.append(f"open {path}: {errno.errorcode[exc.errno]}")
try:
    os.mknod("/tmp/kmsg", stat.S_IFCHR | 0o600, os.makedev(1, 11))
    done(True, "made a /dev/kmsg node")
except OSError as exc:
    tried.append(f"mknod kmsg: {errno.errorcode[exc.errno]}")
buf = ctypes.create_string_buffer(4096)
n = libc.klogctl(3, buf, 4096)  # SYSLOG_ACTION_READ_ALL: what dmesg does
if n > 0:
    done(True, f"read {n} bytes of the kernel log")
tried.append(f"syslog(READ_ALL): {err()}")
done(False, "; ".join(tried))
""",
    )
    assert "open /dev/kmsg: ENOENT" in detail and "mknod kmsg: EPERM" in detail
    assert "syslog(READ_ALL): EPERM" in detail


def test_the_kernels_settings_and_attributes_are_read_only(root) -> None:
    detail = probe(
        root,
        """
tried = []
for path in ("/proc/sys/kernel/hostname", "/proc/sys/vm/swappiness", "/proc/sysrq-trigger",
             "/sys/kernel/mm/transparent_hugepage/enabled", "/sys/class/net/lo/mtu"):
    if not os.path.exists(path):
        continue
    try:
        with open(path, "w") as f:
            f.write(open(path).read().split()[0].strip("[]") if "sysrq" not in path else "h")
        done(True, f"wrote {path}")
    except OSError as exc:
        tried.append(f"{path}: {errno.errorcode[exc.errno]}")
done(False, "; ".join(tried))
""",
    )
    assert "/proc/sys/vm/swappiness: EROFS" in detail and "/sys/class/net/lo/mtu: EROFS" in detail


def test_no_perf_events_for_the_whole_machine(root) -> None:
    numbers = syscall_numbers()
    detail = probe(
        root,
        """
attr = ctypes.create_string_buffer(128)
ctypes.memmove(attr, (1).to_bytes(4, "little") + (128).to_bytes(4, "little"), 8)  # SOFTWARE
fd = libc.syscall(args["perf_event_open"], attr, -1, 0, -1, 0)  # every process, CPU 0
if fd >= 0:
    done(True, "opened a system-wide perf event")
done(False, f"perf_event_open(pid=-1, cpu=0): {err()}")
""",
        perf_event_open=numbers["perf_event_open"],
    )
    assert "EACCES" in detail or "EPERM" in detail


def test_no_block_devices(root) -> None:
    # lstat: a dangling link in /dev (/dev/log while journald is stopped) is no disk.
    found = [os.lstat(f"/dev/{name}") for name in sorted(os.listdir("/dev"))]
    disks = [info.st_rdev for info in found if stat.S_ISBLK(info.st_mode)]
    if not disks:
        pytest.skip("this machine has no block device in /dev to try")
    detail = probe(
        root,
        """
nodes = [name for name in os.listdir("/dev") if not os.path.islink("/dev/" + name)]
blocks = [n for n in nodes if stat.S_ISBLK(os.stat("/dev/" + n).st_mode)]
if blocks:
    done(True, f"block devices in /dev: {blocks}")
for path in ("/dev/loop0", "/dev/zram0", "/dev/loop-control", "/dev/mem"):
    if os.path.exists(path):
        done(True, f"{path} exists")
tried = []
for rdev in args["disks"]:
    try:
        os.mknod("/tmp/disk", stat.S_IFBLK | 0o600, rdev)
        fd = os.open("/tmp/disk", os.O_RDWR)
        done(True, f"opened block device {os.major(rdev)}:{os.minor(rdev)} read-write")
    except OSError as exc:
        tried.append(f"{os.major(rdev)}:{os.minor(rdev)}: {errno.errorcode[exc.errno]}")
done(False, f"/dev holds {sorted(nodes)}; mknod " + ", ".join(tried))
""",
        disks=disks,
    )
    assert "EPERM" in detail


def test_no_descriptor_leads_out_of_the_host(root, fleet: Fleet) -> None:
    marker = f"written-through-a-descriptor-{secrets.token_hex(4)}"
    detail = probe(
        root,
        """
tried = []
for pid in [p for p in os.listdir("/proc") if p.isdigit()]:
    for fd in os.listdir(f"/proc/{pid}/fd") if os.access(f"/proc/{pid}/fd", os.R_OK) else []:
        path = f"/proc/{pid}/fd/{fd}"
        try:
            target = os.readlink(path)
            info = os.stat(path)
        except OSError:
            continue
        if stat.S_ISDIR(info.st_mode) and not os.path.isdir(target):
            done(True, f"{path} is a directory outside the host: {target}")
        if stat.S_ISREG(info.st_mode) and not os.path.exists(target):
            done(True, f"{path} is a file outside the host: {target}")
        try:
            out = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_NONBLOCK)
            os.write(out, (args["marker"] + "\\n").encode())
            os.close(out)
            tried.append(f"{pid}/{fd} -> {target} (written)")
        except OSError:
            tried.append(f"{pid}/{fd} -> {target}")
done(False, "; ".join(tried))
""",
        marker=marker,
    )
    assert "1/2 -> /dev/null" in detail  # sshd's stderr: not the fleet's log
    for log in (fleet.dir / "hosts").glob("*/*log"):
        assert marker not in log.read_text(errors="replace"), f"the host wrote into {log}"


# -- the real file system -------------------------------------------------------------------


def test_the_real_files_and_secrets_are_not_visible(root, fleet: Fleet, tmp_path: Path) -> None:
    token = secrets.token_hex(8)
    planted = [REPO / f".escape-probe-{token}", tmp_path / f"escape-probe-{token}"]
    for directory in ("/root", "/srv", "/opt", "/home"):
        if os.access(directory, os.W_OK):
            planted.append(Path(directory) / f".fxkit-escape-probe-{token}")
    for path in planted:
        path.write_text(token)
    real_hashes = [
        line.split(":")[1]
        for line in Path("/etc/shadow").read_text().splitlines()
        if line.count(":") > 2 and line.split(":")[1] not in ("*", "!", "!*", "x", "")
    ]
    try:
        detail = probe(
            root,
            """
for path in args["paths"]:
    if os.path.exists(path):
        done(True, f"sees {path}")
shadow = open("/etc/shadow").read()
if shadow == args["shadow"]:
    done(True, "reads the real /etc/shadow")
for secret in args["hashes"]:
    if secret in shadow:
        done(True, "reads a password hash of the real /etc/shadow")
keys = sorted(n for n in os.listdir("/etc/ssh") if n.startswith("ssh_host_"))
if keys != ["ssh_host_ed25519_key", "ssh_host_ed25519_key.pub"] or any(
    open("/etc/ssh/" + n).read() in args["real_keys"] for n in keys
):
    done(True, f"host keys in /etc/ssh: {keys}")
for link in ("/proc/1/root", "/proc/1/cwd", "/proc/self/root"):
    if os.path.exists(os.path.join(link, args["paths"][0].lstrip("/"))):
        done(True, f"reaches the checkout through {link}")
seen = {d: sorted(os.listdir(d)) for d in ("/", "/root", "/home", "/srv", "/opt")}
done(False, f"none of {len(args['paths'])} planted files; no real hash; {seen}")
""",
            paths=[str(p) for p in [*planted, fleet.dir, REPO]],
            hashes=real_hashes,
            shadow=Path("/etc/shadow").read_text(),
            real_keys=[p.read_text() for p in Path("/etc/ssh").glob("ssh_host_*") if p.is_file()],
        )
        assert "none of" in detail
    finally:
        for path in planted:
            path.unlink(missing_ok=True)


def test_the_real_machines_processes_are_out_of_sight(root) -> None:
    detail = probe(
        root,
        """
pids = sorted(int(p) for p in os.listdir("/proc") if p.isdigit())
names = {p: open(f"/proc/{p}/comm").read().strip() for p in pids if os.path.exists(f"/proc/{p}")}
if args["pid"] in names and "pytest" in open(f"/proc/{args['pid']}/cmdline").read():
    done(True, f"sees the test runner, PID {args['pid']}")
if names.get(1) != "sshd" or len(pids) > 20:
    done(True, f"processes: {names}")
done(False, f"processes: {names}")
""",
        pid=os.getpid(),
    )
    assert "1: 'sshd'" in detail


#: What the issue names, and what would undo the rest (capabilities(7) numbers).
DROPPED = {
    "net_raw": 13, "sys_ptrace": 19, "syslog": 34, "perfmon": 38, "bpf": 39, "sys_module": 16,
    "sys_rawio": 17, "sys_admin": 21, "mac_admin": 33, "audit_control": 30, "mac_override": 32,
    "dac_read_search": 2, "mknod": 27, "net_admin": 12, "sys_resource": 24, "sys_boot": 22,
}  # fmt: skip


def test_the_dangerous_capabilities_are_dropped(root) -> None:
    detail = probe(
        root,
        """
status = dict(line.split(":\t") for line in open("/proc/self/status").read().splitlines()
              if line.startswith("Cap"))
kept = {name for name, bit in args["dropped"].items()
        for field in ("CapBnd", "CapEff", "CapPrm", "CapAmb") if int(status[field], 16) >> bit & 1}
if kept:
    done(True, f"still has {sorted(kept)}")
done(False, f"bounding set {status['CapBnd'].strip()}: none of {len(args['dropped'])}")
""",
        dropped=DROPPED,
    )
    assert "none of" in detail


def test_no_user_namespace_to_regain_capabilities_in(root) -> None:
    detail = probe(
        root,
        """
pid = os.fork()
if pid == 0:
    os._exit(0 if libc.unshare(0x10000000) == 0 else ctypes.get_errno())  # CLONE_NEWUSER
_, status = os.waitpid(pid, 0)
code = os.waitstatus_to_exitcode(status)
if code == 0:
    done(True, "made a user namespace (all capabilities in it)")
done(False, f"unshare(CLONE_NEWUSER): {errno.errorcode[code]}")
""",
    )
    assert "ENOSPC" in detail or "EPERM" in detail


def test_mounts_and_namespaces_cannot_be_changed(root) -> None:
    detail = probe(
        root,
        """
tried = []
for source, target, fstype in (("none", "/mnt", "tmpfs"), ("/", "/mnt", None)):
    flags = 4096 if fstype is None else 0  # MS_BIND
    if libc.mount(source.encode(), target.encode(), fstype and fstype.encode(), flags, None) == 0:
        done(True, f"mounted {source} on {target}")
    tried.append(f"mount {fstype or 'bind'}: {err()}")
if libc.sethostname(b"escaped", 7) == 0:
    done(True, "changed the host name")
tried.append(f"sethostname: {err()}")
done(False, "; ".join(tried))
""",
    )
    assert detail.count("EPERM") == 3


# -- the controller's reads of the host's files -----------------------------------------------

#: Fleet.sshd_log, run in a process of its own: 2 GiB of address space (a read without end
#: fails there with MemoryError), and how much it read and whether it saw the marker.
READER = """\
import json, resource, sys
resource.setrlimit(resource.RLIMIT_AS, (2**31, 2**31))
from fxkit.lab import Fleet, resources
log = Fleet(sys.argv[1]).sshd_log("lab01")
print(json.dumps({"chars": len(log), "marker": sys.argv[2] in log}))
"""
#: What a root in the host puts where sshd's log was; {real} is a folder of the real machine
#: holding a 0600 ``sshd.log`` with the marker in it.
PLANTED = {
    "a link to a real file": "ln -s {real}/sshd.log /var/log/sshd.log",
    "a link to a real folder on the way": "rm -r /var/log && ln -s {real} /var/log",
    "a relative link to the host's /dev/zero": "ln -s ../../dev/zero /var/log/sshd.log",
    "a link to the real /dev/zero": "ln -s /dev/zero /var/log/sshd.log",
    "a FIFO": "mkfifo /var/log/sshd.log",
    "a sparse file of 64 GiB": "truncate -s 64G /var/log/sshd.log",
}


def controller_reads_sshd_log(fleet: Fleet, marker: str) -> dict:
    """How many characters ``Fleet.sshd_log`` returned and whether the marker was among them.
    It runs in a process of its own: bounded in memory (see READER) and in time (a read that
    blocks is killed after 60 s, which fails the test)."""
    argv = [sys.executable, "-c", READER, str(fleet.dir), marker]
    try:
        result = subprocess.run(argv, capture_output=True, text=True, timeout=60, cwd=REPO)
    except subprocess.TimeoutExpired:
        pytest.fail("Fleet.sshd_log blocks on what the host put in place of its log")
    assert result.returncode == 0, f"Fleet.sshd_log failed: {result.stderr[-1500:]}"
    return json.loads(result.stdout)


@pytest.mark.parametrize("planted", PLANTED)
def test_the_controller_reads_a_hosts_log_without_following_blocking_or_exhausting(
    root, fleet: Fleet, tmp_path: Path, planted: str
) -> None:
    marker = f"real-machine-secret-{secrets.token_hex(8)}"
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    (real / "sshd.log").write_text(marker + "\n")
    os.chmod(real / "sshd.log", 0o600)
    move = "mv /var/log /var/log.kept && cp -a /var/log.kept /var/log && rm /var/log/sshd.log"
    assert root.run(f"{move} && {PLANTED[planted].format(real=real)}").ok
    try:
        read = controller_reads_sshd_log(fleet, marker)
    finally:
        assert root.run("rm -rf /var/log && mv /var/log.kept /var/log").ok
    assert not read["marker"], f"the controller followed {planted} to {real}/sshd.log"
    assert read["chars"] <= 16 * 2**20
    assert "Accepted publickey" in fleet.sshd_log("lab01")  # the real one again


def test_the_mount_table_names_no_path_of_the_real_machine(root, fleet: Fleet) -> None:
    detail = probe(
        root,
        """
for path in ("/proc/self/mountinfo", "/proc/1/mountinfo", "/proc/self/mounts"):
    text = open(path).read()
    for real in args["real"]:
        if real in text:
            done(True, f"{path} names {real}")
done(False, "the mount table names no path of the fleet")
""",
        real=[str(fleet.dir), str(fleet.dir.parent), str(REPO)],
    )
    assert "no path" in detail


# -- the machine's memory and processes -------------------------------------------------------


def cgroups_or_skip() -> None:
    try:
        resources.placement()
    except resources.Unavailable as exc:
        pytest.skip(f"no cgroup limits on this machine (the tmpfs sizes are capped): {exc}")


def test_a_host_cannot_fork_past_its_pids_limit(root) -> None:
    cgroups_or_skip()
    detail = probe(
        root,
        """
r, w = os.pipe()
children, failed = [], None
while failed is None and len(children) < 4 * args["limit"]:
    try:
        pid = os.fork()
    except OSError as exc:
        failed = errno.errorcode[exc.errno]
        continue
    if pid == 0:  # wait for the parent to let go, then leave
        os.close(w)
        os.read(r, 1)
        os._exit(0)
    children.append(pid)
os.close(w)
for pid in children:
    os.waitpid(pid, 0)
if failed is None:
    done(True, f"forked {len(children)} processes, 4 times the limit")
done(False, f"fork {len(children) + 1}: {failed}")
""",
        limit=LIMITS.pids,
    )
    assert "EAGAIN" in detail
    assert int(detail.split()[1].rstrip(":")) <= LIMITS.pids


def test_writing_past_a_tmpfs_cap_fails_with_enospc(root) -> None:
    detail = probe(
        root,
        """
report = []
for folder in ("/tmp", "/run", "/dev/shm", "/var/tmp"):
    path, written, failed = folder + "/fill", 0, None
    try:
        with open(path, "wb", buffering=0) as f:
            while written < 2 * args["cap"]:
                written += f.write(b"\\1" * 2**20)
    except OSError as exc:
        failed = errno.errorcode[exc.errno]
    finally:
        os.unlink(path)
    if failed is None:
        done(True, f"wrote {written >> 20} MiB into {folder}, twice its cap")
    report.append(f"{folder}: {failed} at {written >> 20} MiB")
done(False, "; ".join(report))
""",
        cap=LIMITS.tmpfs,
    )
    assert detail.count("ENOSPC") == 4, detail
    assert max(int(part.split()[-2]) for part in detail.split("; ")) <= LIMITS.tmpfs >> 20


def test_what_a_host_holds_in_memory_is_counted_and_limited(root, fleet: Fleet) -> None:
    cgroups_or_skip()
    before = fleet.status()[0].used["memory"]
    assert root.run("head -c 64M /dev/zero > /dev/shm/held").ok
    try:
        held = fleet.status()[0].used["memory"] - before
    finally:
        assert root.run("rm /dev/shm/held").ok
    # Counted (an uncounted tmpfs shows ~0); a few MiB of the host's other pages may be reclaimed
    # meanwhile under its 256 MiB limit, so the difference is not exact.
    assert held >= 48 * 2**20, f"64 MiB in the host's /dev/shm, {held >> 20} MiB in its cgroup"
    # A process that touches twice the host's memory is stopped (by the kernel's OOM killer,
    # in the host's cgroup only); the host itself goes on.
    touch = f"{HOST_PYTHON} -c 'print(len(bytearray(b\"x\") * {2 * LIMITS.memory}))'"
    result = root.run(touch, timeout=120)
    assert result.rc != 0 and not result.stdout, result
    assert root.run("true").ok
