#!/usr/bin/env python3
"""Remote storage emulated on one machine: fxkit vs the NFS baseline over sshfs with added latency.

    host (root namespace)                 network namespace fxbench-PID
    sshfs (FUSE) --ssh-- veth fxbPIDh ==== veth fxbPIDn -- delay_proxy.py -- sshd (internal-sftp)
    at WORK/mnt          10.213.X.1/30     10.213.X.2:22     +D ms client->server   127.0.0.1:22

Every byte from the client to the server (SFTP requests, SSH window updates) reaches sshd D ms
late, so every request takes D ms longer, while requests stay pipelined and replies flow back at
once: what ``tc netem delay D`` on the veth would do. This machine's kernel has no sch_netem
(CONFIG_NET_SCH_NETEM is not set), hence the relay (bench/delay_proxy.py); it runs inside the
namespace, so nothing touches the root namespace's ``lo`` or real interfaces.

For each latency D a fresh relay and a fresh sshfs mount are made, and
``fxkit.loadbench.bench.bench`` runs the methods in interleaved rounds, cold: before every run the
files are evicted from the page cache both behind the mount (the server's copies on local disk)
and on it (the FUSE client's pages), checked with mincore. sshd runs in its own mount namespace
with a private tmpfs on /run (its privilege-separation directory), so nothing is left on the
host. Everything is torn down on exit, failure or Ctrl-C: unmount, relay and sshd stopped by PID,
namespace (and veth pair) deleted, temp dir removed. Needs root, iproute2, openssh-server, sshfs.

``--transport fuse`` replaces the whole link with bench/latency_fuse/latency_fuse.c (compiled
here against libfuse3): a read-only passthrough that delays every FUSE request by D ms, served by
up to 64 libfuse threads. It has the latency without ssh's CPU cost, which caps the sshfs link
near 0.35 GB/s on a small machine. Needs cc, pkg-config and libfuse3-dev.

    python bench/remote_fs.py MODEL --latencies 0,0.5,1,2 --runs 3 \\
        --json docs/remote_latency.json --plot docs/img/remote_latency.png
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import yaml
from fxkit.loader.files import model_files
from plot_latency import FIELD_SPEEDUP, plot
from rich.console import Console
from rich.table import Table

from fxkit.loadbench import bench

SSHFS_OPTIONS = (
    "ro",
    "max_conns=4",  # parallel SSH connections; an open file sticks to one of them
    "dir_cache=no",
    "kernel_cache",  # keep pages across opens (as NFS does): prefetch-then-load depends on it
    "Ciphers=aes128-gcm@openssh.com",  # cheapest cipher with AES-NI: crypto is the CPU cost
    "Compression=no",
    "BatchMode=yes",
    "StrictHostKeyChecking=yes",
    "GlobalKnownHostsFile=/dev/null",
)
SSHD_CONFIG = """\
ListenAddress 127.0.0.1:22
HostKey {work}/host_key
AuthorizedKeysFile {work}/authorized_keys
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
PidFile none
Subsystem sftp internal-sftp
"""
REQUIRED = ("ip", "sshfs", "fusermount3", "ssh-keygen", "unshare", "/usr/sbin/sshd")
REQUIRED_FUSE = ("cc", "pkg-config", "fusermount3")
HERE = Path(__file__).resolve().parent


def sh(*argv: str) -> str:
    """Run a command; raise with its stderr when it fails."""
    proc = subprocess.run(argv, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: exit {proc.returncode}: {proc.stderr.strip()}")
    return proc.stdout


@dataclass(frozen=True)
class Link:
    """The veth pair between the host and the server's namespace."""

    netns: str
    host_dev: str
    host_addr: str
    server_addr: str


@contextlib.contextmanager
def netns_link(tag: int) -> Iterator[Link]:
    """A network namespace and a veth pair into it, addressed; deleted on exit."""
    subnet = f"10.213.{tag % 250}"
    link = Link(f"fxbench-{tag}", f"fxb{tag}h", f"{subnet}.1", f"{subnet}.2")
    peer = f"fxb{tag}n"
    sh("ip", "netns", "add", link.netns)
    try:
        sh(
            "ip",
            "link",
            "add",
            link.host_dev,
            "type",
            "veth",
            "peer",
            "name",
            peer,
            "netns",
            link.netns,
        )
        sh("ip", "addr", "add", f"{link.host_addr}/30", "dev", link.host_dev)
        sh("ip", "link", "set", link.host_dev, "up")
        sh("ip", "-n", link.netns, "addr", "add", f"{link.server_addr}/30", "dev", peer)
        sh("ip", "-n", link.netns, "link", "set", peer, "up")
        sh("ip", "-n", link.netns, "link", "set", "lo", "up")
        yield link
    finally:
        # Deleting the namespace deletes the veth pair and its qdisc with it.
        subprocess.run(["ip", "netns", "delete", link.netns], check=False)


@contextlib.contextmanager
def delay_relay(link: Link, ms: float) -> Iterator[None]:
    """The relay on the server's veth address, adding ``ms`` to every request; stopped by PID."""
    argv = [
        "ip",
        "netns",
        "exec",
        link.netns,
        sys.executable,
        str(HERE / "delay_proxy.py"),
        "--listen",
        f"{link.server_addr}:22",
        "--to",
        "127.0.0.1:22",
        "--delay-ms",
        str(ms),
    ]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        _wait_for(lambda: _port_open(link.server_addr), "delay_proxy.py", proc)
        yield
    finally:
        _stop(proc)


def sftp_round_trip_ms(mnt: Path, samples: int = 9) -> float:
    """Median time to stat a missing file on the mount: one SFTP request and its reply."""
    times = []
    for i in range(samples):
        start = time.perf_counter()
        with contextlib.suppress(FileNotFoundError):
            os.stat(mnt / f".rtt-probe-{i}")
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


def _wait_for(check, what: str, proc: subprocess.Popen, timeout: float = 15) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if proc.poll() is not None:
            raise RuntimeError(f"{what}: exited {proc.returncode}: {proc.stderr.read().strip()}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what}: not ready after {timeout} s")
        time.sleep(0.1)


def _port_open(addr: str, port: int = 22) -> bool:
    with contextlib.suppress(OSError), socket.create_connection((addr, port), timeout=0.5):
        return True
    return False


def _stop(proc: subprocess.Popen, sig: int = signal.SIGTERM) -> None:
    if proc.poll() is None:
        proc.send_signal(sig)
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@contextlib.contextmanager
def sshd(link: Link, work: Path) -> Iterator[None]:
    """A real sshd in the namespace, keys made for this run only, stopped by its PID on exit."""
    sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(work / "host_key"))
    sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(work / "client_key"))
    shutil.copy(work / "client_key.pub", work / "authorized_keys")
    host_pub = (work / "host_key.pub").read_text().split()
    (work / "known_hosts").write_text(f"{link.server_addr} {host_pub[0]} {host_pub[1]}\n")
    (work / "sshd_config").write_text(SSHD_CONFIG.format(work=work))
    start = (
        "mount -t tmpfs -o mode=755 fxbench-run /run && mkdir -m 755 /run/sshd && "
        f"exec /usr/sbin/sshd -D -e -f {work}/sshd_config"
    )
    argv = [
        "ip",
        "netns",
        "exec",
        link.netns,
        "unshare",
        "--mount",
        "--propagation",
        "private",
        "sh",
        "-c",
        start,
    ]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        probe = [
            "ip",
            "netns",
            "exec",
            link.netns,
            sys.executable,
            "-c",
            "import socket; socket.create_connection(('127.0.0.1', 22), timeout=1)",
        ]
        _wait_for(lambda: subprocess.run(probe, capture_output=True).returncode == 0, "sshd", proc)
        yield
    finally:
        _stop(proc)


@contextlib.contextmanager
def fuse_daemon(argv: list[str], mnt: Path) -> Iterator[None]:
    """Run a FUSE daemon in the foreground until ``mnt`` is mounted; unmount and stop it on exit."""
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        _wait_for(lambda: os.path.ismount(mnt), Path(argv[0]).name, proc)
        yield
    finally:
        if subprocess.run(["fusermount3", "-u", str(mnt)], check=False).returncode != 0:
            subprocess.run(["fusermount3", "-uz", str(mnt)], check=False)
        _stop(proc)


@contextlib.contextmanager
def sshfs_mount(link: Link, work: Path, remote_dir: Path, mnt: Path) -> Iterator[Path]:
    """Mount ``remote_dir`` from the server at ``mnt``, fresh (no cached pages); unmount on exit."""
    mnt.mkdir(exist_ok=True)
    options = [
        *SSHFS_OPTIONS,
        f"IdentityFile={work}/client_key",
        f"UserKnownHostsFile={work}/known_hosts",
    ]
    argv = [
        "sshfs",
        "-f",
        "-F",
        "/dev/null",
        "-o",
        ",".join(options),
        f"root@{link.server_addr}:{remote_dir}",
        str(mnt),
    ]
    with fuse_daemon(argv, mnt):
        yield mnt


def build_latency_fuse(work: Path) -> Path:
    """Compile bench/latency_fuse/latency_fuse.c (libfuse3) into ``work``; return the program."""
    program = work / "latency_fuse"
    flags = sh("pkg-config", "fuse3", "--cflags", "--libs").split()
    sh("cc", "-O2", "-o", str(program), str(HERE / "latency_fuse" / "latency_fuse.c"), *flags)
    return program


@contextlib.contextmanager
def latency_fuse_mount(program: Path, source: Path, mnt: Path, ms: float) -> Iterator[Path]:
    """``source`` at ``mnt`` through the C passthrough, every request ``ms`` late; fresh mount."""
    mnt.mkdir(exist_ok=True)
    argv = [str(program), str(source), str(mnt), str(round(ms * 1000)), "-o", "max_threads=64"]
    with fuse_daemon(argv, mnt):
        yield mnt


@contextlib.contextmanager
def remote_mounts(args: argparse.Namespace, model: Path) -> Iterator[Callable[[float], Any]]:
    """A function that mounts ``model`` with a given added delay, by the chosen transport."""
    with contextlib.ExitStack() as stack:
        work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="fxbench-remote-")))
        if args.transport == "fuse":
            program = build_latency_fuse(work)
            yield lambda ms: latency_fuse_mount(program, model, work / "mnt", ms)
            return
        link = stack.enter_context(netns_link(os.getpid()))
        stack.enter_context(sshd(link, work))

        @contextlib.contextmanager
        def mount(ms: float) -> Iterator[Path]:
            with delay_relay(link, ms), sshfs_mount(link, work, model, work / "mnt") as mnt:
                yield mnt

        yield mount


def each_latency(
    args: argparse.Namespace, measure: Callable[[Path, float, list[Path]], dict]
) -> list[dict]:
    """``measure(mount, delay, backing files)`` for each added delay, on a fresh mount each."""
    model = Path(args.model).resolve()
    backing = model_files(model).files
    with remote_mounts(args, model) as mount:
        results = []
        for ms in args.latencies:
            with mount(ms) as mnt:
                results.append(measure(mnt, ms, backing))
        return results


def run(args: argparse.Namespace, console: Console) -> list[dict]:
    """The single-process methods over the mount, per latency."""

    def measure(mnt: Path, ms: float, backing: list[Path]) -> dict:
        rtt = sftp_round_trip_ms(mnt)
        console.print(f"[bold]added delay {ms} ms[/]: round trip {rtt:.2f} ms")
        report = bench.bench(
            mnt,
            args.methods,
            args.runs,
            cold=True,
            fxkit_options=args.fxkit_options,
            also_evict=backing,
            targets={"baseline": FIELD_SPEEDUP},
            on_run=lambda r: console.print(f"  {r.line()}", highlight=False),
        )
        bench.render(report, console)
        ratios = {m: bench.ratio(report.runs, "fxkit", m) for m in ("baseline", "prefetch")}
        return {"delay_ms": ms, "rtt_ms": rtt, "fxkit_vs": ratios, "report": asdict(report)}

    return each_latency(args, measure)


def run_ranks(args: argparse.Namespace, console: Console) -> list[dict]:
    """``--ranks``: N processes per method load the model over the mount at once, per latency."""
    from fxkit.loadbench import bench_ranks

    def measure(mnt: Path, ms: float, backing: list[Path]) -> dict:
        console.print(f"[bold]added delay {ms} ms[/]")
        report = bench_ranks.bench_ranks(
            mnt, args.ranks, args.methods, args.runs, args.fxkit_options,
            on_run=lambda r: console.print(f"  {r.line()}", highlight=False),
            also_evict=backing,
        )  # fmt: skip
        bench_ranks.render(report, console)
        return {"delay_ms": ms, "report": asdict(report)}

    return each_latency(args, measure)


def table(results: list[dict], nbytes: int) -> Table:
    """Speed per method and fxkit's within-round ratios, per added latency."""
    methods = [s["method"] for s in results[0]["report"]["summaries"] if not s["skipped"]]
    t = Table(title=f"added delay per request, {nbytes / bench.GB:.2f} GB, cold, GB/s medians")
    for col in ("added delay", "round trip ms", *methods, "fxkit / baseline", "fxkit / prefetch"):
        t.add_column(col, justify="right")
    for r in results:
        summaries = {s["method"]: s for s in r["report"]["summaries"]}
        speeds = [f"{summaries[m]['gbps_median'] or 0:.3f}" for m in methods]
        ratios = [f"{x:.2f}x" if (x := r["fxkit_vs"][m]) else "-" for m in ("baseline", "prefetch")]
        t.add_row(f"{r['delay_ms']} ms", f"{r['rtt_ms']:.2f}", *speeds, *ratios)
    return t


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", help="checkpoint directory on local disk")
    parser.add_argument(
        "--latencies",
        default="0,0.5,1,2",
        type=lambda s: [float(x) for x in s.split(",")],
        help="netem delays, ms",
    )
    parser.add_argument("--runs", type=int, default=3, help="interleaved rounds per latency")
    parser.add_argument("--methods", default="baseline,prefetch,fxkit", type=lambda s: s.split(","))
    parser.add_argument("--fxkit-option", "-o", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument(
        "--transport",
        choices=("sshfs", "fuse"),
        default="sshfs",
        help="sshfs over a veth pair with a delay relay, or a C FUSE passthrough that delays "
        "every request (no network, no crypto: latency without the CPU ceiling)",
    )
    parser.add_argument(
        "--ranks",
        type=lambda s: [int(x) for x in s.split(",")],
        help="N[,N...]: N processes per method at once (fxkit bench load --ranks), per latency",
    )
    parser.add_argument("--json", help="write every report here")
    parser.add_argument("--plot", help="PNG of speed-up vs latency (needs matplotlib)")
    args = parser.parse_args()
    pairs = (item.partition("=") for item in args.fxkit_option)
    args.fxkit_options = {key: yaml.safe_load(value) for key, _, value in pairs}
    if os.geteuid() != 0:
        sys.exit("remote_fs.py needs root (network namespace, netem, FUSE mount)")
    required = REQUIRED_FUSE if args.transport == "fuse" else REQUIRED
    if missing := [c for c in required if not shutil.which(c)]:
        sys.exit(f"missing: {', '.join(missing)} (scripts/install-system-deps.sh installs them)")
    console = Console()
    if args.ranks:
        results = run_ranks(args, console)
        if args.json:
            Path(args.json).write_text(json.dumps(results, indent=2) + "\n")
        return
    results = run(args, console)
    console.print(table(results, results[0]["report"]["nbytes"]))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")
    if args.plot:
        link = "a FUSE passthrough with delay" if args.transport == "fuse" else "sshfs"
        plot(results, args.plot, link)
        console.print(f"plot: {args.plot}")


if __name__ == "__main__":
    main()
