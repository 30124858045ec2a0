"""How fast the lab fleet starts, what a host costs, and what one SSH command costs.

    sudo .venv/bin/python bench/lab_startup.py [--hosts 8 32 64] [--repeat 3] [--relay]
        [--profile mi308x]

For each size: a fresh fleet in a temporary directory is brought up until every host accepts
a login (median of --repeat), its memory is the hosts' proportional set size (PSS, relays
included), then it is stopped. On the first fleet of each size it also opens one connection per
host in parallel and measures one command's round trip on an open connection. With --relay (and
hosts in network namespaces of their own) it compares, on one host, the way through the relay
with a direct connection from inside the host's network namespace (``nsenter --net``): one
command's round trip, and a 100 MB upload with OpenSSH's sftp. With --profile the fleets are
started with that simulated hardware profile (compare with a run without it).
"""

from __future__ import annotations

import argparse
import os
import random
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from fxkit.lab import Fleet


def measure(hosts: int, repeat: int, prefix: str, relay: bool, profile: str | None) -> None:
    ups, downs, pss = [], [], []
    for i in range(repeat):
        with tempfile.TemporaryDirectory(prefix="fxkit-lab-bench-") as state:
            fleet = Fleet(state, prefix=prefix)
            started = time.perf_counter()
            fleet.up(hosts, profile=profile)
            ups.append(time.perf_counter() - started)
            pss.append(sum(h.memory_bytes for h in fleet.status()) / hosts / 2**20)
            if i == 0:
                connections(fleet)
                if relay:
                    relay_cost(fleet)
            started = time.perf_counter()
            fleet.down()
            downs.append(time.perf_counter() - started)
    print(
        f"{hosts:3d} hosts: up {statistics.median(ups):.2f} s (median of {repeat}), "
        f"down {statistics.median(downs):.2f} s, {statistics.median(pss):.1f} MiB PSS per host"
    )


def connections(fleet: Fleet) -> None:
    conns = [fleet.connect(h.name) for h in fleet.status()]
    started = time.perf_counter()
    with ThreadPoolExecutor(len(conns)) as pool:
        list(pool.map(lambda conn: conn.open(), conns))
    opened = time.perf_counter() - started
    conns[0].run("true")
    started = time.perf_counter()
    for _ in range(200):
        conns[0].run("true")
    per_command = (time.perf_counter() - started) / 200
    for conn in conns:
        conn.close()
    print(
        f"     {len(conns)} connections opened in parallel in {opened:.2f} s; "
        f"one command on an open connection: {per_command * 1000:.1f} ms"
    )


ROUND_TRIP = """
import sys, time
from fxkit.lab import Fleet
with Fleet(sys.argv[1]).connect("lab01") as conn:
    conn.run("true")
    started = time.perf_counter()
    for _ in range(200):
        conn.run("true")
    print((time.perf_counter() - started) / 200 * 1000)
"""


def relay_cost(fleet: Fleet) -> None:
    """The relay against a direct connection inside the host's network namespace."""
    pid = fleet.hosts["lab01"]["pid"]
    init = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()[0]
    inside = ["nsenter", f"--net=/proc/{init}/ns/net"]
    if os.stat(f"/proc/{init}/ns/net").st_ino == os.stat("/proc/self/ns/net").st_ino:
        print("     --relay: the hosts share this machine's network namespace (no relay)")
        return
    command = [sys.executable, "-c", ROUND_TRIP, str(fleet.dir)]
    ms = {
        way: float(subprocess.run(prefix + command, capture_output=True, check=True).stdout)
        for way, prefix in (("relay", []), ("direct", inside))
    }
    with tempfile.NamedTemporaryFile(prefix="fxkit-lab-bench-") as blob:
        blob.write(os.urandom(2**20) * 100)
        blob.flush()
        batch = f"put {shlex.quote(blob.name)} /tmp/blob\n".encode()
        sftp = [
            "sftp", "-q", "-b", "-", "-i", str(fleet.client_key),
            "-o", f"UserKnownHostsFile={fleet.known_hosts}", "-o", "BatchMode=yes",
            f"root@{fleet.address('lab01')}",
        ]  # fmt: skip
        upload = {}
        for way, prefix in (("relay", []), ("direct", inside)) * 2:
            started = time.perf_counter()
            subprocess.run(prefix + sftp, input=batch, capture_output=True, check=True)
            upload[way] = min(upload.get(way, 1e9), time.perf_counter() - started)
    print(
        f"     one command: {ms['relay']:.2f} ms through the relay, {ms['direct']:.2f} ms direct "
        f"({ms['relay'] / ms['direct']:.2f}x); 100 MB sftp upload: {upload['relay']:.2f} s "
        f"through the relay, {upload['direct']:.2f} s direct "
        f"({upload['relay'] / upload['direct']:.2f}x)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, nargs="+", default=[8, 32, 64])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--relay", action="store_true", help="relay against direct, one host")
    parser.add_argument("--profile", default=None, help="a simulated hardware profile (mi308x)")
    args = parser.parse_args()
    prefix = f"127.{random.randint(100, 250)}.{random.randint(0, 255)}"
    for hosts in args.hosts:
        measure(hosts, args.repeat, prefix, args.relay, args.profile)


if __name__ == "__main__":
    main()
