"""NIC firmware (NVM) settings: ConnectX through ``mlxconfig -e -d DEV query`` (NVIDIA MFT, or
``mstconfig`` of mstflint), Broadcom Thor2 through ``niccli -dev=IF getoption -name NAME``.

``mlxconfig`` prints, per Mellanox/mstflint mlxconfig/mlxcfg_ui.cpp at b9d9e844
(``printOpening``, ``printConfHeader``, ``printSingleParam``)::

    Configurations:                                      Default   Current   Next Boot
    *        PCI_WR_ORDERING                             per_mkey(0) per_mkey(0) force_relax(1)

one column per configuration it can read (``-e`` adds Default and Current where the firmware
supports them), a value as ``TEXT(N)`` or a bare number, ``*`` before a parameter whose next
value differs, ``RO`` before a read-only one. "Next Boot" is what the NVM holds: the firmware
uses it after a firmware reset (``mlxfwreset``) or a reboot; "Current" is what runs now.

niccli's answer to ``getoption`` has no published sample (docs/network and the Broadcom readme
show the commands, not their output): the value read is the last number the command prints,
and an answer without one is an error naming the command (see the role README).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from shlex import quote

from fxkit.connection.base import RunResult
from fxkit.facts.base import Fact, FactError
from fxkit.facts.rdma import tool_output, with_tool

_PARAM = re.compile(r"\s*(\*)?\s*(RO)?\s+([A-Za-z0-9_.\[\]]+)\s+(\S.*?)\s*")
_NUMBER = re.compile(r".*?\((\d+)\)|(\d+)|(0x[0-9a-fA-F]+)")
_COLUMNS = re.compile(r"\s{2,}")


@dataclass(frozen=True)
class Value:
    """A value as mlxconfig prints it, and its number (None for ``N/A``, arrays, text)."""

    text: str

    @property
    def number(self) -> int | None:
        match = _NUMBER.fullmatch(self.text)
        if not match:
            return None
        paren, plain, hexa = match.groups()
        return int(paren or plain) if (paren or plain) else int(hexa, 16)


@dataclass(frozen=True)
class MlxParam:
    name: str
    #: "Next Boot": the value the NVM holds, used after a firmware reset or reboot.
    next: Value
    #: What the firmware runs now (None where mlxconfig cannot read it).
    current: Value | None = None
    default: Value | None = None


@dataclass(frozen=True)
class MlxconfigInfo:
    device: str
    params: dict[str, MlxParam] = field(default_factory=dict)
    missing: str = ""
    simulated: bool = False


def parse_mlxconfig(text: str, device: str) -> dict[str, MlxParam]:
    """The table after ``Configurations:``; its header names the columns."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith("Configurations:")), None)
    if start is None:
        raise FactError(f"mlxconfig -d {device} query printed no `Configurations:` table")
    columns = _COLUMNS.split(lines[start].removeprefix("Configurations:").strip())
    if "Next Boot" not in columns and "Default" not in columns:
        raise FactError(f"mlxconfig -d {device} query: unknown columns {columns}")
    # "Default" alone labels the next-boot column (printConfHeader, labelNextAsDefault).
    names = [c if not (c == "Default" and len(columns) == 1) else "Next Boot" for c in columns]
    params = {}
    for line in lines[start + 1 :]:
        match = _PARAM.fullmatch(line)
        if not match:
            if line.strip():
                break  # the notes after the table ("The '*' shows ...")
            continue
        name, rest = match.group(3), match.group(4).split()
        if len(rest) != len(names):
            raise FactError(
                f"mlxconfig -d {device} query: {name} has {len(rest)} values for columns {names}"
            )
        values = dict(zip(names, map(Value, rest), strict=True))
        params[name] = MlxParam(
            name, values["Next Boot"], values.get("Current"), values.get("Default")
        )
    return params


class MlxconfigQuery(Fact[MlxconfigInfo]):
    """``mlxconfig -e -d DEV query`` (DEV: a PCI address or an RDMA device name)."""

    become = True

    def command(self, device: str) -> str:
        return with_tool("mlxconfig", f"mlxconfig -e -d {quote(device)} query")

    def parse(self, result: RunResult, device: str) -> MlxconfigInfo:
        simulated, out = tool_output(f"mlxconfig of {device}", result)
        if out is None:
            missing = "mlxconfig not found (NVIDIA MFT, or mstflint's mstconfig)"
            return MlxconfigInfo(device, missing=missing, simulated=simulated)
        if not result.ok:
            tail = (result.stderr.strip() or out.strip())[-200:]
            return MlxconfigInfo(
                device, missing=f"mlxconfig -d {device}: {tail}", simulated=simulated
            )
        return MlxconfigInfo(device, parse_mlxconfig(out, device), simulated=simulated)


@dataclass(frozen=True)
class NvmOption:
    interface: str
    name: str
    scope: int | None
    value: int | None = None
    missing: str = ""
    simulated: bool = False


_TOKEN = re.compile(r"[\s=:,]+")


def last_number(text: str) -> int | None:
    """The last whole number (decimal or 0x hex) among the words of ``text``."""
    for word in reversed(_TOKEN.split(text.strip())):
        try:
            return int(word, 0)
        except ValueError:
            continue
    return None


def niccli_target(interface: str, name: str, scope: int | None) -> str:
    """``-dev=IF`` and the option, as ROCm's Thor2 script writes them."""
    where = f" -scope {int(scope)}" if scope is not None else ""
    return f"niccli -dev={quote(interface)} {{}} -name {quote(name)}{where}"


class NiccliOption(Fact[NvmOption]):
    """``niccli -dev=IF getoption -name NAME [-scope N]`` (Broadcom's NIC CLI)."""

    become = True

    def command(self, interface: str, name: str, scope: int | None = None) -> str:
        return with_tool("niccli", niccli_target(interface, name, scope).format("getoption"))

    def parse(
        self, result: RunResult, interface: str, name: str, scope: int | None = None
    ) -> NvmOption:
        simulated, out = tool_output(f"niccli {name} of {interface}", result)
        if out is None:
            missing = "niccli not found (Broadcom's NIC CLI, from the Thor2 driver bundle)"
            return NvmOption(interface, name, scope, missing=missing, simulated=simulated)
        if not result.ok:
            tail = (result.stderr.strip() or out.strip())[-200:]
            return NvmOption(interface, name, scope, missing=tail, simulated=simulated)
        value = last_number(out)
        if value is None:
            raise FactError(f"`{result.command}` printed no number: {out.strip()[:160]!r}")
        return NvmOption(interface, name, scope, value, simulated=simulated)


class PciAddress(Fact[str]):
    """The PCI address of an RDMA device (``/sys/class/infiniband/DEV/device``'s target, as
    mlxconfig's ``-d`` takes it); "" where sysfs has no such link."""

    def command(self, device: str) -> str:
        link = quote(f"/sys/class/infiniband/{device}/device")
        return f"d=$(readlink {link} 2>/dev/null); echo ${{d##*/}}"

    def parse(self, result: RunResult, device: str) -> str:
        return result.stdout.strip()
