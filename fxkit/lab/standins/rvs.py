"""ROCm Validation Suite: ``rvs -c CONF``.

Prints RVS's ``[RESULT] [timestamp] ...`` lines in the formats AMD's acceptance guide shows
(ROCm/system-acceptance-docs, docs/common/system-validation.md) and ROCmValidationSuite's
modules print (gst.so/src/gst_worker.cpp, pebb.so/src/action.cpp...), for the configuration
files the profile's ``rvs.json`` knows (by ``PLATFORM/NAME.conf``, else ``NAME.conf``), one GPU
per present GPU of the profile. A variant's ``rvs.met_false`` (``{"action": A, "gpu": N}``)
makes GPU N miss the target of action A (``met: FALSE``).
"""

from __future__ import annotations

import json
import sys
from itertools import count, permutations
from pathlib import Path
from typing import Any

from .common import Profile, Tool, fail

_CLOCK = count()


def rvs(p: Profile, args: list[str], stdin: str, entry: dict[str, Any]) -> int:
    data = json.loads((p["dir"] / "rvs.json").read_text())
    gpus = [(i, data["gpu_ids"][bdf], bdf) for i, bdf in enumerate(p["gpus"]["bdfs"])]
    if "-c" not in args or args.index("-c") + 1 >= len(args):
        fail("rvs", "the lab's rvs answers -c CONF", 2)
    path = Path(args[args.index("-c") + 1])
    conf = data["confs"].get(f"{path.parent.name}/{path.name}") or data["confs"].get(path.name)
    if conf is None:
        print(f"RVS-ERROR: cannot open configuration file {path}", file=sys.stderr)
        return 1
    lines = _MODULES[conf["module"]](conf, gpus, p.get("rvs", {}))
    for line in lines:
        print(f"[RESULT] [{1101980.5 + next(_CLOCK) * 0.001:.6f}] {line}")
    return 0


def _gpup(conf: dict[str, Any], gpus: list[tuple[int, int, str]], _: dict) -> list[str]:
    out = []
    for action in conf["actions"]:
        out += [f"Action name :{action}", "Module name :gpup"]
        for _i, gpu_id, _bdf in gpus:
            out += [
                f"[{action}] gpup {gpu_id} simd_count 1216",
                f"[{action}] gpup {gpu_id} num_xcc 8",
            ]
    return out


def _gst(conf: dict[str, Any], gpus: list[tuple[int, int, str]], faults: dict) -> list[str]:
    out = []
    for action, target in conf["targets"].items():
        out += [f"Action name :{action}", "Module name :gst"]
        for i, gpu_id, _bdf in gpus:
            missed = faults.get("met_false", {}) == {"action": action, "gpu": i}
            gflops = int(target * (0.8 if missed else conf["margin"]))
            tag = f"[{action}] [GPU:: {gpu_id:5d}]"
            out += [
                f"{tag} Start of GPU ramp up",
                f"{tag} GFLOPS {gflops}",
                f"{tag} End of GPU ramp up",
                f"{tag} GFLOPS {gflops} Target GFLOPS: {target} met: "
                + ("FALSE" if missed else "TRUE"),
            ]
    return out


def _iet(conf: dict[str, Any], gpus: list[tuple[int, int, str]], _: dict) -> list[str]:
    out = []
    for action, target in conf["targets"].items():
        out += [f"Action name :{action}", "Module name :iet"]
        out += [
            f"[{action}] [GPU:: {g}] Power(W) {target * conf['margin']:.6f}" for _, g, _ in gpus
        ]
        out += [f"[{action}] [GPU:: {g}] pass: TRUE" for _, g, _ in gpus]
    return out


def _mem(conf: dict[str, Any], gpus: list[tuple[int, int, str]], _: dict) -> list[str]:
    out = []
    for action in conf["actions"]:
        out += [f"Action name :{action}", "Module name :mem"]
        for i, _gpu, _bdf in gpus:
            for test in range(1, 11):
                out += [f"[{action}] mem Test {test} : PASS"]
            bw = conf["bandwidth_gbps"][i % len(conf["bandwidth_gbps"])]
            out += [f"[{action}] mem Test 11: elapsedtime = 6390.423828 bandwidth = {bw:.6f}GB/s"]
    return out


def _pebb(conf: dict[str, Any], gpus: list[tuple[int, int, str]], _: dict) -> list[str]:
    out, cpus, bws = [], (0, 1), conf["bandwidth_gbps"]
    for action in conf["actions"]:
        out += [f"Action name :{action}", "Module name :pebb"]
        for i, gpu_id, bdf in gpus:
            for cpu in cpus:
                near = 20 if (cpu == 0) == (i < 4) else 52
                gpu = f"[GPU:: {i + 2} - {gpu_id:5d} - {bdf}]"
                out.append(
                    f"[{action}] pcie-bandwidth [CPU:: {cpu}] {gpu} distance:{near} PCIe:{near}"
                )
        total = len(gpus) * len(cpus)
        for n, ((i, gpu_id, bdf), cpu) in enumerate(((g, c) for g in gpus for c in cpus), 1):
            gpu = f"[GPU:: {i + 2} - {gpu_id:5d} - {bdf}]"
            out.append(
                f"[{action}] pcie-bandwidth [{n:2d}/{total}] [CPU:: {cpu}] {gpu} h2d::true "
                f"d2h::true {bws[n % len(bws)]:.3f} GBps duration: 1.4 secs"
            )
    return out


def _peqt(conf: dict[str, Any], gpus: list[tuple[int, int, str]], _: dict) -> list[str]:
    out = []
    for action in conf["actions"]:
        out += [f"Action name :{action}", "Module name :peqt", f"[{action}] peqt true"]
    return out


def _pbqt(conf: dict[str, Any], gpus: list[tuple[int, int, str]], _: dict) -> list[str]:
    out, bws = [], conf["bandwidth_gbps"]
    pairs = list(permutations(gpus, 2))
    for action in conf["actions"]:
        out += [f"Action name :{action}", "Module name :pbqt"]
        for (i, a, abdf), (j, b, bbdf) in pairs:
            ga, gb = f"[GPU:: {i + 2} - {a:5d} - {abdf}]", f"[GPU:: {j + 2} - {b:5d} - {bbdf}]"
            out.append(f"[{action}] p2p {ga} {gb} peers:true distance:15 xGMI:15")
        for n, ((i, a, abdf), (j, b, bbdf)) in enumerate(pairs, 1):
            ga, gb = f"[GPU:: {i + 2} - {a:5d} - {abdf}]", f"[GPU:: {j + 2} - {b:5d} - {bbdf}]"
            out.append(
                f"[{action}] p2p-bandwidth[{n:2d}/{len(pairs)}] {ga} {gb} bidirectional: false "
                f"{bws[n % len(bws)]:.3f} GBps duration: 1.462462 secs"
            )
    return out


_MODULES = {
    "gpup": _gpup,
    "gst": _gst,
    "iet": _iet,
    "mem": _mem,
    "pebb": _pebb,
    "peqt": _peqt,
    "pbqt": _pbqt,
}

TOOLS: dict[str, Tool] = {
    "rvs": rvs,
}
