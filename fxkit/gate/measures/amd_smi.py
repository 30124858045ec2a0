"""The GPUs' firmware, idle metrics and xGMI links, as amd-smi reports them (AMD's checklist and
CVS's host checks; docs/GATES.md, "G1 coverage of AMD's MI300X checklist"):

    measure: {gpu_firmware: {}}     # value: gpus.* (each GPU's ["CP_MEC1=32945", ...])
    measure: {gpu_monitor: {}}      # value: gpus.*.gfx_util_pct, gpus.*.gpu_temp_c, ...
    measure: {xgmi_links: {}}       # value: gpus.*.not_xgmi (peers not reached over xGMI)

Where amd-smi is missing the measurement says so (ERROR, never PASS).
"""

from __future__ import annotations

import json
import re
from typing import Any

from fxkit.gate.measure import MeasuredHost, MeasureError, kind
from fxkit.gate.measures.platform import NoParams, run_marked


def _gpu_records(text: str, command: str) -> list[dict[str, Any]]:
    """amd-smi's JSON: a list of per-GPU records, or ``{"gpu_data": [...]}`` (newer amd-smi)."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise MeasureError(f"`{command}` did not print JSON ({exc.msg}): {text[:80]!r}") from None
    records = data.get("gpu_data") if isinstance(data, dict) else data
    if not isinstance(records, list) or not all(isinstance(r, dict) for r in records):
        raise MeasureError(f"`{command}`: no list of GPUs in its JSON")
    return records


# -- firmware -------------------------------------------------------------------------------------


@kind("gpu_firmware", NoParams)
def gpu_firmware(node: MeasuredHost, p: NoParams) -> dict[str, Any]:
    """Each GPU's firmware versions (``amd-smi firmware --json``), as ``ID=VERSION`` words."""
    simulated, out = run_marked(node, "amd-smi firmware --json", "amd-smi firmware", tool="amd-smi")
    return {"simulated": simulated, **parse_firmware(out)}


def parse_firmware(text: str) -> dict[str, Any]:
    """``[{"gpu": 0, "fw_list": [{"fw_id": "CP_MEC1", "fw_version": "32945"}, ...]}, ...]``
    (amdsmi_cli's ``firmware --json``), or its text (``GPU: 0`` ... ``FW_ID: CP_MEC1`` /
    ``FW_VERSION: 147``): ``{"gpus": {"0": ["CP_MEC1=32945", ...]}, "count": 8}``."""
    if not text.lstrip().startswith(("[", "{")):
        return _firmware_text(text)
    gpus: dict[str, list[str]] = {}
    for record in _gpu_records(text, "amd-smi firmware --json"):
        entries = record.get("fw_list")
        if not isinstance(entries, list):  # "N/A": amd-smi could not read it
            raise MeasureError(f"amd-smi firmware: GPU {record.get('gpu')}: no firmware list")
        gpus[str(record.get("gpu"))] = [f"{e['fw_id']}={e['fw_version']}" for e in entries]
    return {"count": len(gpus), "gpus": gpus}


def _firmware_text(text: str) -> dict[str, Any]:
    gpus: dict[str, list[str]] = {}
    gpu, fw_id = None, None
    for line in text.splitlines():
        key, _, value = (part.strip() for part in line.partition(":"))
        if key == "GPU":
            gpu = gpus.setdefault(value, [])
        elif key == "FW_ID":
            fw_id = value
        elif key == "FW_VERSION" and gpu is not None and fw_id is not None:
            gpu.append(f"{fw_id}={value}")
    if not gpus:
        raise MeasureError(f"amd-smi firmware listed no GPU: {text[:120]!r}")
    return {"count": len(gpus), "gpus": gpus}


# -- monitor (idle metrics) -----------------------------------------------------------------------

#: amd-smi monitor's column names, older and newer (`GPU_TEMP` became `GPU_T`...).
MONITOR_COLUMNS = {
    "POWER": "power_w",
    "PWR_CAP": "power_cap_w",
    "GPU_TEMP": "gpu_temp_c",
    "GPU_T": "gpu_temp_c",
    "MEM_TEMP": "mem_temp_c",
    "MEM_T": "mem_temp_c",
    "GFX_CLOCK": "gfx_clock_mhz",
    "GFX_CLK": "gfx_clock_mhz",
    "GFX_UTIL": "gfx_util_pct",
    "GFX%": "gfx_util_pct",
    "MEM_UTIL": "mem_util_pct",
    "MEM%": "mem_util_pct",
    "MEM_CLOCK": "mem_clock_mhz",
    "MEM_CLK": "mem_clock_mhz",
}
_CELL = re.compile(r"N/A|-?\d+(?:\.\d+)?(?:\s*(?:W|°C|C|%|MHz|GHz))?")


@kind("gpu_monitor", NoParams)
def gpu_monitor(node: MeasuredHost, p: NoParams) -> dict[str, Any]:
    """Each GPU's power, temperatures, clocks and utilisation (``amd-smi monitor -putm``)."""
    simulated, out = run_marked(node, "amd-smi monitor -putm", "amd-smi monitor", tool="amd-smi")
    return {"simulated": simulated, **parse_monitor(out)}


def parse_monitor(text: str) -> dict[str, Any]:
    """amd-smi monitor's table: a header (``GPU  POWER  GPU_TEMP ...`` or, newer, ``GPU  XCP
    POWER  PWR_CAP  GPU_T ...``) and a row per GPU of values with units (``182 W``, ``42 °C``,
    ``N/A``). Numbers without units, N/A as None, by the names of :data:`MONITOR_COLUMNS`."""
    lines = [line for line in text.splitlines() if line.strip()]
    start = next((i for i, line in enumerate(lines) if line.split()[:1] == ["GPU"]), None)
    if start is None:
        raise MeasureError(f"amd-smi monitor printed no table (no GPU header): {text[:120]!r}")
    header = lines[start].split()
    gpus: dict[str, dict[str, Any]] = {}
    for line in lines[start + 1 :]:
        cells = _CELL.findall(line)
        if len(cells) != len(header):
            raise MeasureError(f"amd-smi monitor: {len(header)} columns, not this: {line!r}")
        row = dict(zip(header, cells, strict=True))
        gpus.setdefault(row["GPU"], {})  # several XCP rows per GPU: the first (XCP 0)
        if gpus[row["GPU"]]:
            continue
        gpus[row["GPU"]] = {
            MONITOR_COLUMNS[name]: _number(cell)
            for name, cell in row.items()
            if name in MONITOR_COLUMNS
        }
    if not gpus:
        raise MeasureError("amd-smi monitor listed no GPU")
    return {"count": len(gpus), "gpus": gpus}


def _number(cell: str) -> float | int | None:
    if cell == "N/A":
        return None
    value = float(re.match(r"-?[\d.]+", cell).group(0))  # type: ignore[union-attr]
    return int(value) if value.is_integer() else value


# -- xGMI links -----------------------------------------------------------------------------------


@kind("xgmi_links", NoParams)
def xgmi_links(node: MeasuredHost, p: NoParams) -> dict[str, Any]:
    """The peers each GPU does not reach over an enabled xGMI link (``amd-smi topology``).

    ``amd-smi topology -a -t --json``: each link's type and access; ``not_xgmi`` lists the
    others."""
    command = "amd-smi topology -a -t --json"
    simulated, out = run_marked(node, command, "amd-smi topology", tool="amd-smi")
    return {"simulated": simulated, **parse_topology(out)}


def parse_topology(text: str) -> dict[str, Any]:
    """``[{"gpu": 0, "bdf": ..., "links": [{"gpu": 1, "bdf": ..., "link_status": "ENABLED",
    "link_type": "XGMI"}, ...]}]`` (amdsmi_cli's ``topology``, its CHANGELOG's "new format")."""
    gpus: dict[str, dict[str, Any]] = {}
    for record in _gpu_records(text, "amd-smi topology -a -t --json"):
        bad = [
            f"{link.get('gpu')} ({link.get('bdf')}): {link.get('link_type')} "
            f"{link.get('link_status')}"
            for link in record.get("links", [])
            if link.get("link_type") != "SELF"
            and (link.get("link_type"), link.get("link_status")) != ("XGMI", "ENABLED")
        ]
        peers = [x for x in record.get("links", []) if x.get("link_type") != "SELF"]
        gpus[str(record.get("gpu"))] = {
            "bdf": record.get("bdf"),
            "peers": len(peers),
            "not_xgmi": bad,
        }
    return {"count": len(gpus), "gpus": gpus}
