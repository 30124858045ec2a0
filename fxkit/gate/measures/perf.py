"""The performance benchmarks of AMD's acceptance checklist (ROCm/system-acceptance-docs,
docs/common/system-validation.md, "Performance Benchmarking"), each with a parser of its output:

    measure: {transferbench: {binary: /opt/TransferBench/TransferBench, run: a2a}}
    measure: {rocblas: {args: "-f gemm -r s -m 4000 ..."}}
    measure: {babelstream: {gpus: 8}}

- ``transferbench``: ``TransferBench a2a`` gives ``average_gbps`` (its "Average bandwidth (GPU
  Timed)"); ``p2p`` gives ``unidir_gbps`` and ``bidir_gbps`` (the GPU->GPU column of its
  "Averages (During UniDir/BiDir)" lines); a config file (``examples/example.cfg``) gives
  ``tests.N.transfers.I.gbps`` for each Transfer of each test. Formats: TransferBench.cpp
  (RunAllToAllBenchmark, RunPeerToPeerBenchmarks, ReportResults).
- ``rocblas``: ``rocblas-bench ARGS``, ``runs`` times; ``gflops`` is the best run's
  ``rocblas-Gflops`` ("use the best (stable) value after several iterations", AMD's note).
- ``babelstream``: BabelStream's ``hip-stream --device N`` on every GPU at once (AMD runs it with
  ``mpiexec -n 8`` and a wrapper that picks the device by rank); ``gpus.N.copy`` ... ``dot`` in
  MB/s, each GPU's row of "Function MBytes/sec ...".
"""

from __future__ import annotations

import re
from shlex import quote, split
from typing import Any

from pydantic import Field

from fxkit.gate.measure import MeasuredHost, MeasureError, Params, kind

# -- TransferBench --------------------------------------------------------------------------------


class TransferBenchParams(Params):
    #: ``a2a``, ``p2p``, or the path of a config file on the node (``examples/example.cfg``).
    run: str
    #: The TransferBench binary (built from ROCm/TransferBench with ``CC=hipcc make``).
    binary: str = "TransferBench"


@kind("transferbench", TransferBenchParams)
def transferbench(node: MeasuredHost, p: TransferBenchParams) -> dict[str, Any]:
    """TransferBench a2a / p2p / a config file: average, uni/bidirectional and per-test GB/s."""
    node.require(p.binary)
    if p.run not in ("a2a", "p2p") and not node.run(f"test -f {quote(p.run)}").ok:
        raise MeasureError(f"no TransferBench config file {p.run} on {node.host}")
    text = node.output(f"{quote(p.binary)} {quote(p.run)}")
    if p.run == "a2a":
        return parse_transferbench_a2a(text)
    if p.run == "p2p":
        return parse_transferbench_p2p(text)
    return parse_transferbench_tests(text)


_A2A_AVG = re.compile(r"^Average\s+bandwidth \(GPU Timed\):\s*([\d.]+)\s*GB/s", re.M)
_A2A_AGG = re.compile(r"^Aggregate bandwidth \(GPU Timed\):\s*([\d.]+)\s*GB/s", re.M)


def parse_transferbench_a2a(text: str) -> dict[str, Any]:
    """``{"average_gbps": ..., "aggregate_gbps": ...}`` of ``TransferBench a2a``."""
    average, aggregate = _A2A_AVG.search(text), _A2A_AGG.search(text)
    if average is None:
        raise MeasureError(
            f"TransferBench a2a printed no 'Average bandwidth (GPU Timed)': {text[-200:]!r}"
        )
    return {
        "average_gbps": float(average[1]),
        "aggregate_gbps": float(aggregate[1]) if aggregate else None,
    }


_P2P_HEADER = re.compile(r"^\s+((?:\s+[CG]PU->[CG]PU)+)\s*$", re.M)
_P2P_AVG = re.compile(r"^Averages \(During\s+(UniDir|BiDir)\):(.*)$", re.M)


def parse_transferbench_p2p(text: str) -> dict[str, Any]:
    """``{"unidir_gbps": ..., "bidir_gbps": ..., "averages": {"UniDir": {"GPU->GPU": ...}}}``:
    the GPU->GPU average of each direction (the columns as the header line above names them)."""
    averages: dict[str, dict[str, float | None]] = {}
    for found in _P2P_AVG.finditer(text):
        header = [h for h in _P2P_HEADER.findall(text[: found.start()])][-1:]
        columns = header[0].split() if header else ["CPU->CPU", "CPU->GPU", "GPU->CPU", "GPU->GPU"]
        values = [None if v == "N/A" else float(v) for v in found[2].split()]
        averages[found[1]] = dict(zip(columns, values, strict=False))
    if not {"UniDir", "BiDir"} <= averages.keys():
        raise MeasureError(
            f"TransferBench p2p printed no 'Averages (During UniDir/BiDir)' lines: {text[-200:]!r}"
        )
    return {
        "unidir_gbps": averages["UniDir"].get("GPU->GPU"),
        "bidir_gbps": averages["BiDir"].get("GPU->GPU"),
        "averages": averages,
    }


_TEST = re.compile(r"^Test (\d+):\s*$")
_TRANSFER = re.compile(
    r"^\s*Transfer\s+(?P<i>\d+)\s*\|\s*(?P<bw>[\d.]+)\s*GB/s\s*\|\s*(?P<ms>[\d.]+)\s*ms\s*\|"
    r"\s*(?P<bytes>\d+)\s*bytes\s*\|\s*(?P<path>.*?)\s*$"
)


def parse_transferbench_tests(text: str) -> dict[str, Any]:
    """``{"tests": {"1": {"transfers": [{"gbps": ..., "path": "G0 -> GPU00:004 -> G1"}]}}}``:
    each ``Test N:`` of a config file run and its Transfers' bandwidths."""
    tests: dict[str, dict[str, Any]] = {}
    current: dict[str, Any] | None = None
    for line in text.splitlines():
        if found := _TEST.match(line):
            current = tests.setdefault(found[1], {"transfers": []})
        elif (transfer := _TRANSFER.match(line)) and current is not None:
            current["transfers"].append(
                {
                    "gbps": float(transfer["bw"]),
                    "ms": float(transfer["ms"]),
                    "bytes": int(transfer["bytes"]),
                    "path": transfer["path"],
                }
            )
    if not any(t["transfers"] for t in tests.values()):
        raise MeasureError(f"TransferBench printed no 'Test N:' with Transfers: {text[-200:]!r}")
    return {"tests": tests}


# -- rocblas-bench --------------------------------------------------------------------------------


class RocblasParams(Params):
    #: rocblas-bench's arguments (AMD's exact ones: docs/gpus/mi300x.md).
    args: str
    binary: str = "rocblas-bench"
    #: Times to run it; the best run counts.
    runs: int = Field(default=3, gt=0)


@kind("rocblas", RocblasParams)
def rocblas(node: MeasuredHost, p: RocblasParams) -> dict[str, Any]:
    """rocblas-bench GEMM: the best run's rocblas-Gflops of several."""
    node.require(p.binary)
    command = " ".join(quote(a) for a in [p.binary, *split(p.args)])
    runs = [parse_rocblas_bench(node.output(command)) for _ in range(p.runs)]
    best = max(runs, key=lambda r: r["gflops"])
    return {**best, "runs_gflops": [r["gflops"] for r in runs]}


def parse_rocblas_bench(text: str) -> dict[str, Any]:
    """rocblas-bench's result: the CSV header line holding ``rocblas-Gflops`` and the line of
    values under it; ``{"gflops": ..., "fields": {name: value}}``."""
    lines = [line.strip() for line in text.splitlines()]
    for i, line in enumerate(lines):
        if "rocblas-Gflops" in line.split(","):
            names = line.split(",")
            values = next((v for v in lines[i + 1 :] if v), "").split(",")
            fields = dict(zip(names, (v.strip() for v in values), strict=False))
            try:
                return {"gflops": float(fields["rocblas-Gflops"]), "fields": fields}
            except (KeyError, ValueError):
                break
    raise MeasureError(f"rocblas-bench printed no rocblas-Gflops result: {text.strip()[-200:]!r}")


# -- BabelStream ----------------------------------------------------------------------------------


class BabelStreamParams(Params):
    #: BabelStream's HIP binary (built with ``-DMODEL=hip``).
    binary: str = "hip-stream"
    gpus: int = Field(default=8, gt=0)
    #: Its arguments for each GPU (AMD's wrapper.sh: ``-n 50 -s 268435456``).
    args: str = "-n 50 -s 268435456"


_MARK = "=== fxkit device "


@kind("babelstream", BabelStreamParams)
def babelstream(node: MeasuredHost, p: BabelStreamParams) -> dict[str, Any]:
    """BabelStream (hip-stream) on every GPU at once: Copy, Mul, Add, Triad, Dot in MB/s."""
    node.require(p.binary)
    one = " ".join(quote(a) for a in [p.binary, "--device", "$i", *split(p.args)]).replace(
        "'$i'", '"$i"'
    )
    script = (
        f"dir=$(mktemp -d) || exit 1; for i in $(seq 0 {p.gpus - 1}); do "
        f'{{ {one} >"$dir/$i" 2>&1; echo $? >"$dir/$i.rc"; }} & done; wait; rc=0; '
        f'for i in $(seq 0 {p.gpus - 1}); do echo "{_MARK}$i rc $(cat "$dir/$i.rc")"; '
        f'cat "$dir/$i"; [ "$(cat "$dir/$i.rc")" = 0 ] || rc=1; done; rm -rf "$dir"; exit $rc'
    )
    result = node.run(script)
    gpus: dict[str, Any] = {}
    for part in result.stdout.split(_MARK)[1:]:
        head, _, body = part.partition("\n")
        device, _, rc = head.partition(" rc ")
        if rc.strip() != "0":
            raise MeasureError(f"{p.binary} on GPU {device} exited {rc.strip()}: {body[-300:]!r}")
        gpus[device.strip()] = parse_babelstream(body)
    if len(gpus) != p.gpus:
        tail = (result.stderr or result.stdout).strip()[-300:]
        raise MeasureError(f"{p.binary} reported {len(gpus)} of {p.gpus} GPUs: {tail}")
    return {"gpus": gpus}


_FUNCTION = re.compile(r"^Function\s+(?P<unit>[MG]i?Bytes/sec)\s", re.M)
_KERNELS = ("copy", "mul", "add", "triad", "dot")


def parse_babelstream(text: str) -> dict[str, Any]:
    """One BabelStream report: ``{"copy": MB/s, "mul": ..., "dot": ..., "device": "..."}``, from
    the rows under ``Function MBytes/sec Min (sec) Max Average``."""
    header = _FUNCTION.search(text)
    if header is None:
        raise MeasureError(f"BabelStream printed no 'Function MBytes/sec' table: {text[-200:]!r}")
    if header["unit"] != "MBytes/sec":
        raise MeasureError(f"BabelStream reported {header['unit']}, not MBytes/sec")
    rows: dict[str, Any] = {}
    for line in text[header.end() :].splitlines()[1:]:
        words = line.split()
        if len(words) >= 2 and words[0].lower() in _KERNELS:
            rows[words[0].lower()] = float(words[1])
    missing = [k for k in _KERNELS if k not in rows]
    if missing:
        raise MeasureError(f"BabelStream printed no row for {', '.join(missing)}")
    device = re.search(r"^Using \S+ device (.+)$", text, re.M)
    return {**rows, "device": device[1].strip() if device else ""}
