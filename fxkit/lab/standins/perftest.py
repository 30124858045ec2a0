"""RDMA traffic between nodes: perftest's ib_write_bw and rdma-core's ibv_rc_pingpong.

Lab hosts do not reach each other over RDMA, so a server and its client exchange no data: each
side answers on its own, from recorded real output (the profile's ``perftest/``, SOURCES.md), at
its own port's link speed (``/sys/class/net/IF/speed``). A test of two nodes is judged by the
gate on both sides' reports (the lower one), as a real pair reports the same figure on both. A
server waits for its client as a real one blocks until its client connects: the client marks the
server's address and TCP port done in the fleet's shared folder. Each call logs when it started
and ended, so that a test can prove which tests ran at the same time.
"""

from __future__ import annotations

import argparse
import ipaddress
import re
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from .common import SHARED, Profile, Tool, fail, netdev_attr, new_parser, own_address

#: The recorded run's link speed (Mb/s): a 400G NIC pair (SOURCES.md).
RECORDED_MBPS = 400000
#: A loopback's figure against a pair's, as AMD publishes them for a 400G NIC: 390 Gb/s GPU to
#: NIC on one node against 770 Gb/s NIC to NIC (system-acceptance-docs, rdma-benchmarking.md).
LOOPBACK = 390 / 770
LOCAL = ("127.0.0.1", "localhost", "::1")
#: How long a side of a test "runs" (seconds): a client CLIENT_S; a server until its client is
#: done, at most SERVER_S (a real one blocks until a client connects; the gate's timeout ends it).
SERVER_S, CLIENT_S = 60.0, 0.6


def _marks(tool: str, server: str | None, port: int) -> tuple[Path, Path]:
    """The marks of the test of ``tool`` at ``server`` (None: this host) and ``port`` in the
    fleet's shared folder: the server listens, the client is done."""
    address = own_address() if server is None or server in LOCAL else server
    stem = f"{tool}-{address}-{port}"
    return SHARED / f"{stem}.listen", SHARED / f"{stem}.done"


@contextmanager
def _side(tool: str, port: int, server: str | None) -> Iterator[None]:
    """A side of a test (a client: ``server`` is its server's address). A server's listen mark
    lasts as long as it runs; a client marks its server's port done when it ends, however."""
    listen, done = _marks(tool, server, port)
    try:
        if server is None:
            listen.write_text(str(time.time()))
        yield
    finally:
        (
            done.write_text(str(time.time()))
            if server is not None
            else listen.unlink(missing_ok=True)
        )


def _take(tool: str, port: int, server: str | None, entry: dict[str, Any]) -> None:
    """How long a side runs. A client waits for its server to listen (as perftest's client needs
    it), logs that as its start, and runs CLIENT_S; a server waits until its client marked its
    port done after the server started, at most SERVER_S."""
    listen, done = _marks(tool, server, port)
    if server is not None:
        if not _wait(listen.exists):
            fail("", f"Couldn't connect to {server}:{port}", 1)
        entry["started"] = time.time()
        time.sleep(CLIENT_S)
        return
    started = float(listen.read_text())
    _wait(lambda: float(done.read_text()) > started)


def _wait(ready: Callable[[], bool]) -> bool:
    """Whether ``ready()`` came true within SERVER_S (polled; a missing mark is not ready)."""
    begun = time.time()
    while time.time() - begun < SERVER_S:
        try:
            if ready():
                return True
        except (OSError, ValueError):
            pass
        time.sleep(0.1)
    return False


_ROW = re.compile(r"^ (\d+)(\s+)(\d+)(\s+)([\d.]+)(\s+)([\d.]+)(\s+)([\d.]+)$", re.M)


def _port(p: Profile, device: str | None, tool: str) -> dict[str, Any]:
    ports = p["rdma"]["ports"]
    port = next((x for x in ports if x["dev"] == device), ports[0] if device is None else None)
    if port is None:  # perftest and rdma-core word this differently; neither checked upstream
        fail("", f" IB device {device} not found\n Unable to find the Infiniband/RoCE device", 1)
    if netdev_attr(port["netdev"], "operstate") not in ("up", "unknown"):
        fail("", f" Port number 1 state is Down on {port['dev']}: {tool} cannot connect", 1)
    return port


def _speed(port: dict[str, Any]) -> int:
    return int(netdev_attr(port["netdev"], "speed", str(RECORDED_MBPS)) or RECORDED_MBPS)


def _scale(text: str, factor: float, size: int | None) -> str:
    """The table's bandwidths times ``factor``; only the row of ``size`` when one is given."""

    def row(m: re.Match[str]) -> str:
        if size is not None and int(m[1]) != size:
            return "\x00"
        peak, average = float(m[5]) * factor, float(m[7]) * factor
        return f" {m[1]}{m[2]}{m[3]}{m[4]}{peak:.2f}{m[6]}{average:.2f}{m[8]}{m[9]}"

    return "".join(line for line in _ROW.sub(row, text).splitlines(True) if line != "\x00\n")


def ib_write_bw(p: Profile, args: list[str], stdin: str, entry: dict[str, Any]) -> int:
    entry["started"] = time.time()
    parser = new_parser("ib_write_bw")
    parser.add_argument("-d", "--ib-dev")
    parser.add_argument("-x", "--gid-index", type=int, default=0)
    parser.add_argument("-i", "--ib-port", type=int, default=1)
    parser.add_argument("-q", "--qp", type=int, default=1)
    parser.add_argument("-s", "--size", type=int)
    parser.add_argument("-D", "--duration", type=int)
    parser.add_argument("-n", "--iters", type=int)
    parser.add_argument("-p", "--port", type=int, default=18515)
    parser.add_argument("--use_rocm", type=int)
    for flag in ("-a", "-b", "-F", "--report_gbits"):
        parser.add_argument(flag, action="store_true")
    parser.add_argument("server", nargs="?")
    opts = parser.parse_args(args)
    with _side("ib_write_bw", opts.port, opts.server):
        return _write_bw(p, opts, entry)


def _write_bw(p: Profile, opts: argparse.Namespace, entry: dict[str, Any]) -> int:
    port = _port(p, opts.ib_dev, "ib_write_bw")
    client = opts.server is not None
    folder = Path(p["dir"]) / "perftest"
    text = (folder / f"ib_write_bw_b_{'client' if client else 'server'}.txt").read_text()
    factor = _speed(port) / RECORDED_MBPS * (LOOPBACK if opts.server in LOCAL else 1.0)
    if not opts.b:
        factor /= 2  # one direction of the recorded bidirectional run
        text = text.replace("Bidirectional BW Test", "BW Test")
    text = _scale(text, factor, None if opts.a else (opts.size or 65536))
    text = re.sub(r"(Device\s+: )\S+", rf"\g<1>{port['dev']}", text)
    text = re.sub(r"(Number of qps\s+: )\d+", rf"\g<1>{opts.qp}", text)
    text = re.sub(r"(GID index\s+: )\d+", rf"\g<1>{opts.gid_index}", text)
    if not opts.report_gbits:
        fail("", "the stand-in answers in Gb/sec only (--report_gbits)", 1)
    if opts.use_rocm is not None:
        text = _rocm(p, folder, opts.use_rocm, text)
    _take("ib_write_bw", opts.port, opts.server, entry)
    print(text, end="")
    entry["device"], entry["ended"] = port["dev"], time.time()
    return 0


def _rocm(p: Profile, folder: Path, gpu: int, text: str) -> str:
    """The recorded ``--use_rocm`` lines around the table, naming the profile's GPU."""
    if not 0 <= gpu < len(p["gpus"]["bdfs"]):
        fail("", f"Couldn't initialize ROCm device {gpu}", 1)
    using, allocated, memory, freed = folder.joinpath("use_rocm_lines.txt").read_text().splitlines()
    bus = int(p["gpus"]["bdfs"][gpu].split(":")[1], 16)
    using = (
        f"Using ROCm Device with ID: {gpu}, Name: {p['gpus']['market_name']}, "
        f"PCI Bus ID: {bus:#x}, GCN Arch: {p['gpus']['gfx']}:sramecc+:xnack-"
    )
    text = text.replace(" Data ex. method", f"{memory}\n Data ex. method", 1)
    table = text.index("-" * 87)
    return f"{text[:table]}{using}\n{allocated}\n{text[table:]}{freed}\n"


def ibv_rc_pingpong(p: Profile, args: list[str], stdin: str, entry: dict[str, Any]) -> int:
    """Built from rdma-core's libibverbs/examples/rc_pingpong.c (no recorded run at 400G was
    found): its printf formats, its defaults (4096 bytes, 1000 iterations, bytes counted both
    ways) and the port's GID from the profile's sysfs. The peer is not reachable, so the remote
    line repeats the local GID, and the time is a quarter of the port's line rate: not a
    measurement (G1 reads only that the exchange completed)."""
    entry["started"] = time.time()
    parser = new_parser("ibv_rc_pingpong")
    parser.add_argument("-d", "--ib-dev")
    parser.add_argument("-g", "--gid-idx", type=int)
    parser.add_argument("-p", "--port", type=int, default=18515)
    parser.add_argument("-i", "--ib-port", type=int, default=1)
    parser.add_argument("-s", "--size", type=int, default=4096)
    parser.add_argument("-n", "--iters", type=int, default=1000)
    parser.add_argument("server", nargs="?")
    opts = parser.parse_args(args)
    with _side("ibv_rc_pingpong", opts.port, opts.server):
        return _pingpong(p, opts, entry)


def _pingpong(p: Profile, opts: argparse.Namespace, entry: dict[str, Any]) -> int:
    port = _port(p, opts.ib_dev, "ibv_rc_pingpong")
    if opts.gid_idx is None:
        fail("", "Couldn't get local LID", 1)  # RoCE needs a GID; without -g it has none
    gids = Path("/sys/class/infiniband") / port["dev"] / "ports" / "1" / "gids"
    try:
        gid = (gids / str(opts.gid_idx)).read_text().strip()
    except OSError:
        fail("", f"can't read sgid of index {opts.gid_idx}", 1)
    address = ipaddress.IPv6Address(gid)  # in inet_ntop's form, as rc_pingpong prints it
    mapped = address.ipv4_mapped
    ip6 = f"::ffff:{mapped}" if mapped else str(address)
    _take("ibv_rc_pingpong", opts.port, opts.server, entry)
    seconds = opts.size * opts.iters * 2 * 8 / (_speed(port) * 1e6) * 4  # a quarter line rate
    print(f"  local address:  LID 0x0000, QPN 0x{0x18B:06x}, PSN 0x92d03e, GID {ip6}")
    print(f"  remote address: LID 0x0000, QPN 0x{0x89:06x}, PSN 0x76ea22, GID {ip6}")
    total = opts.size * opts.iters * 2
    print(f"{total} bytes in {seconds:.2f} seconds = {total * 8 / seconds / 1e6:.2f} Mbit/sec")
    print(
        f"{opts.iters} iters in {seconds:.2f} seconds = {seconds * 1e6 / opts.iters:.2f} usec/iter"
    )
    entry["device"], entry["ended"] = port["dev"], time.time()
    return 0


TOOLS: dict[str, Tool] = {"ib_write_bw": ib_write_bw, "ibv_rc_pingpong": ibv_rc_pingpong}
