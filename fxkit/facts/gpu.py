"""AMD GPUs, as ROCm's tools report them: ``amd-smi``, ``rocm-smi`` and ``rocminfo``.

Each tool has a fact of its own (:class:`AmdSmiStatic`, :class:`AmdSmiList`, :class:`RocmSmi`,
:class:`RocmInfo`); :class:`Gpus` asks them in turn, in one command, and keeps the first that
answers. All give a :class:`GpuInventory`: the GPUs, the command they came from, whether the
host is a simulated lab host (``/etc/fxkit-lab/host.json`` names a profile, read in the same
command), and ``missing``, which says plainly why there is no answer (no tool, the tool failed,
no GPU), so a role can gate its hardware steps with ``host.needs()``.

Formats, as the tools print them:

- ``amd-smi static --json`` / ``amd-smi list --json``: a list of ``{"gpu": N, ...}``, wrapped in
  ``{"gpu_data": [...]}`` by newer versions. ``asic.market_name``, ``asic.device_id``,
  ``asic.target_graphics_version``, ``vram.size`` (``{"value": N, "unit": "MB"}``, or ``"N MB"``;
  amd-smi's MB are MiB: the library divides the byte count by 1024 * 1024), ``driver.version``,
  ``bus.bdf``; list: ``bdf``, ``uuid``. ``"N/A"`` means unknown.
- ``rocm-smi --showproductname --json`` / ``--showmeminfo vram --json``: ``{"card0": {"Card
  Series": ..., "Card Model": "0x74a1", "GFX Version": "gfx942", ...}}`` (older versions write
  ``Card series``), ``"VRAM Total Memory (B)"`` as a decimal string.
- ``rocminfo``: one ``Agent N`` block per HSA agent; GPUs have ``Device Type: GPU``,
  ``Marketing Name``, ``Name`` (the gfx target), ``Chip ID: 29857(0x74a1)`` and memory pools
  (the first ``GLOBAL; FLAGS: COARSE GRAINED`` pool is the VRAM, in KB).

PCI device ids of Instinct parts are libdrm's ``data/amdgpu.ids``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from shlex import quote
from typing import Any

from fxkit.connection.base import RunResult
from fxkit.facts.base import Fact, FactError
from fxkit.facts.lab import marked, split_marked

#: Instinct PCI device ids and their marketing names (libdrm data/amdgpu.ids).
INSTINCT_IDS = {
    0x74A0: "AMD Instinct MI300A",
    0x74A1: "AMD Instinct MI300X",
    0x74A2: "AMD Instinct MI308X",
    0x74A5: "AMD Instinct MI325X",
    0x74A8: "AMD Instinct MI308X HF",
    0x74A9: "AMD Instinct MI300X HF",
    0x74B5: "AMD Instinct MI300X VF",
    0x74B6: "AMD Instinct MI308X",
    0x74BD: "AMD Instinct MI300X HF",
}
MI308X_IDS = frozenset({0x74A2, 0x74B6, 0x74A8})

#: amd-smi's units are binary: its "MB" is the byte count divided by 1024 * 1024.
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
_SIZE = re.compile(r"(\d+)\s*([KMGT]?)i?B", re.I)


@dataclass(frozen=True)
class Gpu:
    """One GPU; an empty string or None is what the tool did not say."""

    index: int
    market_name: str = ""
    device_id: int | None = None
    gfx_target: str = ""
    vram_bytes: int | None = None
    driver_version: str = ""
    bdf: str = ""
    uuid: str = ""

    @property
    def device_id_hex(self) -> str:
        return f"0x{self.device_id:04x}" if self.device_id is not None else ""

    @property
    def name(self) -> str:
        """The market name, or the name its device id has in libdrm's list."""
        return self.market_name or INSTINCT_IDS.get(self.device_id or -1, "")

    @property
    def vram_gib(self) -> float | None:
        return self.vram_bytes / (1 << 30) if self.vram_bytes is not None else None

    def is_model(self, model: str) -> bool:
        """Whether the market name, or the device id's name, has ``model`` as a word
        (``MI308X`` is the MI308X and the MI308X HF, not the MI300X)."""
        word = re.compile(rf"(?<![A-Za-z0-9]){re.escape(model)}(?![A-Za-z0-9])", re.I)
        names = (self.market_name, INSTINCT_IDS.get(self.device_id or -1, ""))
        return any(word.search(name) for name in names)

    @property
    def is_mi308x(self) -> bool:
        return self.device_id in MI308X_IDS or self.is_model("MI308X")

    def describe(self) -> str:
        """``AMD Instinct MI308X (0x74a2), 192 GiB``."""
        vram = f", {self.vram_gib:.0f} GiB" if self.vram_gib is not None else ""
        ident = f" ({self.device_id_hex})" if self.device_id is not None else ""
        return f"{self.name or 'unknown GPU'}{ident}{vram}"


@dataclass(frozen=True)
class GpuInventory:
    gpus: tuple[Gpu, ...] = ()
    #: The command(s) the GPUs were read from.
    source: str = ""
    #: True on a lab host with a simulated hardware profile: the tools are stand-ins.
    simulated: bool = False
    #: Why there is no answer (no tool, the tool failed, no GPU); empty when GPUs were read.
    missing: str = ""

    @property
    def count(self) -> int:
        return len(self.gpus)


# -- parsers: one tool's stdout -> its GPUs --------------------------------------------------


def _json(text: str, command: str) -> Any:
    if not text.strip():
        raise FactError(f"`{command}` printed nothing")
    try:
        return json.loads(text)
    except ValueError as exc:
        raise FactError(
            f"`{command}` did not print JSON ({exc}); it printed: {text.strip()[:80]!r}"
        ) from None


def _known(value: object) -> str:
    """A field's text; "" for a missing one or amd-smi's ``N/A``."""
    if value is None or (isinstance(value, str) and value.strip().upper() in ("", "N/A")):
        return ""
    return str(value).strip()


def _device_id(value: object, command: str) -> int | None:
    """``0x74a1``, ``29857`` or ``29857(0x74a1)``; None when unknown."""
    text = _known(value)
    if not text:
        return None
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    hexa = re.search(r"0x([0-9a-f]+)", text, re.I)
    if hexa:
        return int(hexa[1], 16)
    if text.isdigit():
        return int(text)
    raise FactError(f"`{command}`: bad device id {text!r}")


def _size(value: object, command: str) -> int | None:
    """amd-smi's ``vram.size`` in bytes: ``{"value": N, "unit": "MB"}``, ``"N MB"``, or N (MB)."""
    if isinstance(value, dict):
        number, unit = value.get("value"), _known(value.get("unit")) or "MB"
        if not _known(number):
            return None
        value = f"{number} {unit}"
    if isinstance(value, int) and not isinstance(value, bool):
        return value << 20
    text = _known(value)
    if not text:
        return None
    match = _SIZE.fullmatch(text)
    if match is None:
        raise FactError(f"`{command}`: bad VRAM size {value!r}", hint="want e.g. 196592 MB")
    return int(match[1]) * _UNITS[match[2].upper()]


def _entries(data: Any, command: str) -> list[dict[str, Any]]:
    """amd-smi's per-GPU objects: a bare list, or ``{"gpu_data": [...]}``."""
    if isinstance(data, dict) and "gpu_data" in data:
        data = data["gpu_data"]
    if not isinstance(data, list) or not all(isinstance(e, dict) for e in data):
        raise FactError(
            f"`{command}` printed JSON of another shape: want a list of GPU objects, "
            'or {"gpu_data": [...]}'
        )
    return data


def _section(entry: dict[str, Any], name: str, command: str) -> dict[str, Any]:
    section = entry.get(name, {})
    if section is None or section == "N/A":  # a section the GPU does not support
        return {}
    if not isinstance(section, dict):
        raise FactError(f"`{command}`: {name} of GPU {entry.get('gpu')} is not an object")
    return section


def _index(entry: dict[str, Any], position: int, command: str) -> int:
    index = entry.get("gpu", position)
    if isinstance(index, bool) or not isinstance(index, int | str) or not str(index).isdigit():
        raise FactError(f"`{command}`: bad GPU index {index!r}")
    return int(index)


def parse_amd_smi_static(text: str, command: str = "amd-smi static --json") -> tuple[Gpu, ...]:
    gpus: list[Gpu] = []
    for position, entry in enumerate(_entries(_json(text, command), command)):
        asic = _section(entry, "asic", command)
        gpus.append(
            Gpu(
                index=_index(entry, position, command),
                market_name=_known(asic.get("market_name")),
                device_id=_device_id(asic.get("device_id"), command),
                gfx_target=_known(asic.get("target_graphics_version")),
                vram_bytes=_size(_section(entry, "vram", command).get("size"), command),
                driver_version=_known(_section(entry, "driver", command).get("version")),
                bdf=_known(_section(entry, "bus", command).get("bdf")),
            )
        )
    return tuple(gpus)


def parse_amd_smi_list(text: str, command: str = "amd-smi list --json") -> tuple[Gpu, ...]:
    return tuple(
        Gpu(
            index=_index(entry, position, command),
            bdf=_known(entry.get("bdf")),
            uuid=_known(entry.get("uuid")),
        )
        for position, entry in enumerate(_entries(_json(text, command), command))
    )


def _cards(text: str, command: str) -> dict[int, dict[str, str]]:
    """rocm-smi's ``{"card0": {...}}``, keyed by card number, field names in lower case;
    other keys (``system``) are left out."""
    data = _json(text, command)
    if not isinstance(data, dict):
        raise FactError(f'`{command}` printed JSON of another shape: want {{"card0": {{...}}}}')
    cards = {}
    for key, fields in data.items():
        number = re.fullmatch(r"card(\d+)", key)
        if number is None:
            continue
        if not isinstance(fields, dict):
            raise FactError(f"`{command}`: {key} is not an object")
        cards[int(number[1])] = {k.lower(): str(v) for k, v in fields.items()}
    return cards


def parse_rocm_smi(
    product_text: str,
    meminfo_text: str | None = None,
    commands: tuple[str, str] = (
        "rocm-smi --showproductname --json",
        "rocm-smi --showmeminfo vram --json",
    ),
) -> tuple[Gpu, ...]:
    products = _cards(product_text, commands[0])
    memory = _cards(meminfo_text, commands[1]) if meminfo_text is not None else {}
    gpus: list[Gpu] = []
    for card, fields in sorted(products.items()):
        total = _known(memory.get(card, {}).get("vram total memory (b)"))
        if total and not total.isdigit():
            raise FactError(f"`{commands[1]}`: bad VRAM total {total!r} for card{card}")
        model = _known(fields.get("card model"))
        gpus.append(
            Gpu(
                index=card,
                market_name=_known(fields.get("card series")),
                device_id=_device_id(model, commands[0]) if model.startswith("0x") else None,
                gfx_target=_known(fields.get("gfx version")),
                vram_bytes=int(total) if total else None,
            )
        )
    return tuple(gpus)


def _agents(text: str) -> Iterator[dict[str, Any]]:
    """rocminfo's agents: their top-level ``Key: value`` fields, and ``pools`` (each a dict)."""
    blocks = re.split(r"^\*+\s*\nAgent \d+\s*\n\*+\s*$", text, flags=re.M)[1:]
    for block in blocks:
        agent: dict[str, Any] = {"pools": []}
        for line in block.splitlines():
            key, sep, value = (part.strip() for part in line.partition(":"))
            depth = len(line) - len(line.lstrip())
            if re.fullmatch(r"Pool \d+", key) and not sep:
                agent["pools"].append({})
            elif key == "ISA Info":
                agent["isa"] = True  # its Name: lines are not the agent's
            elif sep and depth == 2:
                agent.setdefault(key, value)
            elif sep and depth == 6 and agent["pools"] and "isa" not in agent:
                agent["pools"][-1].setdefault(key, value)
        yield agent


def parse_rocminfo(text: str, command: str = "rocminfo") -> tuple[Gpu, ...]:
    if not text.strip():
        raise FactError(f"`{command}` printed nothing")
    if "HSA Agents" not in text:
        raise FactError(
            f"`{command}` printed no HSA agents; it printed: {text.strip()[:80]!r}",
            hint="is the amdgpu driver loaded (ROCk module)?",
        )
    gpus: list[Gpu] = []
    for agent in _agents(text):
        if agent.get("Device Type") != "GPU":
            continue
        vram = next(
            (p.get("Size", "") for p in agent["pools"] if "COARSE GRAINED" in p.get("Segment", "")),
            "",
        )
        size = re.match(r"(\d+)\(0x[0-9a-f]+\)\s*KB", vram, re.I)
        if vram and size is None:
            raise FactError(f"`{command}`: bad pool size {vram!r}")
        gpus.append(
            Gpu(
                index=len(gpus),
                market_name=_known(agent.get("Marketing Name")),
                device_id=_device_id(agent.get("Chip ID"), command),
                gfx_target=_known(agent.get("Name")),
                vram_bytes=int(size[1]) << 10 if size else None,
            )
        )
    return tuple(gpus)


# -- the facts -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Tool:
    """A tool to ask: its executable, its commands (run in turn, each must succeed) and how
    their outputs become GPUs."""

    executable: str
    commands: tuple[str, ...]
    parse: Callable[..., tuple[Gpu, ...]]

    @property
    def source(self) -> str:
        return " and ".join(self.commands)


AMD_SMI_STATIC = Tool("amd-smi", ("amd-smi static --json",), parse_amd_smi_static)
AMD_SMI_LIST = Tool("amd-smi", ("amd-smi list --json",), parse_amd_smi_list)
ROCM_SMI = Tool(
    "rocm-smi",
    ("rocm-smi --showproductname --json", "rocm-smi --showmeminfo vram --json"),
    parse_rocm_smi,
)
ROCMINFO = Tool("rocminfo", ("rocminfo",), parse_rocminfo)

#: The lines the command frames the outputs with.
_MARK = "@fxkit-gpu"


def tools_command(tools: tuple[Tool, ...]) -> str:
    """One shell command: the lab marker, then each tool in turn until one answers (all of its
    commands exit 0). Each output is framed by marker lines, with its exit code and, when it
    failed, the end of its stderr."""
    lines = [
        "e=$(mktemp) || exit 1",
        "trap 'rm -f \"$e\"' EXIT",
        f'run() {{ printf \'{_MARK} out %s\\n\' "$*"; "$@" 2>"$e"; r=$?; '
        f"printf '\\n{_MARK} rc %s\\n' \"$r\"; "
        f'[ "$r" = 0 ] || {{ tail -c 300 "$e"; printf \'\\n{_MARK} end\\n\'; }}; return "$r"; }}',
    ]
    for tool in tools:
        runs = " && ".join(f"run {cmd}" for cmd in tool.commands)
        lines.append(
            f"if command -v {quote(tool.executable)} >/dev/null 2>&1; "
            f"then {runs} && exit 0; "
            f"else printf '{_MARK} absent %s\\n' {quote(tool.executable)}; fi"
        )
    lines.append("exit 0")
    return marked("\n".join(lines))


@dataclass
class _Output:
    command: str
    text: str = ""
    rc: int | None = None
    error: str = ""


def _split(stdout: str) -> tuple[list[str], list[_Output]]:
    """The tools' output: the absent tools, each command's output."""
    absent: list[str] = []
    outputs: list[_Output] = []
    into: list[str] | None = None
    for line in stdout.splitlines():
        if not line.startswith(f"{_MARK} "):
            if into is not None:
                into.append(line)
            continue
        kind, _, rest = line[len(_MARK) + 1 :].partition(" ")
        if kind == "absent":
            absent.append(rest)
            into = None
        elif kind == "out":
            outputs.append(_Output(rest))
            into = []
        elif kind == "rc" and outputs:
            outputs[-1].text = "\n".join(into or [])
            outputs[-1].rc = int(rest) if rest.isdigit() else -1
            into = []
        elif kind == "end":
            if outputs and into is not None and outputs[-1].rc is not None:
                outputs[-1].error = "\n".join(into).strip()
            into = None
    return absent, outputs


class GpuFact(Fact[GpuInventory]):
    """Asks :attr:`tools` in turn (see :func:`tools_command`); subclasses name the tools."""

    tools: tuple[Tool, ...] = ()

    def command(self) -> str:
        return tools_command(self.tools)

    def parse(self, result: RunResult) -> GpuInventory:
        if not result.ok:
            raise FactError.from_result("GPUs", result)
        lab, out = split_marked(result, "GPUs")
        simulated = lab.simulated
        absent, outputs = _split(out)
        by_command = {o.command: o for o in outputs}
        reasons = []
        for tool in self.tools:
            if tool.executable in absent:
                continue
            runs = [by_command.get(cmd) for cmd in tool.commands]
            if all(r is not None and r.rc == 0 for r in runs):
                gpus = tool.parse(*(r.text for r in runs if r is not None))
                missing = "" if gpus else f"`{tool.source}` lists no GPU"
                return GpuInventory(gpus, tool.source, simulated, missing)
            failed = next((r for r in runs if r is not None and r.rc != 0), None)
            if failed is not None:
                said = (failed.error or failed.text).strip().splitlines()
                why = said[-1].strip() if said else "no message"
                reasons.append(f"`{failed.command}` exited {failed.rc}: {why}")
        if not reasons:
            names = ", ".join(dict.fromkeys(t.executable for t in self.tools))
            return GpuInventory(simulated=simulated, missing=f"no GPU tool found ({names})")
        return GpuInventory(simulated=simulated, missing="; ".join(reasons))


class Gpus(GpuFact):
    """The host's GPUs from the first tool that answers: ``amd-smi static --json``, then
    ``rocm-smi`` (product name and VRAM), then ``rocminfo``::

        gpus = host.fact(Gpus)
        if host.needs(gpus.count, "verify GPUs", gpus.missing):
            ...
    """

    tools = (AMD_SMI_STATIC, ROCM_SMI, ROCMINFO)


class AmdSmiStatic(GpuFact):
    """``amd-smi static --json``: names, device ids, gfx targets, VRAM, driver versions."""

    tools = (AMD_SMI_STATIC,)


class AmdSmiList(GpuFact):
    """``amd-smi list --json``: each GPU's PCI address and UUID."""

    tools = (AMD_SMI_LIST,)


class RocmSmi(GpuFact):
    """``rocm-smi --showproductname --json`` and ``--showmeminfo vram --json``."""

    tools = (ROCM_SMI,)


class RocmInfo(GpuFact):
    """``rocminfo``: the GPU agents of the ROCm runtime."""

    tools = (ROCMINFO,)
