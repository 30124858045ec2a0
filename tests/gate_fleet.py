"""A simulated fleet of 64 MI300X-class nodes for the gate reports' fleet tests.

Each node is an inventory host of ``ansible_connection: local``: the gate really runs (fxkit's
GateRun, one thread per host, real commands and real judging), and each stage's measurement
reads the node's values from a JSON file this module writes (``cat DIR/NODE/STAGE.json``). The
values are simulated: a healthy node's figures with a seeded jitter of +-1 %, around AMD's
published MI300X acceptance figures where the check has one (the thresholds below, from
ROCm/system-acceptance-docs docs/gpus/mi300x.md), and a few nodes with one fault each:

- ``node07``: GPU 3's PCIe link trained at x8 (``gpu_pcie_width`` FAILs);
- ``node23``: an amdgpu error in the kernel log (``dmesg_amdgpu_errors`` FAILs);
- ``node41``: TransferBench all-to-all 30 % slower than the fleet, still above its minimum
  (PASSes, flagged as an outlier);
- ``node52``: a BIOS version not in the site's list (``bios_version`` FAILs);
- ``node60``: its performance stage's file is missing (every performance check ERROR);
- ``node33``: idle GPU power above its warning limit (``idle_power`` WARNs).
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import yaml

HOSTS = [f"node{i:02d}" for i in range(1, 65)]
GPUS = [str(i) for i in range(8)]
FAULTS = {
    "node07": "gpu_pcie_width",
    "node23": "dmesg_amdgpu_errors",
    "node41": "transferbench_a2a",
    "node52": "bios_version",
    "node60": "performance",
    "node33": "idle_power",
}
SLOW = 0.70
MI300X = "ROCm/system-acceptance-docs, docs/gpus/mi300x.md"
#: (id, stage, value path, rule, unit, healthy value or per-GPU value, source, severity)
Check = tuple[str, str, str, dict[str, Any], str | None, Any, str, str]
CHECKS: list[Check] = [
    ("os_release", "prerequisites", "os", {"in": ["24.04.3", "22.04.5"]}, None, "24.04.3",
     f"{MI300X}, Prerequisites", "critical"),
    ("rocm_version", "prerequisites", "rocm", {">=": "6.4"}, None, "6.4.1",
     f"{MI300X}, Prerequisites", "critical"),
    ("bios_version", "prerequisites", "bios", {"in": ["M1.10"]}, None, "M1.10",
     "the site's list of BIOS versions (docs/gpus/mi300x.md, Prerequisites)", "critical"),
    ("kernel_cmdline", "health", "cmdline", {"contains": ["iommu=pt", "pci=realloc=off"]}, None,
     "ro iommu=pt amd_iommu=on pci=realloc=off", f"{MI300X}, Basic health", "critical"),
    ("gpu_count", "health", "gpu_count", {"==": 8}, "GPUs", 8, f"{MI300X}, Basic health",
     "critical"),
    ("gpu_pcie_speed", "health", "pcie_speed.*", {">=": 32}, "GT/s", 32,
     f"{MI300X}, Basic health", "critical"),
    ("gpu_pcie_width", "health", "pcie_width.*", {">=": 16}, "lanes", 16,
     f"{MI300X}, Basic health", "critical"),
    ("memory_online", "health", "memory_gib", {">=": 1500}, "GiB", 1536.0,
     f"{MI300X}, Basic health (lsmem)", "critical"),
    ("dmesg_amdgpu_errors", "health", "dmesg_errors", {"==": 0}, "lines", 0,
     f"{MI300X}, Basic health", "critical"),
    ("idle_power", "health", "idle_power.*", {"<=": 200}, "W", 140.0,
     f"{MI300X}, Basic health (amd-smi monitor -putm)", "warning"),
    ("idle_temperature", "health", "idle_temp.*", {"<=": 60}, "C", 38.0,
     f"{MI300X}, Basic health (amd-smi monitor -putm)", "critical"),
    ("rccl_all_reduce", "performance", "rccl_busbw", {">=": 304}, "GB/s", 330.0,
     f"{MI300X}, Performance benchmarks (RCCL)", "critical"),
    ("transferbench_a2a", "performance", "a2a", {">=": 32.9}, "GB/s", 48.5,
     f"{MI300X}, Performance benchmarks (TransferBench a2a)", "critical"),
    ("rocblas_bf16", "performance", "rocblas_bf16", {">=": 130600}, "GFLOPS", 141000.0,
     f"{MI300X}, Performance benchmarks (rocBLAS BF16)", "critical"),
    ("babelstream_triad", "performance", "triad.*", {">=": 3500}, "GB/s", 4100.0,
     "the site's minimum (docs/gpus/mi300x.md publishes no BabelStream figure)", "critical"),
]  # fmt: skip
#: Per-GPU metrics that widen the matrix to G1's size (about 45 columns).
EXTRA = [f"gpu_metric_{n:02d}" for n in range(30)]
STAGES = {
    "prerequisites": {"expected": "30s"},
    "health": {"expected": "2m"},
    "performance": {"expected": "20m"},
}


def gate(folder: Path) -> dict[str, Any]:
    """The gate file's content: three stages, one measurement per stage and host."""
    checks = []
    for check_id, stage, path, rule, unit, _, source, severity in CHECKS:
        checks.append(
            _check(check_id, stage, path, rule, unit, source, severity),
        )
    for name in EXTRA:
        checks.append(_check(name, "health", f"{name}.*", {">=": 90}, "%", "simulated", "critical"))
    return {
        "gate": "fleet64",
        "title": "Simulated 64-node acceptance",
        "about": "tests/gate_fleet.py: the reports at the size of a rack.",
        "hosts": "fleet",
        "vars": {"fleet_dir": str(folder / "nodes")},
        "stages": STAGES,
        "checks": checks,
    }


def _check(
    check_id: str,
    stage: str,
    path: str,
    rule: dict[str, Any],
    unit: str | None,
    source: str,
    severity: str,
) -> dict[str, Any]:
    run = f"cat {{{{ fleet_dir }}}}/{{{{ inventory_hostname }}}}/{stage}.json"
    found = {
        "id": check_id,
        "title": check_id.replace("_", " "),
        "why": f"simulated: {check_id}",
        "measure": {"command": {"run": run, "parse": "json"}},
        "value": path,
        "rule": rule,
        "severity": severity,
        "source": source,
        "stage": stage,
    }
    if unit:
        found["unit"] = unit
    return found


def values(host: str, rng: random.Random) -> dict[str, dict[str, Any]]:
    """A node's values, by stage (healthy, with jitter; its fault when it has one)."""

    def jitter(value: Any) -> Any:
        return round(value * rng.uniform(0.99, 1.01), 2) if isinstance(value, float) else value

    stages: dict[str, dict[str, Any]] = {s: {} for s in STAGES}
    for _, stage, path, _, _, healthy, _, _ in CHECKS:
        key = path.split(".")[0]
        per_gpu = path.endswith(".*")
        stages[stage][key] = {g: jitter(healthy) for g in GPUS} if per_gpu else jitter(healthy)
    for name in EXTRA:
        stages["health"][name] = {g: jitter(99.0) for g in GPUS}
    fault = FAULTS.get(host)
    if fault == "gpu_pcie_width":
        stages["health"]["pcie_width"]["3"] = 8
    elif fault == "dmesg_amdgpu_errors":
        stages["health"]["dmesg_errors"] = 2
    elif fault == "transferbench_a2a":
        stages["performance"]["a2a"] = round(stages["performance"]["a2a"] * SLOW, 2)
    elif fault == "bios_version":
        stages["prerequisites"]["bios"] = "M1.02"
    elif fault == "idle_power":
        stages["health"]["idle_power"]["5"] = 231.0
    return stages


def write(folder: Path, seed: int = 23) -> tuple[Path, Path]:
    """The gate file, the inventory (64 local hosts) and every node's files, in ``folder``."""
    rng = random.Random(seed)
    for host in HOSTS:
        node = folder / "nodes" / host
        node.mkdir(parents=True, exist_ok=True)
        for stage, data in values(host, rng).items():
            if not (FAULTS.get(host) == "performance" and stage == "performance"):
                (node / f"{stage}.json").write_text(json.dumps(data))
    gate_file = folder / "fleet64.yml"
    gate_file.write_text(yaml.safe_dump(gate(folder), sort_keys=False))
    hosts = {host: {"ansible_connection": "local"} for host in HOSTS}
    inventory = folder / "inventory.yml"
    inventory.write_text(yaml.safe_dump({"all": {"children": {"fleet": {"hosts": hosts}}}}))
    return gate_file, inventory
