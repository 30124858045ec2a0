"""``fxkit inventory --list`` against ``ansible-inventory --list`` on a large inventory directory.

    .venv/bin/python bench/inventory_list.py --ansible-bin /tmp/ansible/bin [--hosts N] [--repeat N]

Writes an inventory directory of HOSTS hosts (an INI file and a YAML file, nested groups, ranges,
``group_vars/`` and ``host_vars/`` files), checks that both tools print the same ``--list``, then
times each as a fresh process (what a user waits for), alternating, and prints medians and the
ratio. ``ansible-core`` comes from a virtualenv of its own (``pip install ansible-core``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def write_inventory(folder: Path, hosts: int) -> None:
    """``hosts`` hosts in racks of 20 under four pods, half in YAML, half in INI (read second)."""
    racks = hosts // 20
    ini = ["[fleet:children]", *(f"pod{p}" for p in range(4))]
    yml = ["all:", "  children:"]
    for rack in range(racks):
        pod, members = rack % 4, f"r{rack:03d}n[01:20]"
        if rack % 2:
            yml += [f"    rack{rack:03d}:", "      hosts:", f"        {members}:"]
            yml += [f"          rack_slot: {rack}"]
        else:
            ini += [f"[rack{rack:03d}]", f"{members} rack_slot={rack} ansible_user=ops"]
        ini += [f"[pod{pod}:children]", f"rack{rack:03d}", f"[rack{rack:03d}:vars]", f"rack={rack}"]
    (folder / "20-hosts.ini").write_text("\n".join(ini) + "\n")
    (folder / "10-hosts.yml").write_text("\n".join(yml) + "\n")
    (folder / "group_vars").mkdir()
    (folder / "group_vars" / "all.yml").write_text("ntp: 10.0.0.1\nrocm_version: '7.2'\n")
    for pod in range(4):
        (folder / "group_vars" / f"pod{pod}.yml").write_text(f"pod: {pod}\nnic: ens{pod}\n")
    (folder / "host_vars").mkdir()
    for rack in range(0, racks, 5):
        (folder / "host_vars" / f"r{rack:03d}n01.yml").write_text("role: head\n")


def timed(argv: list[str]) -> tuple[float, str]:
    started = time.perf_counter()
    result = subprocess.run(argv, capture_output=True, text=True, check=True)
    return time.perf_counter() - started, result.stdout


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ansible-bin", type=Path, required=True)
    parser.add_argument("--hosts", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="fxkit-inventory-bench-") as tmp:
        folder = Path(tmp) / "prod"
        folder.mkdir()
        write_inventory(folder, args.hosts)
        ansible = str(args.ansible_bin / "ansible-inventory")
        tools = {
            "fxkit": [sys.executable, "-m", "fxkit", "inventory", "-i", str(folder), "--list"],
            "ansible-inventory": [ansible, "-i", str(folder), "--list"],
        }
        outputs = {name: json.loads(timed(argv)[1]) for name, argv in tools.items()}
        outputs["ansible-inventory"]["_meta"].pop("profile")
        assert outputs["fxkit"] == outputs["ansible-inventory"], "the two --list outputs differ"
        assert len(outputs["fxkit"]["_meta"]["hostvars"]) == args.hosts
        times: dict[str, list[float]] = {name: [] for name in tools}
        for _ in range(args.repeat):
            for name, argv in tools.items():
                times[name].append(timed(argv)[0])
    medians = {name: statistics.median(values) for name, values in times.items()}
    for name, median in medians.items():
        print(f"{name:18s} {median:6.2f} s  (median of {args.repeat}: {times[name]})")
    ratio = medians["ansible-inventory"] / medians["fxkit"]
    print(f"{args.hosts} hosts, same --list output; fxkit is {ratio:.1f}x faster")


if __name__ == "__main__":
    main()
