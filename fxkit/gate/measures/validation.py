"""``rvs``: a ROCm Validation Suite run (``rvs -c CONF``), its log read line by line.

    measure: {rvs: {conf: /opt/rocm/share/rocm-validation-suite/conf/MI308X/gst_single.conf}}

RVS prints ``[RESULT] [timestamp] ...`` lines (AMD's system acceptance guide, ROCm/system-
acceptance-docs docs/common/system-validation.md, shows them for every module; the formats are
those of ROCmValidationSuite's modules, e.g. gst.so/src/gst_worker.cpp). What is read:

- ``verdicts``: one item per judgement RVS prints, True when it passed: gst's ``met: TRUE``,
  iet's ``pass: TRUE``, peqt's ``[action] peqt true``, pbqt's ``peers:true``, mem's ``Test N :
  PASS``; and every ``[ERROR]`` / ``RVS-ERROR`` line as an item that failed.
- ``gpus``, ``gpu_count``: the GPU ids the log names (``[GPU:: 28851]``, ``gpup 28851 ...``,
  ``[GPU:: 2 - 28851 - 0000:05:00.0]``); ``errors``, ``error_count``: the ERROR lines.
- ``bandwidth_gbps``: pebb's and pbqt's ``N GBps`` per transfer, mem's ``Test 11 ...
  bandwidth = N GB/s`` per GPU; ``gflops``: gst's final GFLOPS per action and GPU.
"""

from __future__ import annotations

import re
from shlex import quote
from typing import Any

from fxkit.gate.measure import MeasuredHost, MeasureError, Params, kind


class RvsParams(Params):
    #: The RVS configuration file (AMD's for the platform, e.g. conf/MI308X/gst_single.conf).
    conf: str
    #: The rvs binary (a name on PATH or a path).
    binary: str = "rvs"
    #: Run it as root (AMD runs peqt with sudo: without root its actions 6-16 fail).
    sudo: bool = False


@kind("rvs", RvsParams)
def rvs(node: MeasuredHost, p: RvsParams) -> dict[str, Any]:
    """ROCm Validation Suite's `rvs -c CONF`: each verdict (met/pass/peers), GPUs, bandwidth."""
    node.require(p.binary)
    result = node.run(f"{quote(p.binary)} -c {quote(p.conf)}", become=p.sudo or None)
    if not result.ok and not result.stdout.strip():
        tail = (result.stderr or "").strip()[-400:]
        raise MeasureError(f"rvs -c {p.conf} exited {result.rc}: {tail}")
    data = parse_rvs(result.stdout)
    return {**data, "conf": p.conf, "rc": result.rc}


_PREFIX = re.compile(r"^\s*\[(?P<level>[A-Z]+)\s*\]\s*\[\s*[\d.]+\s*\]\s?(?P<text>.*)$")
_ACTION = re.compile(r"^Action name\s*:\s*(\S+)")
_MODULE = re.compile(r"^Module name\s*:\s*(\S+)")
_TAG = re.compile(r"^\[(?P<action>[^\]]+)\]\s*(?P<rest>.*)$")
_GPU = re.compile(r"\[GPU::\s*(?:\d+\s*-\s*)?(?P<id>\d+)(?:\s*-\s*[0-9a-fA-F:.]+)?\s*\]")
_MET = re.compile(
    r"GFLOPS\s+(?P<gflops>\d+)\s+Target GFLOPS:\s*(?P<target>\d+)\s+met:\s*(?P<met>\w+)"
)
_PASS = re.compile(r"\bpass:\s*(?P<ok>\w+)", re.I)
_PEQT = re.compile(r"^peqt\s+(?P<ok>true|false)\b", re.I)
_PEERS = re.compile(r"\bpeers:\s*(?P<ok>true|false)\b", re.I)
_GBPS = re.compile(r"(?P<bw>[\d.]+)\s*GBps")
_MEM_TEST = re.compile(r"\bTest\s+(?P<n>\d+)\s*:\s*(?P<ok>PASS|FAIL)", re.I)
_MEM_BW = re.compile(r"\bTest\s+(?P<n>\d+)\s*:.*bandwidth\s*=\s*(?P<bw>[\d.]+)\s*GB/s")
_GPUP = re.compile(r"^gpup\s+(?P<id>\d+)\s")


def parse_rvs(text: str) -> dict[str, Any]:
    """RVS's log: ``{"actions": {name: module}, "verdicts": {item: bool}, "gpus": [...],
    "gpu_count": N, "bandwidth_gbps": {item: GB/s}, "gflops": {item: GFLOPS}, "errors": [...]}``."""
    actions: dict[str, str] = {}
    verdicts: dict[str, bool] = {}
    bandwidth: dict[str, float] = {}
    gflops: dict[str, float] = {}
    gpus: set[str] = set()
    errors: list[str] = []
    current = ""
    for raw in text.splitlines():
        line = _PREFIX.match(raw)
        if not line:
            if "RVS-ERROR" in raw:
                errors.append(raw.strip())
            continue
        body = line["text"].strip()
        if line["level"].startswith("ERR") or "RVS-ERROR" in body:
            errors.append(body)
            continue
        if found := _ACTION.match(body):
            current = found[1]
            actions.setdefault(current, "")
            continue
        if found := _MODULE.match(body):
            actions[current] = found[1]
            continue
        tag = _TAG.match(body)
        action, rest = (tag["action"], tag["rest"]) if tag else (current, body)
        ids = [m["id"] for m in _GPU.finditer(rest)]
        if gpup := _GPUP.match(rest):
            ids = [gpup["id"]]
        gpus.update(ids)
        _judge(action, rest, ids, verdicts, bandwidth, gflops)
    for n, error in enumerate(errors, 1):
        verdicts[f"error {n}: {error[:100]}"] = False
    if not (actions or verdicts or bandwidth or gpus):
        raise MeasureError(f"rvs printed no action and no result: {text.strip()[-200:]!r}")
    return {
        "actions": actions,
        "verdicts": verdicts,
        "all_passed": bool(verdicts) and all(verdicts.values()),
        "gpus": sorted(gpus, key=int),
        "gpu_count": len(gpus),
        "bandwidth_gbps": bandwidth,
        "min_bandwidth_gbps": min(bandwidth.values()) if bandwidth else None,
        "gflops": gflops,
        "errors": errors,
        "error_count": len(errors),
    }


def _judge(
    action: str,
    rest: str,
    ids: list[str],
    verdicts: dict[str, bool],
    bandwidth: dict[str, float],
    gflops: dict[str, float],
) -> None:
    """Record what one result line says (a verdict, a bandwidth, a GFLOPS figure)."""
    pair = " -> ".join(ids)
    if met := _MET.search(rest):
        verdicts[f"{action} GPU {pair}"] = met["met"].upper() == "TRUE"
        gflops[f"{action} GPU {pair}"] = float(met["gflops"])
    elif (passed := _PASS.search(rest)) and ids:
        verdicts[f"{action} GPU {pair}"] = passed["ok"].upper() == "TRUE"
    elif peqt := _PEQT.match(rest):
        verdicts[action] = peqt["ok"].lower() == "true"
    elif peers := _PEERS.search(rest):
        verdicts[f"{action} GPU {pair}"] = peers["ok"].lower() == "true"
    elif mem_bw := _MEM_BW.search(rest):
        count = sum(1 for k in bandwidth if k.startswith(f"{action} test {mem_bw['n']} #"))
        bandwidth[f"{action} test {mem_bw['n']} #{count + 1}"] = float(mem_bw["bw"])
    elif mem := _MEM_TEST.search(rest):
        count = sum(1 for k in verdicts if k.startswith(f"{action} test {mem['n']} #"))
        verdicts[f"{action} test {mem['n']} #{count + 1}"] = mem["ok"].upper() == "PASS"
    elif (gbps := _GBPS.search(rest)) and ids:
        cpu = re.search(r"\[CPU::\s*(\d+)\]", rest)
        source = f"CPU {cpu[1]} -> " if cpu else ""
        bandwidth[f"{action} {source}GPU {pair}"] = float(gbps["bw"])
