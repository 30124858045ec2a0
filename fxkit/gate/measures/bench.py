"""Benchmarks a check can run on a host, each with a parser of the tool's real output:

    measure: {fio: {target: /mnt/models/.fxkit-g1.fio, size: 4G, runtime: 30}}
    measure: {rccl: {gpus: 8, max_bytes: 16G}}

- ``fio``: sequential read, 1 MiB blocks, queue depth 32, O_DIRECT, libaio (the G1 storage
  test), on a file or a block device (the NVMe-oF namespace). A file that is not there is made
  by fio (``size``) and removed afterwards; an existing file or device is only read, never grown
  or removed. Gives
  ``read_gbps`` (GB/s, decimal), ``iops``, ``clat_mean_ms``, ``clat_p99_ms``.
- perftest's ``ib_write_bw`` report is read here (:func:`parse_ib_write_bw`); the kinds that
  run it are in :mod:`fxkit.gate.measures.fabric`.
- ``rccl``: rccl-tests' ``all_reduce_perf`` on one node's GPUs; gives ``avg_busbw_gbps`` (its
  "Avg bus bandwidth", GB/s), ``busbw_gbps`` and ``in_place_busbw_gbps`` at message ``size``
  (null: the largest size printed) and every size's row.
"""

from __future__ import annotations

import json
import re
from shlex import quote
from typing import Any

from pydantic import Field

from fxkit.gate.measure import MeasuredHost, MeasureError, Params, kind

# -- fio ------------------------------------------------------------------------------------------


class FioParams(Params):
    #: A file (made when missing, removed afterwards) or a block device to read.
    target: str
    #: The size of the file fio makes (4G, 512M); an existing file or device is read as it is.
    size: str = "4G"
    #: Seconds to keep reading (time-based: the size is read again until then).
    runtime: int = Field(default=30, gt=0)
    block_size: str = "1M"
    iodepth: int = Field(default=32, gt=0)
    direct: bool = True
    ioengine: str = "libaio"


@kind("fio", FioParams)
def fio(node: MeasuredHost, p: FioParams) -> dict[str, Any]:
    """fio sequential read of a file or device: GB/s, IOPS, completion latency (mean, p99)."""
    node.require("fio")
    if p.target.startswith("/dev/") and not node.run(f"test -b {quote(p.target)}").ok:
        raise MeasureError(f"no block device {p.target} on {node.host}")
    folder = p.target.rsplit("/", 1)[0] or "/"
    if not node.run(f"test -d {quote(folder)}").ok:
        raise MeasureError(f"no folder {folder} on {node.host} for the fio file {p.target}")
    argv = [
        "fio",
        "--name=fxkit-seqread",
        f"--filename={p.target}",
        "--rw=read",
        f"--bs={p.block_size}",
        f"--iodepth={p.iodepth}",
        f"--direct={int(p.direct)}",
        f"--ioengine={p.ioengine}",
        f"--runtime={p.runtime}",
        "--time_based",
        "--numjobs=1",
        "--output-format=json",
    ]
    target = quote(p.target)
    size = quote(f"--size={p.size}")  # only for a file fio makes: an existing one is not grown
    script = (
        f"made=0; size=; [ -e {target} ] || {{ made=1; size={size}; }}; "
        f"{' '.join(quote(a) for a in argv)} $size; rc=$?; "
        f'[ "$made" = 0 ] || rm -f -- {target}; echo "made=$made"; exit $rc'
    )
    result = node.run(script, timeout=p.runtime + 600)
    out, _, made = result.stdout.rpartition("made=")
    if not result.ok:
        tail = (result.stderr or out).strip()[-400:]
        raise MeasureError(f"fio exited {result.rc} reading {p.target}: {tail}")
    data = parse_fio(out)
    return {**data, "target": p.target, "created": made.strip() == "1"}


def parse_fio(text: str) -> dict[str, Any]:
    """fio's ``--output-format=json`` (after any lines fio prints before it): the first job's
    read side. bw_bytes is bytes/s; clat_ns/lat_ns in nanoseconds, percentiles keyed
    ``"99.000000"``."""
    start = text.find("{")
    try:
        data: dict[str, Any] = json.loads(text[start:] if start >= 0 else text)
        job = data["jobs"][0]
        read = job["read"]
        clat = read["clat_ns"]
        if job.get("error"):
            raise MeasureError(f"fio job failed with error {job['error']}")
        if not read["io_bytes"]:
            raise MeasureError("fio read nothing (io_bytes 0)")
        p99 = (clat.get("percentile") or {}).get("99.000000")
        return {
            "read_gbps": round(read["bw_bytes"] / 1e9, 4),
            "iops": round(float(read["iops"]), 1),
            "clat_mean_ms": round(clat["mean"] / 1e6, 4),
            "clat_p99_ms": round(p99 / 1e6, 4) if p99 is not None else None,
            "lat_mean_ms": round(read["lat_ns"]["mean"] / 1e6, 4),
            "io_bytes": read["io_bytes"],
            "runtime_s": round(read["runtime"] / 1000, 3),
            "fio_version": data.get("fio version", ""),
        }
    except (ValueError, KeyError, IndexError, TypeError) as exc:
        raise MeasureError(
            f"fio did not print the JSON of a read job ({exc!r}): {text.strip()[:120]!r}"
        ) from None


# -- perftest (the kinds that run it: fxkit.gate.measures.fabric) --------------------------------


#: ``Mtu             : 4096[B]``, two to a line (``Dual-port : OFF    Device : mlx5_0``).
_SETTING = re.compile(r"(?:^|\s{2,}|\t)\s*([A-Za-z][\w.*/ -]*?)\s*:\s*(\S+)", re.M)
_PERF_HEADER = re.compile(r"#bytes\s+#iterations\s+BW peak\[(?P<unit>[^\]]+)\]\s+BW average")


def parse_ib_write_bw(text: str) -> dict[str, Any]:
    """perftest's bandwidth report: the settings block (``Link type``, ``Mtu``, ``Number of
    qps``, ``GID index``) and the rows after ``#bytes #iterations BW peak[Gb/sec] BW
    average[Gb/sec] MsgRate[Mpps]`` (Gb/s with --report_gbits, else MB/sec)."""
    header = _PERF_HEADER.search(text)
    if not header:
        raise MeasureError(f"ib_write_bw printed no bandwidth table: {text.strip()[-200:]!r}")
    settings: dict[str, str] = {}
    for key, value in _SETTING.findall(text[: header.start()]):
        settings.setdefault(key.strip(), value)
    unit = header["unit"]
    if unit != "Gb/sec":
        raise MeasureError(f"ib_write_bw reported {unit}, not Gb/sec (run it with --report_gbits)")
    rows: list[dict[str, Any]] = []
    for line in text[header.end() :].splitlines()[1:]:
        words = line.split()
        if not words or line.lstrip().startswith("-"):
            if rows:
                break
            continue
        if not words[0].isdigit():  # a warning between rows ("Conflicting CPU frequency ...")
            continue
        try:
            rows.append(
                {
                    "bytes": int(words[0]),
                    "iterations": int(words[1]),
                    "bw_peak": float(words[2]),
                    "bw_average": float(words[3]),
                    "msg_rate_mpps": float(words[4]) if len(words) > 4 else None,
                }
            )
        except (ValueError, IndexError):
            raise MeasureError(f"ib_write_bw: cannot read the row {line.strip()!r}") from None
    if not rows:
        raise MeasureError("ib_write_bw printed a table without rows")
    return {
        "unit": "Gb/s",
        "link_type": settings.get("Link type", ""),
        "mtu": settings.get("Mtu", ""),
        "qps": int(settings["Number of qps"])
        if settings.get("Number of qps", "").isdigit()
        else None,
        "device": settings.get("Device", ""),
        "rows": rows,
    }


# -- rccl-tests all_reduce_perf -------------------------------------------------------------------


class RcclParams(Params):
    #: The rccl-tests binary (a name on PATH or a path).
    binary: str = "all_reduce_perf"
    gpus: int = Field(default=8, gt=0)
    min_bytes: str = "1K"
    max_bytes: str = "16G"
    step_factor: int = Field(default=2, gt=1)
    iterations: int = Field(default=20, gt=0)
    warmup: int = Field(default=5, ge=0)
    #: The message size (bytes) whose bus bandwidth ``busbw_gbps`` (out of place) and
    #: ``in_place_busbw_gbps`` are; null: the largest size printed (the ``-e`` size).
    size: int | None = Field(default=8589934592, gt=0)


def all_reduce_argv(p: RcclParams, gpus: int) -> list[Any]:
    """all_reduce_perf's arguments, ``gpus`` per process (-g: all on one node, 1 under mpirun)."""
    return [
        p.binary, "-b", p.min_bytes, "-e", p.max_bytes, "-f", p.step_factor, "-g", gpus,
        "-n", p.iterations, "-w", p.warmup,
    ]  # fmt: skip


def all_reduce_result(text: str, p: RcclParams) -> dict[str, Any]:
    """all_reduce_perf's output read, with the bus bandwidths at ``p.size``."""
    data = parse_all_reduce(text)
    size = p.size if p.size is not None else max(int(s) for s in data["sizes"])
    row = data["sizes"].get(str(size))
    if row is None:
        raise MeasureError(f"all_reduce_perf printed no row for {size} bytes (-e {p.max_bytes})")
    return {
        **data,
        "busbw_gbps": row["busbw"],
        "in_place_busbw_gbps": row["in_place_busbw"],
        "size": size,
    }


@kind("rccl", RcclParams)
def rccl(node: MeasuredHost, p: RcclParams) -> dict[str, Any]:
    """rccl-tests all_reduce_perf on the node's GPUs: average and per-size bus bandwidth."""
    node.require(p.binary)
    out = node.output(" ".join(quote(str(a)) for a in all_reduce_argv(p, p.gpus)))
    return all_reduce_result(out, p)


_ROW = re.compile(
    r"^\s*(?P<size>\d+)\s+(?P<count>\d+)\s+(?P<type>\w+)\s+(?P<redop>\w+)\s+(?P<root>-?\d+)"
    r"\s+(?P<time>[\d.]+)\s+(?P<algbw>[\d.]+)\s+(?P<busbw>[\d.]+)\s+(?P<wrong>\S+)"
    r"\s+(?P<ip_time>[\d.]+)\s+(?P<ip_algbw>[\d.]+)\s+(?P<ip_busbw>[\d.]+)\s+(?P<ip_wrong>\S+)\s*$",
    re.M,
)
_AVG = re.compile(r"^#\s*Avg bus bandwidth\s*:\s*([\d.]+)", re.M)


def parse_all_reduce(text: str) -> dict[str, Any]:
    """rccl-tests' table (size, count, type, redop, root, then time/algbw/busbw/#wrong out of
    place and in place; bandwidths in GB/s) and its ``# Avg bus bandwidth`` line."""
    sizes = {}
    for m in _ROW.finditer(text):
        wrong = [m["wrong"], m["ip_wrong"]]
        sizes[m["size"]] = {
            "time_us": float(m["time"]),
            "algbw": float(m["algbw"]),
            "busbw": float(m["busbw"]),
            "in_place_busbw": float(m["ip_busbw"]),
            "wrong": sum(int(w) for w in wrong if w.isdigit()),
        }
        if not all(w.isdigit() for w in wrong):
            sizes[m["size"]]["wrong"] = -1  # "N/A": not checked
    average = _AVG.search(text)
    if not sizes or average is None:
        raise MeasureError(
            "all_reduce_perf printed no result table or no '# Avg bus bandwidth' line: "
            f"{text.strip()[-200:]!r}"
        )
    version = re.search(r"^RCCL version\s*:\s*(\S+)", text, re.M)
    return {
        "avg_busbw_gbps": float(average[1]),
        "max_busbw_gbps": max(r["busbw"] for r in sizes.values()),
        "errors": sum(r["wrong"] for r in sizes.values() if r["wrong"] > 0),
        "rccl_version": version[1] if version else "",
        "sizes": sizes,
    }
