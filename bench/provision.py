"""Provisioning benchmark: fxkit against ansible-core and pyinfra on the same lab fleet.

The workload (20 tasks per host, ``bench/provision/``) runs on 8 and 32 lab hosts (and once on 64):
a first run on hosts whose workload state was wiped (everything changes) and a second run right
after it (nothing changes). The tools take turns in every round (the order rotates), each with its
default settings, and every run is checked: exit status, changes reported, and the files left on
every host (compared across tools). Reported: wall time (median of the rounds), the ratios to
fxkit, and CPU seconds per host-task of the controller (the tool's process and every process under
it, ssh included) and of the hosts (their sshd and everything it started).

    .venv/bin/python bench/provision.py --hosts 8,32 --runs 3 --once 64

ansible-core and pyinfra are installed (pinned) into their own virtualenvs under
``.cache/bench-venvs/``; they are not fxkit dependencies. Needs root (the lab fleet).
"""

from __future__ import annotations

import argparse
import ctypes
import hashlib
import json
import os
import platform
import re
import resource
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import yaml
from rich.console import Console
from rich.table import Table

if TYPE_CHECKING:
    from fxkit.lab import Fleet


REPO = Path(__file__).resolve().parent.parent
WORKLOAD = REPO / "bench" / "provision"
#: The sitecustomize that counts a tool's SSH channels and SFTP requests (both use paramiko).
PROBE = REPO / "bench" / "provision_probe"
VENVS = REPO / ".cache" / "bench-venvs"
TASKS_PER_HOST = 20
#: What the workload writes on a host; the reset between first runs removes exactly this.
WORKLOAD_PATHS = ("/srv/fxkit-bench", "/etc/fxkit-bench.conf")
PEERS = {"ansible": "ansible-core==2.19.14", "pyinfra": "pyinfra==3.10.0"}
TOOLS = ("fxkit", "pyinfra", "ansible")
PR_SET_CHILD_SUBREAPER = 36
CLOCK_TICK = os.sysconf("SC_CLK_TCK")
CORES = os.cpu_count() or 1

console = Console()


class BenchError(Exception):
    """A run did not do what the benchmark expects (the numbers would mean nothing)."""


# -- the tools ------------------------------------------------------------------------------


@dataclass
class Counts:
    """What a tool reported: changes, failures, and the hosts that reported a change."""

    changed: int = 0
    failed: int = 0
    changed_hosts: set[str] = field(default_factory=set)


@dataclass
class Tool:
    """How to run one tool on an inventory and read what it did from its output."""

    name: str
    version: str
    settings: str
    argv: Callable[[Path, Path], list[str]]
    env: dict[str, str]
    parse: Callable[[str, Path], Counts]
    teardown: Callable[[Path], None] = lambda workdir: None


def peer_venv(name: str) -> Path:
    """The virtualenv of ansible-core or pyinfra, created (pinned) on first use."""
    venv = VENVS / name
    marker = venv / f".installed-{PEERS[name]}"
    if not marker.exists():
        console.print(f"installing {PEERS[name]} into {venv} ...")
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
        pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q"]
        done = subprocess.run([*pip, PEERS[name]], capture_output=True, text=True)
        if done.returncode:
            raise BenchError(f"pip install {PEERS[name]} failed:\n{done.stdout}{done.stderr}")
        marker.touch()
    return venv / "bin"


def _version(argv: list[str]) -> str:
    out = subprocess.run(argv, capture_output=True, text=True, check=True).stdout
    return out.strip().splitlines()[0]


def fxkit_tool() -> Tool:
    import fxkit

    source = Path(fxkit.__file__).resolve().parent.parent
    git = ["git", "-C", str(source)]
    commit = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    dirty = subprocess.run([*git, "status", "--porcelain", "--", "fxkit"], capture_output=True)
    version = f"fxkit {commit.stdout.strip() or '?'}{'+dirty' if dirty.stdout else ''} ({source})"

    def argv(inventory: Path, workdir: Path) -> list[str]:
        playbook = WORKLOAD / "fxkit" / "playbook.yml"
        log = workdir / "events.json"
        return [sys.executable, "-m", "fxkit", "play", str(playbook), "-i", str(inventory),
                "--log-json", str(log)]  # fmt: skip

    def parse(output: str, workdir: Path) -> Counts:
        return parse_fxkit_events((workdir / "events.json").read_text())

    return Tool("fxkit", version, "defaults (forks 50)", argv, {}, parse)


def parse_fxkit_events(log: str) -> Counts:
    """Counts from fxkit's JSON event log (one event per operation and host)."""
    from fxkit.ops.base import Status

    counts = Counts()
    for line in log.splitlines():
        event = json.loads(line)
        if event.get("status") == Status.CHANGED:
            counts.changed += 1
            counts.changed_hosts.add(event["host"])
        elif event.get("status") in (Status.FAILED, Status.UNREACHABLE):
            counts.failed += 1
    return counts


ANSIBLE_RECAP = re.compile(
    r"^(\S+)\s+: ok=\d+\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)", re.MULTILINE
)


def ansible_tool() -> Tool:
    bin_dir = peer_venv("ansible")

    def argv(inventory: Path, workdir: Path) -> list[str]:
        playbook = WORKLOAD / "ansible" / "playbook.yml"
        return [str(bin_dir / "ansible-playbook"), "-i", str(inventory), str(playbook)]

    def teardown(workdir: Path) -> None:
        """Close the ControlPersist masters ansible leaves behind (they count as its CPU)."""
        for socket in (workdir / "cp").iterdir():
            ssh_exit = ["ssh", "-o", f"ControlPath={socket}", "-O", "exit", "lab"]
            subprocess.run(ssh_exit, capture_output=True, timeout=30)

    # The control sockets go to the run's own folder so that no run reuses another's masters.
    env = {"ANSIBLE_SSH_CONTROL_PATH_DIR": "{workdir}/cp", "ANSIBLE_NOCOLOR": "1"}
    settings = "defaults (forks 5, ssh ControlPersist 60s, no pipelining); gather_facts: false"
    version = _version([str(bin_dir / "ansible-playbook"), "--version"])
    return Tool(
        "ansible", version, settings, argv, env, lambda out, _: parse_ansible(out), teardown
    )


def parse_ansible(output: str) -> Counts:
    """Counts from ansible-playbook's PLAY RECAP (changed counts tasks; a loop is one task)."""
    counts = Counts()
    for host, changed, unreachable, failed in ANSIBLE_RECAP.findall(output):
        counts.changed += int(changed)
        counts.failed += int(unreachable) + int(failed)
        if int(changed):
            counts.changed_hosts.add(host)
    return counts


def pyinfra_tool() -> Tool:
    bin_dir = peer_venv("pyinfra")

    def argv(inventory: Path, workdir: Path) -> list[str]:
        deploy = WORKLOAD / "pyinfra" / "deploy.py"
        return [str(bin_dir / "pyinfra"), "-y", str(inventory.with_suffix(".py")), str(deploy)]

    version = _version([str(bin_dir / "pyinfra"), "--version"])
    settings = "defaults (all hosts in parallel), -y (no prompt)"
    return Tool("pyinfra", version, settings, argv, {}, lambda out, _: parse_pyinfra(out))


#: pyinfra's line for one operation on one host. pyinfra pads the ``[host]`` prefix to the
#: inventory's longest name (``Host.init``, pyinfra/api/host.py), so ``[lab01]  Success``
#: where lab100 is in the same run.
PYINFRA_HOST_LINE = re.compile(r"^\s+\[(\S+)\] *(Success|Error|Could not connect)", re.MULTILINE)
#: The last row of pyinfra's results table: operations x hosts, changed, failed, unchanged.
PYINFRA_TOTAL = re.compile(r"^\s+Grand total\s+(\S+)\s+(\S+)\s+(\S+)\s+(\S+)\s*$", re.M)


def parse_pyinfra(output: str) -> Counts:
    """Counts from pyinfra's per-operation lines (``[host] Success`` is a change), checked
    against the totals of its own results table, so that a line the parser misses stops the
    benchmark instead of reading as a host left unchanged."""
    counts = Counts()
    op_errors = 0
    for host, status in PYINFRA_HOST_LINE.findall(output):
        if status == "Success":
            counts.changed += 1
            counts.changed_hosts.add(host)
        else:
            counts.failed += 1
            op_errors += status == "Error"
    totals = PYINFRA_TOTAL.findall(output)
    if not totals:
        raise BenchError("pyinfra printed no results table (no 'Grand total' row)")
    changed, failed = (0 if cell == "-" else int(cell) for cell in totals[-1][1:3])
    if counts.changed != changed:
        raise BenchError(
            f"pyinfra's results table counts {changed} changes, its per-host lines "
            f"{counts.changed}: the benchmark misreads pyinfra's output"
        )
    counts.failed += max(0, failed - op_errors)
    return counts


# -- the fleet and the hosts' state -----------------------------------------------------------


def host_vars(index: int) -> dict[str, object]:
    """The per-host variables the workload's template renders."""
    return {"bench_id": index, "bench_zone": f"zone-{'abcd'[index % 4]}"}


def write_inventories(fleet: Fleet, names: list[str], folder: Path) -> Path:
    """An Ansible YAML inventory (read by fxkit and ansible) and a pyinfra inventory beside it,
    for the same hosts, variables, key and known_hosts file (host keys are verified)."""
    folder.mkdir(parents=True, exist_ok=True)
    common = {k: v for k, v in fleet.hostvars(names[0]).items() if k != "ansible_host"}
    hosts = {}
    pyinfra_hosts = []
    for index, name in enumerate(names, 1):
        hosts[name] = {"ansible_host": fleet.address(name), **host_vars(index)}
        pyinfra_hosts.append(
            (name, {"ssh_hostname": fleet.address(name), "ssh_port": fleet.port,
                    "ssh_user": "root", "ssh_key": str(fleet.client_key),
                    "ssh_known_hosts_file": str(fleet.known_hosts),
                    "ssh_strict_host_key_checking": "yes", **host_vars(index)})
        )  # fmt: skip
    inventory = folder / f"hosts{len(names)}.yml"
    tree = {"all": {"vars": common, "children": {"lab": {"hosts": hosts}}}}
    inventory.write_text(yaml.safe_dump(tree, sort_keys=False))
    inventory.with_suffix(".py").write_text(f"lab = {pyinfra_hosts!r}\n")
    return inventory


def ssh_all(fleet: Fleet, names: list[str], command: str) -> dict[str, str]:
    """Run one command on every host with OpenSSH (host keys verified); its output per host."""

    def one(name: str) -> str:
        argv = ["ssh", "-i", str(fleet.client_key), "-o", f"UserKnownHostsFile={fleet.known_hosts}",
                "-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes", "-p", str(fleet.port),
                f"root@{fleet.address(name)}", command]  # fmt: skip
        done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
        if done.returncode:
            raise BenchError(f"{name}: {command!r} failed: {done.stderr.strip()}")
        return done.stdout

    with ThreadPoolExecutor(16) as pool:
        return dict(zip(names, pool.map(one, names), strict=True))


def reset(fleet: Fleet, names: list[str]) -> None:
    """Wipe the workload's state on every host: the next run starts from scratch."""
    ssh_all(fleet, names, "rm -rf -- " + " ".join(map(shlex.quote, WORKLOAD_PATHS)))


FINGERPRINT = (
    "cd / && find {paths} -printf '%p %y %m %u %g %s\\n' | LC_ALL=C sort"
    " && find {paths} -type f -exec sha256sum {{}} + | LC_ALL=C sort"
).format(paths=" ".join(shlex.quote(p.lstrip("/")) for p in WORKLOAD_PATHS))


def fingerprints(fleet: Fleet, names: list[str]) -> dict[str, str]:
    """Per host: a digest of the workload's files (paths, types, modes, owners, contents)."""
    listing = ssh_all(fleet, names, FINGERPRINT)
    return {name: hashlib.sha256(text.encode()).hexdigest()[:16] for name, text in listing.items()}


def sshd_pids(fleet: Fleet, names: list[str]) -> list[int]:
    """Each host's sshd: PID 1 of its namespaces, the only child of the unshare process."""
    return [child for name in names for child in _children(fleet.hosts[name]["pid"])]


def _children(pid: int) -> list[int]:
    try:
        return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def _cpu_with_reaped(pid: int) -> float:
    """CPU seconds of a process and of every child it has reaped (utime+stime+cutime+cstime)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0.0
    fields = stat[stat.rindex(")") + 2 :].split()
    return sum(int(x) for x in fields[11:15]) / CLOCK_TICK


def machine_idle() -> float:
    """Seconds the machine's CPUs have been idle (idle + iowait, all CPUs together)."""
    fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()
    return (int(fields[4]) + int(fields[5])) / CLOCK_TICK


def hosts_cpu(pids: list[int]) -> float:
    return sum(map(_cpu_with_reaped, pids))


def last_pids(sshds: list[int]) -> list[int]:
    """Each host's PID counter: the last PID given out in its own PID namespace (read by a
    process started in that namespace, which takes one PID itself)."""

    def one(pid: int) -> int:
        argv = ["nsenter", "-t", str(pid), "-p", "cat", "/proc/sys/kernel/ns_last_pid"]
        return int(subprocess.run(argv, capture_output=True, text=True, check=True).stdout)

    with ThreadPoolExecutor(8) as pool:
        return list(pool.map(one, sshds))


def spawned(before: list[int], after: list[int]) -> int:
    """Processes the hosts started between two :func:`last_pids` (the reader's own excluded)."""
    counts = [b - a - 1 for a, b in zip(before, after, strict=True)]
    if min(counts) < 0:
        raise BenchError("a host's PID counter wrapped around during the run: run it again")
    return sum(counts)


def wait_sessions_closed(pids: list[int], timeout: float = 5.0) -> None:
    """Wait until no host has an SSH session left (its CPU is then in the sshd's cutime)."""
    deadline = time.monotonic() + timeout
    while any(_children(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.02)


# -- one measured run -----------------------------------------------------------------------


@dataclass
class Run:
    tool: str
    hosts: int
    round: int
    phase: str  # "first" (from scratch) or "second" (nothing to change)
    wall_s: float
    controller_cpu_s: float
    hosts_cpu_s: float
    changed: int
    changed_hosts: int
    #: Peak resident memory of the tool's largest process (fxkit: its only one), MiB.
    controller_peak_mib: float = 0.0
    #: Processes the tool made the hosts start (their PID counters), all hosts together.
    host_spawns: int = 0
    #: SSH channels the tool opened (a command, an SFTP session) and SFTP requests it sent.
    channels: int = 0
    sftp_requests: int = 0
    #: Seconds the machine's CPUs (all together) stood idle during the run.
    machine_idle_s: float = 0.0
    #: Commands sent to fxkit's host-side helper (a request on its open channel each).
    helper_requests: int = 0

    @property
    def host_tasks(self) -> int:
        return self.hosts * TASKS_PER_HOST


def become_subreaper() -> None:
    """Orphans of the tools' processes (ansible's ssh ControlPersist masters) become our
    children, so that their CPU time reaches RUSAGE_CHILDREN when we reap them."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER)")


def reap_orphans(keep: set[int], timeout: float = 15.0) -> None:
    """Wait for every child of ours except ``keep`` (the fleet's hosts, and whatever was our
    child before the tool started) to exit and reap it."""
    deadline = time.monotonic() + timeout
    while True:
        orphans = [pid for pid in _our_children() if pid not in keep]
        for pid in orphans:
            if os.waitpid(pid, os.WNOHANG)[0]:
                orphans.remove(pid)
        if not orphans:
            return
        if time.monotonic() > deadline:
            raise BenchError(f"processes {orphans} left by a tool did not exit")
        time.sleep(0.02)


def _our_children() -> list[int]:
    me = os.getpid()
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat[stat.rindex(")") + 2 :].split()[1]) == me:
                found.append(int(entry.name))
    return found


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def measure(
    tool: Tool,
    fleet: Fleet,
    names: list[str],
    inventory: Path,
    phase: str,
    round_: int,
    output_file: Path | None = None,
) -> Run:
    """Run the tool once; check it succeeded; return its wall time and CPU use. ``output_file``:
    a file that receives the tool's output (stdout and stderr), checked or not."""
    keep = {info["pid"] for info in fleet.hosts.values()} | set(_our_children())
    sshds = sshd_pids(fleet, names)
    with tempfile.TemporaryDirectory(prefix=f"provbench-{tool.name}-") as tmp:
        workdir = Path(tmp)
        (workdir / "cp").mkdir()
        env = {**os.environ, **{k: v.format(workdir=workdir) for k, v in tool.env.items()}}
        counts_file = workdir / "ssh-counts.json"
        path = [str(PROBE), *filter(None, [env.get("PYTHONPATH")])]
        env.update(FXBENCH_COUNTS=str(counts_file), PYTHONPATH=os.pathsep.join(path))
        pids0 = last_pids(sshds)
        cpu0, hosts0 = children_cpu(), hosts_cpu(sshds)
        with open(workdir / "output", "w+") as out:
            start, idle0 = time.perf_counter(), machine_idle()
            proc = subprocess.Popen(
                tool.argv(inventory, workdir), cwd=workdir, env=env, stdout=out, stderr=out
            )
            # wait4: this child's own rusage, so ru_maxrss is the peak of this run alone.
            _, status, usage = os.wait4(proc.pid, 0)
            wall, idle = time.perf_counter() - start, machine_idle() - idle0
            proc.returncode = os.waitstatus_to_exitcode(status)
            out.seek(0)
            output = out.read()
        if output_file is not None:
            output_file.write_text(output)
        tool.teardown(workdir)
        reap_orphans(keep)
        wait_sessions_closed(sshds)
        cpu, hosts = children_cpu() - cpu0, hosts_cpu(sshds) - hosts0
        spawns = spawned(pids0, last_pids(sshds))
        if proc.returncode:
            raise BenchError(f"{tool.name} exited {proc.returncode}:\n{output[-3000:]}")
        counts = tool.parse(output, workdir)
        if not counts_file.exists():
            raise BenchError(f"{tool.name} left no SSH counts ({PROBE}/sitecustomize.py)")
        ssh = json.loads(counts_file.read_text())
    if counts.failed:
        raise BenchError(f"{tool.name} reported {counts.failed} failures:\n{output[-3000:]}")
    if phase == "first" and len(counts.changed_hosts) != len(names):
        missing = sorted(set(names) - counts.changed_hosts)
        raise BenchError(f"{tool.name}'s first run changed nothing on {missing}")
    if phase == "second" and counts.changed:
        raise BenchError(f"{tool.name}'s second run changed {counts.changed} things:\n{output}")
    return Run(tool.name, len(names), round_, phase, wall, cpu, hosts, counts.changed,
               len(counts.changed_hosts), round(usage.ru_maxrss / 1024, 1), spawns,
               ssh["channels"], ssh["sftp_requests"], idle,
               ssh.get("helper_requests", 0))  # fmt: skip


# -- round trips and spawns of each operation ---------------------------------------------


@contextmanager
def ssh_counted() -> Iterator[dict[str, int]]:
    """Count, in this process, the SSH channels paramiko opens, the SFTP requests it sends and
    the requests (commands, reads) sent to fxkit's host-side helper (as
    ``bench/provision_probe`` does in a tool's process)."""
    import paramiko
    from paramiko.sftp_client import SFTPClient

    from fxkit.connection.helper import HelperClient

    counts = {"channels": 0, "sftp_requests": 0, "helper_requests": 0}
    patched = [(paramiko.Transport, "open_channel", "channels"),
               (SFTPClient, "_async_request", "sftp_requests"),
               (HelperClient, "send", "helper_requests"),  # a command, then a read:
               (HelperClient, "ask", "helper_requests")]  # fmt: skip
    originals = [getattr(cls, name) for cls, name, _ in patched]

    def counting(original: Callable[..., object], key: str) -> Callable[..., object]:
        def counted(*args: object, **kwargs: object) -> object:
            counts[key] += 1
            return original(*args, **kwargs)

        return counted

    for (cls, name, key), original in zip(patched, originals, strict=True):
        setattr(cls, name, counting(original, key))
    try:
        yield counts
    finally:
        for (cls, name, _), original in zip(patched, originals, strict=True):
            setattr(cls, name, original)


def per_operation(fleet: Fleet, name: str) -> list[dict]:
    """Each of the workload's four kinds of operation run once on a new path (first) and once
    more (second, nothing to change) on one host, through fxkit's API: the SSH channels, SFTP
    requests and host processes each took. The connection is open and its SFTP session started
    before (each host opens them once per run)."""
    from fxkit.facts.base import FactCache
    from fxkit.ops import command, directory, file, line
    from fxkit.ops.base import OpContext

    root = f"{WORKLOAD_PATHS[0]}/per-op"
    kinds: dict[str, Callable[[OpContext], object]] = {
        "directory": lambda ctx: directory(ctx, f"{root}/d", mode="0755"),
        "template (file)": lambda ctx: file(ctx, f"{root}/d/app.conf", "x = 1\n", mode="0644"),
        "line": lambda ctx: line(ctx, f"{root}/d/lines.conf", "option_1 = on"),
        "command (creates)": lambda ctx: command(ctx, f"touch {root}/done", creates=f"{root}/done"),
    }
    sshd = sshd_pids(fleet, [name])
    rows = []
    with fleet.connect(name) as conn:
        ctx = OpContext(conn, FactCache(conn))
        ctx.read(f"rm -rf -- {root}")
        conn.get(f"{root}/absent")
        for kind, run in kinds.items():
            for phase in ("first", "second"):
                before = last_pids(sshd)
                with ssh_counted() as counts:
                    run(ctx)
                rows.append({"operation": kind, "phase": phase, **counts,
                             "host_spawns": spawned(before, last_pids(sshd))})  # fmt: skip
        ctx.read(f"rm -rf -- {root}")
    return rows


# -- the benchmark --------------------------------------------------------------------------


@dataclass
class Bench:
    fleet: Fleet
    tools: list[Tool]
    workdir: Path
    #: Where each run's output is kept (None: nowhere).
    outputs: Path | None = None
    runs: list[Run] = field(default_factory=list)
    reference: dict[str, str] = field(default_factory=dict)

    def round(self, count: int, round_: int, record: bool = True) -> None:
        """Every tool once (first run, then second run), in an order that rotates by round."""
        names = sorted(self.fleet.hosts, key=lambda name: self.fleet.hosts[name]["index"])[:count]
        inventory = write_inventories(self.fleet, names, self.workdir)
        shift = round_ % len(self.tools)
        for tool in self.tools[shift:] + self.tools[:shift]:
            reset(self.fleet, names)
            for phase in ("first", "second"):
                kept = self.outputs and self.outputs / f"{count}-{round_}-{tool.name}-{phase}.txt"
                run = measure(tool, self.fleet, names, inventory, phase, round_, kept)
                self.check_state(tool, names, phase)
                if record:
                    self.runs.append(run)
                    console.print(
                        f"{count:3d} hosts #{round_} {tool.name:7s} {phase:6s} "
                        f"{run.wall_s:6.2f} s, CPU-s: {run.controller_cpu_s:6.2f} controller, "
                        f"{run.hosts_cpu_s:6.2f} hosts; {run.changed} changed; per task: "
                        f"{run.host_spawns / run.host_tasks:.2f} spawns, "
                        f"{run.channels / run.host_tasks:.2f} channels, "
                        f"{run.sftp_requests / run.host_tasks:.2f} SFTP requests, "
                        f"{run.helper_requests / run.host_tasks:.2f} helper requests; machine idle "
                        f"{run.machine_idle_s:.2f} CPU-s"
                    )

    def check_state(self, tool: Tool, names: list[str], phase: str) -> None:
        """Every tool must leave the same files on every host as the first tool measured."""
        for name, digest in fingerprints(self.fleet, names).items():
            expected = self.reference.setdefault(name, digest)
            if digest != expected:
                listing = ssh_all(self.fleet, [name], FINGERPRINT)[name]
                raise BenchError(
                    f"after {tool.name}'s {phase} run, {name} holds other files than after the "
                    f"first tool's run:\n{listing}"
                )


def summarize(runs: list[Run], tools: Sequence[str]) -> list[dict]:
    """Median wall and CPU per (hosts, tool, phase), with the ratios to fxkit."""
    rows = []
    keys = sorted({(r.hosts, r.phase) for r in runs}, key=lambda k: (k[0], k[1] != "first"))
    for hosts, phase in keys:
        group = {t: [r for r in runs if (r.tool, r.hosts, r.phase) == (t, hosts, phase)]
                 for t in tools}  # fmt: skip
        fx = group.get("fxkit")
        fx_wall = statistics.median(r.wall_s for r in fx) if fx else None
        for tool, chosen in group.items():
            if not chosen:
                continue
            wall = statistics.median(r.wall_s for r in chosen)
            cpu = statistics.median(r.controller_cpu_s for r in chosen)
            host_cpu = statistics.median(r.hosts_cpu_s for r in chosen)
            rows.append({
                "hosts": hosts, "phase": phase, "tool": tool, "rounds": len(chosen),
                "wall_s_median": round(wall, 3),
                "wall_s_all": [round(r.wall_s, 3) for r in chosen],
                "vs_fxkit": round(wall / fx_wall, 2) if fx_wall else None,
                "controller_cpu_s": round(cpu, 3),
                "controller_cpu_ms_per_host_task": round(1000 * cpu / (hosts * TASKS_PER_HOST), 2),
                "hosts_cpu_ms_per_host_task": round(1000 * host_cpu / (hosts * TASKS_PER_HOST), 2),
                "controller_peak_mib": statistics.median(r.controller_peak_mib for r in chosen),
                "machine_busy_pct": round(100 * statistics.median(
                    1 - r.machine_idle_s / (r.wall_s * CORES) for r in chosen)),
                **{f"{key}_per_host_task": round(statistics.median(
                    getattr(r, key) for r in chosen) / (hosts * TASKS_PER_HOST), 2)
                   for key in ("host_spawns", "channels", "sftp_requests", "helper_requests")},
            })  # fmt: skip
    return rows


def targets(rows: list[dict], hosts: int = 32) -> dict[str, bool | None]:
    """The issue's targets at 32 hosts: faster than pyinfra on both runs, >= 15x ansible-core."""
    ratio = {(r["phase"], r["tool"]): r["vs_fxkit"] for r in rows if r["hosts"] == hosts}
    result: dict[str, bool | None] = {}
    for phase in ("first", "second"):
        pyinfra, ansible = ratio.get((phase, "pyinfra")), ratio.get((phase, "ansible"))
        result[f"{phase}: faster than pyinfra"] = None if pyinfra is None else pyinfra > 1
        result[f"{phase}: >= 15x faster than ansible-core"] = (
            None if ansible is None else ansible >= 15
        )
    return result


#: Issue 26 section 1, at every host count measured with both tools: fxkit's speed-up over
#: pyinfra (first, second run) and its hosts' CPU per task against pyinfra's.
SPEEDUP_TARGETS = {"first": 2.0, "second": 2.5}
HOSTS_CPU_TARGET = 0.6
#: ... and how fxkit's wall time grows from 64 to 128 hosts.
GROWTH_TARGET = 2.05


def limit_targets(rows: list[dict]) -> list[dict]:
    """Issue 26's targets against the summary: each with what was measured and whether it is met
    (speed-ups are pyinfra's wall / fxkit's; CPU ratios fxkit's hosts CPU / pyinfra's)."""
    by = {(r["hosts"], r["phase"], r["tool"]): r for r in rows}
    result = []
    for hosts, phase, tool in by:
        fx = by.get((hosts, phase, "fxkit"))
        if tool != "pyinfra" or fx is None:
            continue
        py = by[hosts, phase, tool]
        cpu = fx["hosts_cpu_ms_per_host_task"] / py["hosts_cpu_ms_per_host_task"]
        result += [
            {"target": f"{hosts} hosts, {phase} run: >= {SPEEDUP_TARGETS[phase]}x pyinfra",
             "measured": py["vs_fxkit"], "met": py["vs_fxkit"] >= SPEEDUP_TARGETS[phase]},
            {"target": f"{hosts} hosts, {phase} run: hosts' CPU per task <= "
             f"{HOSTS_CPU_TARGET}x pyinfra's", "measured": round(cpu, 2),
             "met": cpu <= HOSTS_CPU_TARGET},
        ]  # fmt: skip
    for phase in SPEEDUP_TARGETS:
        small, large = by.get((64, phase, "fxkit")), by.get((128, phase, "fxkit"))
        if small and large:
            growth = large["wall_s_median"] / small["wall_s_median"]
            result.append({"target": f"fxkit {phase} run: growth 64 -> 128 hosts <= "
                           f"{GROWTH_TARGET}x", "measured": round(growth, 2),
                           "met": growth <= GROWTH_TARGET})  # fmt: skip
    return result


COLUMNS = ("hosts", "run", "tool", "wall s", "rounds", "x fxkit", "ctl CPU-s", "ctl ms/task",
           "hosts ms/task", "ctl peak MiB", "spawns/task", "channels/task",
           "SFTP req/task", "helper req/task")  # fmt: skip
#: The per-task counts of a summary row, as the tables show them.
PER_TASK = ("host_spawns_per_host_task", "channels_per_host_task", "sftp_requests_per_host_task",
            "helper_requests_per_host_task")  # fmt: skip


def render(rows: list[dict], goals: dict[str, bool | None]) -> None:
    table = Table(title="Provisioning: 20 tasks per host, wall time median of the rounds")
    for column in COLUMNS:
        table.add_column(column, justify="left" if column in ("run", "tool") else "right")
    previous = None
    for row in rows:
        if previous and (row["hosts"], row["phase"]) != previous:
            table.add_section()
        previous = (row["hosts"], row["phase"])
        table.add_row(
            str(row["hosts"]), row["phase"], row["tool"], f"{row['wall_s_median']:.2f}",
            " ".join(f"{w:.2f}" for w in row["wall_s_all"]),
            "-" if row["vs_fxkit"] is None else f"{row['vs_fxkit']:.2f}",
            f"{row['controller_cpu_s']:.2f}", f"{row['controller_cpu_ms_per_host_task']:.1f}",
            f"{row['hosts_cpu_ms_per_host_task']:.1f}", f"{row.get('controller_peak_mib', 0):.0f}",
            *(f"{row.get(key, 0):.2f}" for key in PER_TASK),
        )  # fmt: skip
    console.print(table)
    for goal, met in goals.items():
        mark = {True: "[green]met[/]", False: "[red]missed[/]", None: "not measured"}[met]
        console.print(f"target at 32 hosts, {goal}: {mark}")
    for goal26 in limit_targets(rows):
        mark = "[green]met[/]" if goal26["met"] else "[red]missed[/]"
        console.print(f"issue 26: {goal26['target']}: {goal26['measured']:.2f}, {mark}")


def machine() -> dict[str, object]:
    cpu = next(
        (line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
         if line.startswith("model name")), platform.processor(),
    )  # fmt: skip
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "memory_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "openssh": subprocess.run(["ssh", "-V"], capture_output=True, text=True).stderr.strip(),
    }


@contextmanager
def lab_fleet(state_dir: Path, prefix: str, count: int) -> Iterator[Fleet]:
    """A fleet of ``count`` lab hosts, stopped (only what it started) when the benchmark ends."""
    from fxkit.lab import Fleet

    fleet = Fleet(state_dir, prefix)
    try:
        started = time.perf_counter()
        fleet.up(count)
        seconds = time.perf_counter() - started
        console.print(f"lab fleet: {count} hosts on {prefix}.x up in {seconds:.1f} s")
        yield fleet
    finally:
        fleet.down()


def parse_counts(text: str) -> list[int]:
    return [int(part) for part in text.split(",") if part.strip()]


def scaling(rows: list[dict]) -> list[dict]:
    """How wall time grows with hosts, per tool and run: seconds at each host count, the ratio of
    the largest to the smallest and the seconds each added host costs (least squares)."""
    result = []
    for tool, phase in dict.fromkeys((r["tool"], r["phase"]) for r in rows):
        points = sorted((r["hosts"], r["wall_s_median"]) for r in rows
                        if (r["tool"], r["phase"]) == (tool, phase))  # fmt: skip
        if len(points) < 2:
            continue
        hosts, walls = zip(*points, strict=True)
        slope = statistics.linear_regression(hosts, walls).slope
        result.append({"tool": tool, "phase": phase, "wall_s": dict(points),
                       "growth": round(walls[-1] / walls[0], 2),
                       "s_per_added_host": round(slope, 3)})  # fmt: skip
    return sorted(result, key=lambda r: (r["phase"] != "first", TOOLS.index(r["tool"])))


def markdown(report: dict) -> str:
    """The result tables as Markdown, for docs/BENCHMARKS.md."""
    lines = ["| hosts | run | tool | wall s (median) | all rounds | × fxkit | controller CPU-s "
             "| controller CPU ms / host-task | hosts CPU ms / host-task | controller peak MiB "
             "| host spawns / task | SSH channels / task | SFTP requests / task "
             "| helper requests / task | machine busy % |",
             "|---:|---|---|---:|---|" + "---:|" * 10]  # fmt: skip
    for row in report["summary"]:
        ratio = "-" if row["vs_fxkit"] is None else f"{row['vs_fxkit']:.2f}"
        lines.append(
            f"| {row['hosts']} | {row['phase']} | {row['tool']} | {row['wall_s_median']:.2f} "
            f"| {' '.join(f'{w:.2f}' for w in row['wall_s_all'])} | {ratio} "
            f"| {row['controller_cpu_s']:.2f} | {row['controller_cpu_ms_per_host_task']:.1f} "
            f"| {row['hosts_cpu_ms_per_host_task']:.1f} "
            f"| {row.get('controller_peak_mib', 0):.0f} | "
            + " | ".join(f"{row.get(key, 0):.2f}" for key in PER_TASK)
            + f" | {row.get('machine_busy_pct', '-')} |"
        )
    growth = scaling(report["summary"])
    if growth:
        counts = sorted({int(h) for r in growth for h in r["wall_s"]})
        lines += ["", "| tool | run | " + " | ".join(f"{c} hosts" for c in counts)
                  + " | growth | s per added host |",
                  "|---|---|" + "---:|" * (len(counts) + 2)]  # fmt: skip
        for r in growth:
            walls = {int(h): w for h, w in r["wall_s"].items()}
            cells = " | ".join(f"{walls[c]:.2f}" if c in walls else "-" for c in counts)
            lines.append(
                f"| {r['tool']} | {r['phase']} | {cells} | {r['growth']:.1f}x "
                f"| {r['s_per_added_host']:.3f} |"
            )
    goals = limit_targets(report["summary"])
    if goals:
        lines += ["", "| target (issue 26) | measured | met |", "|---|---:|---|"]
        lines += [f"| {g['target']} | {g['measured']:.2f} | {'yes' if g['met'] else '**no**'} |"
                  for g in goals]  # fmt: skip
    if report.get("per_operation"):
        lines += ["", "| fxkit operation | run | SSH channels | SFTP requests | helper requests "
                  "| host processes |", "|---|---|---:|---:|---:|---:|"]  # fmt: skip
        lines += [f"| {r['operation']} | {r['phase']} | {r['channels']} | {r['sftp_requests']} "
                  f"| {r.get('helper_requests', 0)} | {r['host_spawns']} |"
                  for r in report["per_operation"]]  # fmt: skip
    return "\n".join(lines) + "\n"


def run_benchmark(args: argparse.Namespace, chosen: list[str]) -> dict:
    makers = {"fxkit": fxkit_tool, "pyinfra": pyinfra_tool, "ansible": ansible_tool}
    tools = [makers[name]() for name in chosen]
    plan = [(count, args.runs) for count in args.hosts] + [(count, 1) for count in args.once]
    become_subreaper()
    # SIGTERM unwinds like Ctrl-C, so that the fleet is stopped on the way out.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    load_before = os.getloadavg()
    started = time.time()

    def report(bench: Bench, complete: bool) -> dict:
        rows = summarize(bench.runs, chosen)
        return {
            "benchmark": "provision",
            "complete": complete,
            "command": " ".join([Path(sys.executable).name, *sys.argv]),
            "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
            "duration_s": round(time.time() - started, 1),
            "machine": {**machine(), "loadavg_before": load_before,
                        "loadavg_after": os.getloadavg()},
            "tasks_per_host": TASKS_PER_HOST,
            "tools": {t.name: {"version": t.version, "settings": t.settings} for t in tools},
            "summary": rows,
            "scaling": scaling(rows),
            "targets_at_32_hosts": targets(rows),
            "targets_issue26": limit_targets(rows),
            "runs": [asdict(run) for run in bench.runs],
        }  # fmt: skip

    with (
        tempfile.TemporaryDirectory(prefix="provbench-") as tmp,
        lab_fleet(args.lab_dir, args.prefix, max(count for count, _ in plan)) as fleet,
    ):
        if args.outputs:
            args.outputs.mkdir(parents=True, exist_ok=True)
        bench = Bench(fleet, tools, Path(tmp), args.outputs)
        console.print("warm-up (not recorded): every tool once on the smallest fleet")
        bench.round(min(count for count, _ in plan), 0, record=False)
        for count, rounds in plan:
            for round_ in range(1, rounds + 1):
                bench.round(count, round_)
                save(args.json, report(bench, complete=False))  # a crash keeps what was measured
        per_op = per_operation(fleet, sorted(fleet.hosts)[0])
    result = {**report(bench, complete=True), "per_operation": per_op}
    save(args.json, result)
    return result


def save(path: Path, report: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=1) + "\n")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hosts", type=parse_counts, default=[8, 32], help="host counts: 8,32")
    parser.add_argument("--runs", type=int, default=3, help="rounds per host count (median)")
    parser.add_argument("--once", type=parse_counts, default=[], help="host counts run one round")
    parser.add_argument("--tools", default=",".join(TOOLS), help="subset of fxkit,pyinfra,ansible")
    parser.add_argument("--json", type=Path, default=REPO / "bench" / "results" / "provision.json")
    parser.add_argument("--lab-dir", type=Path, default=REPO / ".cache" / "bench-lab")
    parser.add_argument("--prefix", default="127.88.0", help="the fleet's addresses (127.x.y)")
    parser.add_argument(
        "--outputs", type=Path, help="keep every run's output here (HOSTS-ROUND-TOOL-RUN.txt)"
    )
    parser.add_argument("--report", action="store_true", help="only show the --json file's tables")
    parser.add_argument("--markdown", action="store_true", help="also print the tables as Markdown")
    parser.add_argument(
        "--per-op", action="store_true", help="only count each operation's round trips and spawns"
    )
    args = parser.parse_args(argv)

    chosen = [t.strip() for t in args.tools.split(",") if t.strip()]
    unknown = set(chosen) - set(TOOLS)
    if unknown:
        parser.error(f"unknown tools {sorted(unknown)}; choose from {', '.join(TOOLS)}")
    if args.per_op:
        with lab_fleet(args.lab_dir, args.prefix, 1) as fleet:
            ops = {"summary": [], "per_operation": per_operation(fleet, sorted(fleet.hosts)[0])}
        console.print(markdown(ops), markup=False, highlight=False, soft_wrap=True)
        return 0
    if args.report:
        report = json.loads(args.json.read_text())
    else:
        try:
            report = run_benchmark(args, chosen)
        except BenchError as exc:
            console.print(f"[red]benchmark stopped:[/] {exc}", highlight=False)
            console.print(f"rounds completed before it (if any): {args.json}")
            return 1
        console.print(f"results: {args.json}")
    render(report["summary"], report["targets_at_32_hosts"])
    if args.markdown:
        console.print(markdown(report), markup=False, highlight=False, soft_wrap=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
