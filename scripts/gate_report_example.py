#!/usr/bin/env python3
"""Make docs/img/gate-report.png: the HTML report of G1 (gates/g1.yml) on simulated MI308X nodes.

Starts a lab fleet of its own (``--hosts`` hosts, profile mi308x: the stand-in amd-smi, eight
RDMA ports in sysfs, eight veth netdevs; see docs/lab.md), does on every host what the roles do
before G1 (``nvme connect`` to the fabric's subsystem, as roles/nvmeof_initiator; MTU 9000 on the
RDMA netdevs, as roles/roce_nic) except on the last host, whose NICs were never configured (its
rdma_mtu FAILs), runs the built-in G1 with :class:`~fxkit.gate.run.GateRun` (real fio on each
host, O_DIRECT on a file in its /var/tmp; a storage minimum that suits the lab's disk), writes
the reports, opens report.html in headless Chromium and saves the screenshot. Needs root (the
lab) and chromium (scripts/install-system-deps.sh)::

    sudo .venv/bin/python scripts/gate_report_example.py            # docs/img/gate-report.png
    sudo .venv/bin/python scripts/gate_report_example.py --keep /tmp/g1-example
"""

from __future__ import annotations

import argparse
import random
import shlex
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

from fxkit.engine.runner import load_inventory
from fxkit.gate import spec
from fxkit.gate.html import screenshot
from fxkit.gate.report import write_reports
from fxkit.gate.run import GateOptions, GateRun
from fxkit.lab import Fleet

ROOT = Path(__file__).resolve().parent.parent
IMAGE = ROOT / "docs" / "img" / "gate-report.png"
NQN = "nqn.2024-01.com.example:models"
CONNECT = f"nvme connect -t rdma -a 192.168.100.10 -s 4420 -n {shlex.quote(NQN)}"
#: What the inventory of such nodes would say, and a storage minimum for the lab's disk.
LAB_VARS = {
    "nvmeof_initiator_connections": [
        {"nqn": NQN, "transport": "rdma", "address": "192.168.100.10", "size": "10G"}
    ],
    "rocm_host_kernel_args": [],  # the lab hosts boot this machine's kernel
    "g1_fio_size": "256M",
    "g1_fio_runtime": 5,
    "g1_storage_read_min_gbps": 1.0,
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, default=3)
    parser.add_argument("--gate", default="g1", help="the gate (default: the built-in g1)")
    parser.add_argument("--image", type=Path, default=IMAGE)
    parser.add_argument("--size", default="1280x2400", help="the browser window (WxH)")
    parser.add_argument("--keep", type=Path, help="keep the reports here")
    args = parser.parse_args()
    width, height = (int(n) for n in args.size.split("x"))
    gate = spec.load(args.gate)  # on the lab hosts (G1's own are an inventory's gpu_nodes)
    gate = replace(gate, spec=gate.spec.model_copy(update={"hosts": "lab"}))
    with tempfile.TemporaryDirectory(prefix="fxkit-gate-example-") as tmp:
        folder = args.keep or Path(tmp)
        folder.mkdir(parents=True, exist_ok=True)
        fleet = Fleet(
            Path(tmp) / "lab",
            prefix=f"127.{random.randint(100, 250)}.{random.randint(0, 255)}",
        )
        try:
            names = fleet.up(args.hosts, profile="mi308x")
            for index, name in enumerate(names):
                mtu = "; for n in /sys/class/net/ens*; do ip link set ${n##*/} mtu 9000; done"
                with fleet.connect(name) as conn:
                    done = conn.run(CONNECT + (mtu if index < len(names) - 1 else ""))
                    if not done.ok:
                        raise SystemExit(f"{name}: could not prepare it: {done.stderr}")
            inventory = load_inventory([fleet.inventory])
            options = GateOptions(extra_vars=LAB_VARS, inventory_sources=["the lab fleet"])
            runner = GateRun(gate, inventory, options)
            result = runner.run()
        finally:
            fleet.down()
        written = write_reports(result, folder / "reports", runner.secrets)
        args.image.parent.mkdir(parents=True, exist_ok=True)
        screenshot(written["html"], args.image, (width, height))
    print(f"{result.gate} {result.verdict}: {result.summary}")
    print(f"image: {args.image}" + (f"; reports: {folder / 'reports'}" if args.keep else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
