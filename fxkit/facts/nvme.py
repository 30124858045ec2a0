"""NVMe facts: the namespaces ``nvme list -o json`` shows, the subsystems and paths of ``nvme
list-subsys -o json``, the native multipath setting, and NVMe Qualified Names (NQNs).

nvme-cli prints two JSON shapes of each, by major version (read from its source, tags v1.5-v1.16
and v2.0-v2.8, nvme-print.c / nvme-print-json.c):

- ``list``: ``{"Devices": [{NameSpace, DevicePath, Firmware, ModelNumber, SerialNumber, UsedBytes,
  MaximumLBA, PhysicalSize, SectorSize}]}``; 1.x adds ``Index`` (and old 1.x names the model
  ``ProductName``), 2.x adds ``GenericPath``.
- ``list-subsys``: 1.x a dict ``{"Subsystems": [...]}`` (``{}`` when there are none), where up to
  1.8 a subsystem ``{Name, NQN}`` is followed by a separate ``{Paths: [...]}`` entry and from 1.9
  the paths are inside it; 2.x a list of hosts ``[{HostNQN, HostID, Subsystems: [{Name, NQN,
  IOPolicy, Paths: [{Name, Transport, Address, State, ANAState}]}]}]``.

Every fact here reads the lab marker in the same command (:func:`fxkit.facts.lab.marked`):
``simulated`` is true on a lab host whose tools are stand-ins. A host without the tool or the
driver gets a value whose ``missing`` says why, never an exception, so roles gate with
``host.needs()``; output that is not what nvme-cli prints is a :class:`FactError`.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from shlex import quote
from typing import Any

from fxkit.connection.base import RunResult
from fxkit.facts.base import Fact, FactError
from fxkit.facts.lab import LabInfo, marked, split_marked

#: A line a fact command prints instead of the tool's output when it cannot run it.
MISSING = "fxkit-missing: "

#: The well-known discovery subsystem NQN (NVMe base specification).
DISCOVERY_NQN = "nqn.2014-08.org.nvmexpress.discovery"
#: NVMe base specification 2.0, 4.5 "NVMe Qualified Names": at most 223 bytes, UTF-8.
NQN_MAX_BYTES = 223
_DATE_DOMAIN_NQN = re.compile(
    r"nqn\.(?P<year>\d{4})-(?P<month>\d{2})\."
    r"(?P<domain>[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)+)"
    r"(?::(?P<rest>.+))?"
)
#: The prefix of an NQN made from a UUID.
UUID_NQN = "nqn.2014-08.org.nvmexpress:uuid:"
UUID = re.compile(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}")


def nqn_problem(nqn: object) -> str:
    """What is wrong with an NQN; empty when it is one of the two forms of the NVMe base
    specification: ``nqn.YYYY-MM.reverse.domain:name`` or
    ``nqn.2014-08.org.nvmexpress:uuid:<uuid>``."""
    if not isinstance(nqn, str) or not nqn:
        return f"{nqn!r} is not an NQN (a string like nqn.2024-01.com.example:storage1)"
    if len(nqn.encode()) > NQN_MAX_BYTES:
        return f"{nqn!r} is longer than {NQN_MAX_BYTES} bytes"
    if any(c.isspace() or c == "/" or not c.isprintable() for c in nqn):
        return f"{nqn!r} holds a space, '/' or a control character"
    if nqn.startswith(UUID_NQN):
        if UUID.fullmatch(nqn[len(UUID_NQN) :]):
            return ""
        return f"{nqn!r}: after {UUID_NQN} comes a UUID (8-4-4-4-12 hex digits)"
    match = _DATE_DOMAIN_NQN.fullmatch(nqn)
    if not match:
        return (
            f"{nqn!r} is not in the form nqn.YYYY-MM.reverse.domain:name "
            "(e.g. nqn.2024-01.com.example:storage1)"
        )
    if not 1 <= int(match["month"]) <= 12 or int(match["year"]) < 1970:
        return f"{nqn!r}: {match['year']}-{match['month']} is not a year and month"
    if match["rest"] is None and nqn != DISCOVERY_NQN:
        return f"{nqn!r} has no ':name' after the domain"
    return ""


def tool_script(tool: str, command: str) -> str:
    """Run ``command`` when ``tool`` is installed; otherwise print why not."""
    return (
        f"if ! command -v {quote(tool)} >/dev/null 2>&1; then "
        f"echo {quote(f'{MISSING}{tool} not found')}; exit 0; fi; {command}"
    )


def missing_reason(output: str) -> str:
    line = output.strip()
    return line[len(MISSING) :] if line.startswith(MISSING) and "\n" not in line else ""


def _no_driver(result: RunResult) -> str:
    """nvme-cli 2.x exits 1 with "Failed to scan topology" where the kernel has no NVMe driver
    (no /sys/class/nvme-subsystem); 1.x says "No NVMe devices detected"."""
    err = result.stderr.strip()
    for sign in ("Failed to scan topology", "No NVMe devices detected"):
        if sign in err or sign in result.stdout:
            return f"no NVMe driver or device ({err.splitlines()[-1] if err else sign})"
    return ""


def _nvme_output(result: RunResult, command: str) -> tuple[LabInfo, str, str]:
    """(the lab marker, nvme-cli's output, why there is none: no nvme-cli or no driver; "" when
    there is) of a command made by ``marked(tool_script("nvme", command))``."""
    lab, out = split_marked(result, command)
    why = missing_reason(out)
    if not why and not result.ok:
        why = _no_driver(result)
        if not why:
            raise FactError.from_result(command, result)
    return lab, out, why


def _json(text: str, fact: str) -> Any:
    if not text.strip():
        raise FactError(f"{fact} printed nothing", hint="is nvme-cli broken on this host?")
    try:
        return json.loads(text)
    except ValueError as exc:
        raise FactError(f"{fact} did not print JSON ({exc}): {text.strip()[:80]!r}") from None


def _int(value: object, what: str) -> int:
    """nvme-cli prints sizes as JSON numbers (some builds as numeric strings)."""
    if isinstance(value, bool):
        raise FactError(f"{what} is {value!r}, not a number")
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.strip().isdigit():
        return int(value)
    raise FactError(f"{what} is {value!r}, not a number")


def _str(entry: dict[str, Any], key: str, what: str, default: str | None = None) -> str:
    value = entry.get(key, default)
    if not isinstance(value, str):
        raise FactError(f"{what} has no string {key!r} (it has {sorted(entry)})")
    return value


# -- nvme list -o json ----------------------------------------------------------------------------


@dataclass(frozen=True)
class NvmeNamespace:
    """One namespace (block device) of ``nvme list``."""

    device: str
    nsid: int
    size: int
    sector_size: int
    used: int
    model: str = ""
    serial: str = ""
    firmware: str = ""
    #: The character device (``/dev/ng1n1``), nvme-cli 2.x only.
    generic: str = ""


@dataclass(frozen=True)
class NvmeDevices:
    namespaces: tuple[NvmeNamespace, ...] = ()
    #: Why the namespaces could not be read (no nvme-cli, no NVMe driver); empty when they were.
    missing: str = ""
    simulated: bool = False
    #: ``1.x`` or ``2.x``: the shape nvme-cli printed.
    shape: str = ""


class NvmeList(Fact[NvmeDevices]):
    """``nvme list -o json``: every NVMe namespace of the host."""

    become = True
    cmd = marked(tool_script("nvme", "nvme list -o json"))

    def parse(self, result: RunResult, *args: object) -> NvmeDevices:
        lab, out, why = _nvme_output(result, "nvme list -o json")
        if why:
            return NvmeDevices(missing=why, simulated=lab.simulated)
        devices, shape = parse_nvme_list(out)
        return NvmeDevices(devices, simulated=lab.simulated, shape=shape)


def parse_nvme_list(text: str) -> tuple[tuple[NvmeNamespace, ...], str]:
    """The namespaces of ``nvme list -o json`` (either shape) and the shape's name."""
    data = _json(text, "nvme list -o json")
    if not isinstance(data, dict) or not isinstance(data.get("Devices"), list):
        raise FactError(
            f"nvme list -o json: wanted {{'Devices': [...]}}, got {text.strip()[:80]!r}"
        )
    found = []
    for i, entry in enumerate(data["Devices"]):
        what = f"nvme list -o json: Devices[{i}]"
        if not isinstance(entry, dict):
            raise FactError(f"{what} is {entry!r}, not an object")
        found.append(
            NvmeNamespace(
                device=_str(entry, "DevicePath", what),
                nsid=_int(entry.get("NameSpace"), f"{what}.NameSpace"),
                size=_int(entry.get("PhysicalSize"), f"{what}.PhysicalSize"),
                sector_size=_int(entry.get("SectorSize"), f"{what}.SectorSize"),
                used=_int(entry.get("UsedBytes", 0), f"{what}.UsedBytes"),
                model=_str(entry, "ModelNumber", what, entry.get("ProductName", "")).strip(),
                serial=_str(entry, "SerialNumber", what, "").strip(),
                firmware=_str(entry, "Firmware", what, "").strip(),
                generic=_str(entry, "GenericPath", what, ""),
            )
        )
    # 2.x always prints GenericPath; 1.x never does. No device: no telling.
    shapes = {"2.x" if "GenericPath" in entry else "1.x" for entry in data["Devices"]}
    return tuple(found), shapes.pop() if len(shapes) == 1 else ""


# -- nvme list-subsys -o json ---------------------------------------------------------------------


@dataclass(frozen=True)
class NvmePath:
    """One controller (path) to a subsystem."""

    name: str
    transport: str
    #: As the kernel writes it: ``traddr=192.168.1.10,trsvcid=4420`` (maybe host_traddr=...).
    address: str
    state: str = ""
    ana_state: str = ""

    def field(self, key: str) -> str:
        """One ``key=value`` of the address (``traddr``, ``trsvcid``, ``host_traddr``)."""
        for part in re.split(r"[,\s]+", self.address.strip()):
            name, _, value = part.partition("=")
            if name == key:
                return value
        return ""


@dataclass(frozen=True)
class NvmeSubsystem:
    name: str
    nqn: str
    paths: tuple[NvmePath, ...] = ()
    iopolicy: str = ""


@dataclass(frozen=True)
class NvmeSubsystems:
    subsystems: tuple[NvmeSubsystem, ...] = ()
    missing: str = ""
    simulated: bool = False
    shape: str = ""
    #: The host NQN nvme-cli 2.x reports (empty for 1.x).
    hostnqn: str = ""

    def path_to(self, nqn: str, transport: str, traddr: str, trsvcid: str) -> NvmePath | None:
        """The controller connected to ``nqn`` over this transport, address and port, if any
        (in any state: a controller that is reconnecting is still there)."""
        for subsystem in self.subsystems:
            if subsystem.nqn != nqn:
                continue
            for path in subsystem.paths:
                if (
                    path.transport == transport
                    and path.field("traddr") == traddr
                    and path.field("trsvcid") == str(trsvcid)
                ):
                    return path
        return None


class NvmeListSubsys(Fact[NvmeSubsystems]):
    """``nvme list-subsys -o json``: the subsystems this host is connected to, with their paths."""

    become = True
    cmd = marked(tool_script("nvme", "nvme list-subsys -o json"))

    def parse(self, result: RunResult, *args: object) -> NvmeSubsystems:
        lab, out, why = _nvme_output(result, "nvme list-subsys -o json")
        if why:
            return NvmeSubsystems(missing=why, simulated=lab.simulated)
        subsystems, shape, hostnqn = parse_list_subsys(out)
        return NvmeSubsystems(subsystems, simulated=lab.simulated, shape=shape, hostnqn=hostnqn)


def parse_list_subsys(text: str) -> tuple[tuple[NvmeSubsystem, ...], str, str]:
    """The subsystems of ``nvme list-subsys -o json`` (either shape), the shape, the host NQN."""
    data = _json(text, "nvme list-subsys -o json")
    what = "nvme list-subsys -o json"
    if isinstance(data, dict):  # nvme-cli 1.x
        entries = data.get("Subsystems", [])
        if not isinstance(entries, list):
            raise FactError(f"{what}: 'Subsystems' is {entries!r}, not a list")
        return _subsystems_1x(entries, what), "1.x", ""
    if not isinstance(data, list):
        raise FactError(f"{what}: wanted a list (2.x) or an object (1.x), got {data!r:.80}")
    found: list[NvmeSubsystem] = []
    hostnqn = ""
    for i, host in enumerate(data):
        if not isinstance(host, dict) or not isinstance(host.get("Subsystems", []), list):
            raise FactError(f"{what}[{i}] is not a host with a 'Subsystems' list: {host!r:.80}")
        hostnqn = hostnqn or str(host.get("HostNQN", ""))
        for j, entry in enumerate(host.get("Subsystems", [])):
            found.append(_subsystem(entry, f"{what}[{i}].Subsystems[{j}]"))
    return tuple(found), "2.x", hostnqn


def _subsystems_1x(entries: list[Any], what: str) -> tuple[NvmeSubsystem, ...]:
    found: list[NvmeSubsystem] = []
    for i, entry in enumerate(entries):
        where = f"{what}: Subsystems[{i}]"
        if isinstance(entry, dict) and set(entry) == {"Paths"}:  # up to 1.8: paths come apart
            if not found:
                raise FactError(f"{where}: paths before any subsystem")
            last = found.pop()
            paths = last.paths + _paths(entry["Paths"], where)
            found.append(NvmeSubsystem(last.name, last.nqn, paths, last.iopolicy))
        else:
            found.append(_subsystem(entry, where))
    return tuple(found)


def _subsystem(entry: object, where: str) -> NvmeSubsystem:
    if not isinstance(entry, dict):
        raise FactError(f"{where} is {entry!r:.80}, not an object")
    return NvmeSubsystem(
        name=_str(entry, "Name", where),
        nqn=_str(entry, "NQN", where),
        paths=_paths(entry.get("Paths", []), where),
        iopolicy=_str(entry, "IOPolicy", where, ""),
    )


def _paths(paths: object, where: str) -> tuple[NvmePath, ...]:
    if not isinstance(paths, list):
        raise FactError(f"{where}.Paths is {paths!r:.80}, not a list")
    found = []
    for k, path in enumerate(paths):
        at = f"{where}.Paths[{k}]"
        if not isinstance(path, dict):
            raise FactError(f"{at} is {path!r:.80}, not an object")
        found.append(
            NvmePath(
                name=_str(path, "Name", at),
                transport=_str(path, "Transport", at, ""),
                address=_str(path, "Address", at, ""),
                state=_str(path, "State", at, ""),
                ana_state=_str(path, "ANAState", at, ""),
            )
        )
    return tuple(found)


# -- native multipath -----------------------------------------------------------------------------

MULTIPATH_PARAMETER = "/sys/module/nvme_core/parameters/multipath"


@dataclass(frozen=True)
class MultipathInfo:
    #: What the parameter says (``Y``/``N``); empty when it could not be read.
    value: str = ""
    missing: str = ""
    simulated: bool = False

    @property
    def enabled(self) -> bool:
        return self.value == "Y"


class NvmeMultipath(Fact[MultipathInfo]):
    """Whether the running kernel's native NVMe multipath is on (``nvme_core multipath``)."""

    cmd = marked(
        f"p={MULTIPATH_PARAMETER}; if [ -r $p ]; then cat $p; "
        f"elif [ -d /sys/module/nvme_core ]; then echo '{MISSING}nvme_core has no multipath "
        "parameter (a kernel built without CONFIG_NVME_MULTIPATH)'; "
        f"else echo '{MISSING}nvme_core is not loaded ({MULTIPATH_PARAMETER} is absent)'; fi"
    )

    def parse(self, result: RunResult, *args: object) -> MultipathInfo:
        lab, out = split_marked(result, "nvme multipath")
        why = missing_reason(out)
        if why:
            return MultipathInfo(missing=why, simulated=lab.simulated)
        value = out.strip()
        if not result.ok or value not in ("Y", "N"):
            raise FactError(f"{MULTIPATH_PARAMETER} says {value!r}, not Y or N")
        return MultipathInfo(value, simulated=lab.simulated)
