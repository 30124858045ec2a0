"""How fast the lab fleet starts, what a host costs, and what one SSH command costs.

    sudo .venv/bin/python bench/lab_startup.py [--hosts 8 32 64] [--repeat 3]

For each size: a fresh fleet in a temporary directory is brought up until every host accepts
a login (median of --repeat), its memory is the hosts' proportional set size (PSS), then it is
stopped. On the largest fleet it also opens one connection per host in parallel and measures
one command's round trip on an open connection.
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

from fxkit.lab import Fleet


def measure(hosts: int, repeat: int, prefix: str) -> None:
    ups, downs, pss = [], [], []
    for i in range(repeat):
        with tempfile.TemporaryDirectory(prefix="fxkit-lab-bench-") as state:
            fleet = Fleet(state, prefix=prefix)
            started = time.perf_counter()
            fleet.up(hosts)
            ups.append(time.perf_counter() - started)
            pss.append(sum(h.memory_bytes for h in fleet.status()) / hosts / 2**20)
            if i == 0:
                connections(fleet)
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, nargs="+", default=[8, 32, 64])
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    prefix = f"127.{random.randint(100, 250)}.{random.randint(0, 255)}"
    for hosts in args.hosts:
        measure(hosts, args.repeat, prefix)


if __name__ == "__main__":
    main()
