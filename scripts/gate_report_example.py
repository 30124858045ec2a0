#!/usr/bin/env python3
"""Make docs/img/gate-report.png: the HTML report of a G1-like run on simulated MI308X nodes.

Starts a lab fleet of its own (``--hosts`` hosts, profile mi308x: the stand-in amd-smi, eight
RDMA ports in sysfs, eight veth netdevs; see docs/lab.md), sets MTU 9000 on every host's RDMA
netdevs but the last host's (a node whose NICs were never configured: its rdma_mtu FAILs), runs
a G1-like gate of ``command`` checks with :class:`~fxkit.gate.run.GateRun` (real fio on each
host, O_DIRECT on a file in its /var/tmp), writes the reports, opens report.html in headless
Chromium and saves the screenshot. The thresholds are G1's, from the roles' defaults (8 GPUs,
MI308X, 192 GiB, MTU 9000); storage minimums suit the lab's disk. ``--gate FILE`` runs another
gate file instead (gates/g1.yml once it holds the whole G1 list). Needs root (the lab) and
chromium (scripts/install-system-deps.sh)::

    sudo .venv/bin/python scripts/gate_report_example.py            # docs/img/gate-report.png
    sudo .venv/bin/python scripts/gate_report_example.py --keep /tmp/g1-example
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
from pathlib import Path

import yaml

from fxkit.gate import spec
from fxkit.gate.html import screenshot
from fxkit.gate.report import write_reports
from fxkit.gate.run import GateOptions, GateRun
from fxkit.lab import Fleet
from fxkit.runner import load_inventory

ROOT = Path(__file__).resolve().parent.parent
IMAGE = ROOT / "docs" / "img" / "gate-report.png"
PY = "python3 -c"
FIO = (
    "fio --name=g1-read --filename=/var/tmp/fxkit-g1.fio --size=256M --rw=read --bs=1M "
    "--iodepth=32 --ioengine=libaio --direct=1 --output-format=json | " + PY + " "
    "\"import json, sys; r = json.load(sys.stdin)['jobs'][0]['read']; "
    "print(json.dumps({'read_gbps': r['bw_bytes'] / 1e9, 'lat_ms': r['lat_ns']['mean'] / 1e6}))\""
)
#: amd-smi's GPUs by name (gpu0...): their ASIC and VRAM sections.
GPUS = (
    "amd-smi static --asic --vram --json | " + PY + ' "import json, sys; '
    "print(json.dumps({'gpu%d' % g['gpu']: g for g in json.load(sys.stdin)['gpu_data']}))\""
)
PORTS = (
    PY + " \"import glob, json; print(json.dumps({p.split('/')[4]: "
    "open(p + '/%s').read().split(':')[-1].strip() "
    "for p in sorted(glob.glob('/sys/class/infiniband/*/ports/1'))}))\""
)
MTUS = (
    PY + " \"import json, os; print(json.dumps({n: int(open('/sys/class/net/%s/mtu' % n).read()) "
    "for n in sorted(os.listdir('/sys/class/net')) if n.startswith('ens')}))\""
)


def check(id: str, title: str, why: str, run: str, rule: dict, **more: object) -> dict:
    parse = more.pop("parse", "text")
    tool = more.pop("tool", None)
    measure = {"run": run, "parse": parse, **({"tool": tool} if tool else {})}
    return {
        "id": id,
        "title": title,
        "why": why,
        "measure": {"command": measure},
        "rule": rule,
        **more,
    }


GATE = {
    "gate": "g1",
    "title": "G1 arrival acceptance (lab example)",
    "about": "A G1-like gate of command checks on simulated MI308X lab hosts, for the example "
    "report image (scripts/gate_report_example.py).",
    "hosts": "lab",
    "roles": ["rocm_host", "roce_nic"],
    "vars": {
        "g1_os_releases": ["ubuntu 22.04", "ubuntu 24.04", "debian 12"],
        "g1_rdma_ports": 8,
        "g1_storage_read_min_gbps": 0.3,
        "g1_storage_read_max_latency_ms": 200,
    },
    "checks": [
        check(
            "os_release",
            "OS release",
            "The OS releases ROCm 7.2 supports (and the lab's).",
            '. /etc/os-release && echo "$ID $VERSION_ID"',
            {"in": "{{ g1_os_releases }}"},
        ),
        check(
            "kernel_release",
            "Kernel version",
            "ROCm 7.2's amdgpu driver builds for Ubuntu's 5.15 and 6.8 kernels and later.",
            "uname -r",
            {">=": "5.15"},
        ),
        check(
            "rocm_version",
            "ROCm version",
            "The ROCm release the node was ordered with.",
            "cat /opt/rocm/.info/version",
            {">=": "7.2"},
        ),
        check(
            "gpu_count",
            "GPU count",
            "Every GPU the node was bought with is visible.",
            "amd-smi list --json | "
            + PY
            + " \"import json, sys; print(len(json.load(sys.stdin)['gpu_data']))\"",
            {"==": "{{ rocm_host_gpu_count }}"},
            parse="number",
            unit="GPUs",
        ),
        check(
            "gpu_model",
            "GPU model",
            "The GPUs are the model ordered.",
            GPUS,
            {"contains": "{{ rocm_host_gpu_model }}"},
            parse="json",
            value="*.asic.market_name",
        ),
        check(
            "gpu_vram",
            "VRAM per GPU",
            "Each GPU has its full HBM.",
            GPUS,
            {"within": {"of": "{{ rocm_host_gpu_vram_gib * 1024 }}", "tolerance": "1%"}},
            parse="json",
            value="*.vram.size.value",
            unit="MiB",
        ),
        check(
            "rdma_active_count",
            "RDMA ports ACTIVE",
            "Every RDMA port is up.",
            "grep -l ACTIVE /sys/class/infiniband/*/ports/1/state | wc -l",
            {"==": "{{ g1_rdma_ports }}"},
            parse="number",
            unit="ports",
        ),
        check(
            "rdma_state",
            "RDMA port state",
            "Each port is ACTIVE.",
            PORTS % "state",
            {"==": "ACTIVE"},
            parse="json",
            value="*",
        ),
        check(
            "rdma_link_layer",
            "RDMA link layer",
            "RoCE runs over Ethernet.",
            PORTS % "link_layer",
            {"==": "Ethernet"},
            parse="json",
            value="*",
        ),
        check(
            "rdma_mtu",
            "RDMA netdev MTU",
            "Jumbo frames on every RDMA netdev (roce_nic).",
            MTUS,
            {"==": "{{ roce_nic_mtu }}"},
            parse="json",
            value="*",
            unit="bytes",
        ),
        check(
            "storage_read_bandwidth",
            "Storage read bandwidth",
            "fio, sequential 1 MiB reads, queue depth 32, O_DIRECT.",
            FIO,
            {">=": "{{ g1_storage_read_min_gbps }}"},
            parse="json",
            tool="fio",
            value="read_gbps",
            unit="GB/s",
            timeout=300,
        ),
        check(
            "storage_read_latency",
            "Storage read latency",
            "The mean completion latency of the same fio run.",
            FIO,
            {"<=": "{{ g1_storage_read_max_latency_ms }}"},
            parse="json",
            tool="fio",
            value="lat_ms",
            unit="ms",
            severity="warning",
            timeout=300,
        ),
        check(
            "rdma_write_bandwidth",
            "RDMA write bandwidth",
            "ib_write_bw to a peer node, when one is named.",
            "ib_write_bw --report_gbits {{ g1_rdma_peer | default('') }}",
            {">=": 350},
            tool="ib_write_bw",
            unit="Gb/s",
            when="{{ g1_rdma_peer | default('') != '' }}",
        ),
        check(
            "rccl_all_reduce_busbw",
            "RCCL all_reduce bus bandwidth",
            "rccl-tests all_reduce_perf across the nodes, when asked for.",
            "all_reduce_perf -b 1G -e 1G",
            {">=": 300},
            tool="all_reduce_perf",
            unit="GB/s",
            when="{{ g1_rccl | default(false) }}",
        ),
    ],
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, default=3)
    parser.add_argument("--gate", help="a gate file to run instead of the G1-like example")
    parser.add_argument("--image", type=Path, default=IMAGE)
    parser.add_argument("--size", default="1280x2400", help="the browser window (WxH)")
    parser.add_argument("--keep", type=Path, help="keep the gate file and reports here")
    args = parser.parse_args()
    width, height = (int(n) for n in args.size.split("x"))
    with tempfile.TemporaryDirectory(prefix="fxkit-gate-example-") as tmp:
        folder = args.keep or Path(tmp)
        folder.mkdir(parents=True, exist_ok=True)
        gate_file = folder / "g1-lab-example.yml"
        gate_file.write_text(yaml.safe_dump(GATE, sort_keys=False, width=100))
        gate = spec.load(args.gate or gate_file)
        fleet = Fleet(
            Path(tmp) / "lab",
            prefix=f"127.{random.randint(100, 250)}.{random.randint(0, 255)}",
        )
        try:
            names = fleet.up(args.hosts, profile="mi308x")
            for name in names[:-1]:
                with fleet.connect(name) as conn:
                    done = conn.run(
                        "for n in /sys/class/net/ens*; do ip link set ${n##*/} mtu 9000; done"
                    )
                    if not done.ok:
                        raise SystemExit(f"{name}: could not set the MTU: {done.stderr}")
            inventory = load_inventory([fleet.inventory])
            runner = GateRun(gate, inventory, GateOptions(inventory_sources=["the lab fleet"]))
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
