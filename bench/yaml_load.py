"""How fast a large vars file loads: fxkit's reader beside PyYAML's pure-Python and C loaders.

    .venv/bin/python bench/yaml_load.py [--mb 54] [--runs 3] [--methods ...] [--old-fxkit DIR]

Generates a vars file of about --mb MB (a fleet description: one entry per node with its
address, GPUs, NICs, sysctl values and labels; block style with some flow mappings and a merge
key per node, as hand-written vars files have), then loads it --runs times with each method,
each run in a fresh Python process, methods interleaved. Prints the median wall and CPU seconds
and peak RSS (``ru_maxrss``) of each, and its CPU time as a ratio of the first method's.

| method | what it does |
|---|---|
| ``pyyaml`` | ``yaml.load(text, yaml.SafeLoader)``: pure Python, what fxkit's reader was built on |
| ``pyyaml-c`` | ``yaml.load(text, yaml.CSafeLoader)``: libyaml, plain dicts, no lines kept |
| ``fxkit`` | ``fxkit.varfiles.load_vars_file(path)``: the reader fxkit uses |
| ``fxkit-old`` | the same function of the fxkit in ``--old-fxkit DIR`` |

An older fxkit for ``--old-fxkit``: ``git archive COMMIT fxkit | tar -x -C DIR``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

CHILD = """
import json, resource, sys, time
from pathlib import Path
method, path = sys.argv[1], Path(sys.argv[2])
import yaml
import fxkit
from fxkit.varfiles import load_vars_file
usage = resource.getrusage(resource.RUSAGE_SELF)
cpu_start, start = usage.ru_utime + usage.ru_stime, time.perf_counter()
if method.startswith("fxkit"):
    data = load_vars_file(path)
else:
    loader = yaml.CSafeLoader if method == "pyyaml-c" else yaml.SafeLoader
    data = yaml.load(path.read_text(encoding="utf-8"), loader)
seconds = time.perf_counter() - start
usage = resource.getrusage(resource.RUSAGE_SELF)
cpu = usage.ru_utime + usage.ru_stime - cpu_start
print(json.dumps({"seconds": seconds, "cpu_s": cpu, "rss_mib": usage.ru_maxrss / 1024,
                  "fxkit": fxkit.__file__}))
"""
METHODS = ("pyyaml", "pyyaml-c", "fxkit", "fxkit-old")


def node(number: int) -> str:
    """One node's entry (about 1.3 kB of YAML)."""
    gpus = "".join(
        f'      - {{index: {g}, pci: "0000:{0x0C + g * 0x10:02x}:00.0", '
        f'serial: "PHX{number:06d}{g}", numa: {g // 4}}}\n'
        for g in range(8)
    )
    nics = "".join(
        f"      - name: ens{n}np0\n"
        f'        mac: "02:00:{number >> 16 & 255:02x}:{number >> 8 & 255:02x}:'
        f'{number & 255:02x}:{n:02x}"\n'
        f"        mtu: 9000\n"
        f"        roce: true\n"
        for n in range(4)
    )
    return (
        f"  gpu{number:06d}:\n"
        f"    <<: *node_defaults\n"
        f"    address: 10.{number >> 16 & 255}.{number >> 8 & 255}.{number & 255}\n"
        f"    rack: r{number // 32:04d}\n"
        f"    description: 'MI308X node {number}, rack r{number // 32:04d}, row {number % 7}'\n"
        f"    gpus:\n{gpus}"
        f"    nics:\n{nics}"
        f"    sysctl:\n"
        f"      vm.max_map_count: 262144\n"
        f"      kernel.numa_balancing: 0\n"
        f"      net.core.rmem_max: {16777216 + number}\n"
        f"    labels: [inference, mi308x, rack-{number // 32}, zone-{number % 3}]\n"
    )


def generate(path: Path, megabytes: float) -> int:
    """Write a vars file of about ``megabytes`` MB to ``path``; returns its number of nodes."""
    with path.open("w", encoding="utf-8") as out:
        out.write(
            "node_defaults: &node_defaults\n"
            "  os: ubuntu-24.04\n"
            "  rocm: '7.2'\n"
            "  memlock: unlimited\n"
            "fleet_nodes:\n"
        )
        count = 0
        while out.tell() < megabytes * 1e6:
            out.write(node(count))
            count += 1
    return count


def run(method: str, path: Path, old_fxkit: Path | None) -> dict[str, float]:
    env = dict(os.environ)
    if method == "fxkit-old":
        if old_fxkit is None:
            raise SystemExit("method fxkit-old needs --old-fxkit DIR")
        env["PYTHONPATH"] = str(old_fxkit.resolve())
    proc = subprocess.run(  # not in the checkout, whose fxkit/ would come before PYTHONPATH
        [sys.executable, "-c", CHILD, method, str(path)],
        capture_output=True,
        text=True,
        cwd=path.parent,
        env=env,
    )
    if proc.returncode:
        raise SystemExit(f"{method} failed:\n{proc.stderr}")
    return json.loads(proc.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mb", type=float, default=54.0, help="size of the vars file in MB")
    parser.add_argument("--runs", type=int, default=3, help="runs of each method")
    parser.add_argument(
        "--methods", default="pyyaml,pyyaml-c,fxkit", help=f"some of {','.join(METHODS)}"
    )
    parser.add_argument("--old-fxkit", type=Path, help="folder holding an older fxkit/")
    parser.add_argument("--keep", type=Path, help="write the vars file here and keep it")
    args = parser.parse_args()
    methods = args.methods.split(",")
    if unknown := set(methods) - set(METHODS):
        parser.error(f"unknown methods: {', '.join(sorted(unknown))}")
    with tempfile.TemporaryDirectory(prefix="fxkit-yaml-bench-") as tmp:
        path = (args.keep or Path(tmp) / "vars.yml").resolve()
        nodes = generate(path, args.mb)
        print(f"{path}: {path.stat().st_size / 1e6:.1f} MB, {nodes} nodes")
        results: dict[str, list[dict[str, float]]] = {m: [] for m in methods}
        for round_ in range(args.runs):
            shift = round_ % len(methods)
            for method in methods[shift:] + methods[:shift]:
                results[method].append(run(method, path, args.old_fxkit))
    base = statistics.median(r["cpu_s"] for r in results[methods[0]])
    for method, runs in results.items():
        wall = statistics.median(r["seconds"] for r in runs)
        cpu = statistics.median(r["cpu_s"] for r in runs)
        rss = statistics.median(r["rss_mib"] for r in runs)
        print(
            f"{method:9s} {wall:7.1f} s wall {cpu:7.1f} s CPU {rss:7.0f} MiB peak RSS  "
            f"CPU {cpu / base:5.2f}x {methods[0]}'s  (median of {len(runs)}; "
            f"{Path(runs[0]['fxkit']).parent})"
        )


if __name__ == "__main__":
    main()
