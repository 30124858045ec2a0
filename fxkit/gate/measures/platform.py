"""The node's platform as AMD's acceptance checklist reads it, each kind with a parser of the
tool's real output (docs/GATES.md, "G1 coverage of AMD's MI300X checklist"):

    measure: {os_point_release: {}}                      # value: release ("ubuntu 22.04.5")
    measure: {packages: {names: [amdgpu-dkms, rocm]}}    # value: packages.*
    measure: {dmidecode: {}}                             # value: system_manufacturer, bios_version
    measure: {kernel_args: {require: [[pci=realloc=off], [amd_iommu=on, intel_iommu=on]]}}
    measure: {lsmem: {}}                                 # value: online_gib
    measure: {kernel_log: {allow: [{match: "ccp .*SEV: failed to INIT", reason: "..."}]}}
    measure: {pcie: {gpu_device: "1002:74a2", backend: [ens6np0]}}

``dmidecode``, ``dmesg`` and ``lspci -vvv`` read what only root may: they run as root (sudo when
the connection's user is not root; a refused sudo is an ERROR saying so). Every value of a
simulated lab host carries ``simulated: true``.
"""

from __future__ import annotations

import re
import shlex
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from fxkit.facts.base import FactError
from fxkit.facts.lab import marked, split_marked
from fxkit.gate.measure import MISSING, MeasuredHost, MeasureError, Params, kind, regex, with_tool
from fxkit.gate.measures.fabric import backend_ports

#: How many flagged kernel-log lines a value lists (the measurement keeps the count).
SHOWN_LINES = 20


def run_marked(
    node: MeasuredHost, command: str, what: str, *, tool: str = "", as_root: bool = False
) -> Any:
    """(simulated?, stdout) of ``command``; MeasureError with its stderr when it fails.
    ``tool``: the tool it runs, looked for on the PATH in the same command (root's PATH,
    /usr/sbin, when ``as_root``: the command runs as root)."""
    script = with_tool(tool, command) if tool else command
    result = node.run(marked(script), become=True if as_root else None)
    try:
        lab, out = split_marked(result, what)
    except FactError as exc:  # no marker: the command never ran (a refused sudo...)
        raise MeasureError(exc.message) from None
    if tool and result.rc == 127 and out.strip() == MISSING:
        raise node.not_found(tool, as_root)
    if not result.ok:
        tail = (result.stderr or out).strip()[-400:]
        raise MeasureError(f"`{command}` exited {result.rc} on {node.host}: {tail}")
    return lab.simulated, out


# -- OS point release -----------------------------------------------------------------------------


class NoParams(Params):
    pass


@kind("os_point_release", NoParams)
def os_point_release(node: MeasuredHost, p: NoParams) -> dict[str, Any]:
    """/etc/os-release's distribution and point release: ``ubuntu 22.04.5``."""
    out = node.output("cat /etc/os-release 2>/dev/null || cat /usr/lib/os-release")
    return parse_os_release(out)


def parse_os_release(text: str) -> dict[str, Any]:
    """``ID`` and the point release: ``VERSION="22.04.5 LTS (Jammy Jellyfish)"``'s leading
    number, else ``VERSION_ID`` (distributions without point releases in VERSION)."""
    fields = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep and not key.startswith("#"):
            words = shlex.split(value)
            fields[key.strip()] = words[0] if words else ""
    point = re.match(r"\d+(\.\d+)*", fields.get("VERSION", ""))
    version = point.group(0) if point else fields.get("VERSION_ID", "")
    if not version:
        raise MeasureError("/etc/os-release has neither VERSION nor VERSION_ID")
    distro = fields.get("ID", "linux")
    return {"id": distro, "version": version, "release": f"{distro} {version}"}


# -- installed packages ---------------------------------------------------------------------------


class PackagesParams(Params):
    names: tuple[str, ...] = Field(min_length=1)


@kind("packages", PackagesParams)
def packages(node: MeasuredHost, p: PackagesParams) -> dict[str, Any]:
    """Each package's installed version, or ``missing`` (``dpkg-query -W``)."""
    node.require("dpkg-query")
    names = " ".join(shlex.quote(n) for n in p.names)
    fmt = shlex.quote(r"${Package}\t${db:Status-Abbrev}\t${Version}\n")
    # dpkg-query exits 1 when a name matches nothing: that is an answer (missing), not a failure.
    result = node.run(f"dpkg-query -W -f={fmt} {names}; true")
    return {"packages": parse_dpkg_query(result.stdout, p.names)}


def parse_dpkg_query(text: str, names: tuple[str, ...]) -> dict[str, str]:
    """``NAME<TAB>ii <TAB>VERSION`` lines: ``{name: version}``, ``missing`` where a name is not
    installed (no line, or a status other than ``ii``: removed, config files only)."""
    found = {}
    for line in text.splitlines():
        fields = line.split("\t")
        if len(fields) == 3 and fields[1].strip() == "ii":
            found[fields[0].split(":")[0]] = fields[2]
    return {name: found.get(name, "missing") for name in names}


# -- dmidecode -----------------------------------------------------------------------------------

DMI_KEYS = ("system-manufacturer", "system-product-name", "bios-version", "bios-release-date")


@kind("dmidecode", NoParams)
def dmidecode(node: MeasuredHost, p: NoParams) -> dict[str, Any]:
    """The system's manufacturer and product and its BIOS version and date (``dmidecode -s``)."""
    script = "; ".join(f"printf '%s\\t%s\\n' {k} \"$(dmidecode -s {k})\"" for k in DMI_KEYS)
    simulated, out = run_marked(node, script, "dmidecode", tool="dmidecode", as_root=True)
    return {"simulated": simulated, **parse_dmidecode(out)}


def parse_dmidecode(text: str) -> dict[str, str]:
    """``KEY<TAB>value`` lines (each ``dmidecode -s KEY``'s one line; its ``#`` comments, as
    dmidecode prints on a system without SMBIOS, left out): ``{system_manufacturer: ...}``."""
    values = {}
    for line in text.splitlines():
        key, _, value = line.partition("\t")
        if key in DMI_KEYS:
            lines = [v for v in value.splitlines() if not v.startswith("#")]
            values[key.replace("-", "_")] = " ".join(lines).strip()
    lacking = [k for k in DMI_KEYS if k.replace("-", "_") not in values]
    if lacking:
        raise MeasureError(f"dmidecode: no answer for {', '.join(lacking)}")
    return values


# -- kernel command line --------------------------------------------------------------------------


class KernelArgsParams(Params):
    #: Groups of words: each group must have one of its words on the command line.
    require: tuple[tuple[str, ...], ...] = Field(min_length=1)


@kind("kernel_args", KernelArgsParams)
def kernel_args(node: MeasuredHost, p: KernelArgsParams) -> dict[str, Any]:
    """Whether /proc/cmdline has a word of each group (``present``: group -> true/false)."""
    return parse_kernel_args(node.output("cat /proc/cmdline"), p.require)


def parse_kernel_args(cmdline: str, groups: tuple[tuple[str, ...], ...]) -> dict[str, Any]:
    """Whole words only: ``amd_iommu=pt`` is not ``iommu=pt``."""
    words = set(cmdline.split())
    return {
        "cmdline": cmdline.strip(),
        "present": {" or ".join(group): bool(words & set(group)) for group in groups},
    }


# -- lsmem ----------------------------------------------------------------------------------------

_SIZE = re.compile(r"([\d.]+)\s*([KMGTPE]?)i?B?", re.I)


@kind("lsmem", NoParams)
def lsmem(node: MeasuredHost, p: NoParams) -> dict[str, Any]:
    """lsmem's total online and offline memory (bytes, and online GiB)."""
    simulated, out = run_marked(node, "lsmem -b", "lsmem", tool="lsmem")
    return {"simulated": simulated, **parse_lsmem(out)}


def parse_lsmem(text: str) -> dict[str, Any]:
    """``Total online memory:`` in bytes (``-b``) or lsmem's sizes (``1.5T``: powers of 1024)."""
    totals: dict[str, float] = {}
    for state in ("online", "offline"):
        found = re.search(rf"^Total {state} memory:\s*(\S+)", text, re.M)
        if found:
            totals[f"{state}_bytes"] = _bytes(found.group(1))
    if "online_bytes" not in totals:
        raise MeasureError(f"lsmem printed no 'Total online memory:' line: {text[-200:]!r}")
    totals["online_gib"] = round(totals["online_bytes"] / (1 << 30), 1)
    return totals


def _bytes(text: str) -> int:
    match = _SIZE.fullmatch(text)
    if not match:
        raise MeasureError(f"lsmem: {text!r} is not a size")
    return int(float(match.group(1)) * 1024 ** "BKMGTPE".index(match.group(2).upper() or "B"))


# -- kernel log -----------------------------------------------------------------------------------


class Allowed(BaseModel):
    """Known noise: lines matching ``match`` (a regex) are not counted, for ``reason``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    match: str
    reason: str = Field(min_length=1)

    @field_validator("match")
    @classmethod
    def _regex(cls, value: str) -> str:
        regex(value, "match")
        return value


class KernelLogParams(Params):
    allow: tuple[Allowed, ...] = ()
    #: Words that make a line count, any case: AMD's `grep -i 'error\|warn\|fail\|exception'`.
    flag: tuple[str, ...] = ("error", "warn", "fail", "exception")
    #: Words that make a line about amdgpu its error (AMD's and CVS's amdgpu greps).
    amdgpu: tuple[str, ...] = ("error", "fail")


@kind("kernel_log", KernelLogParams)
def kernel_log(node: MeasuredHost, p: KernelLogParams) -> dict[str, Any]:
    """The kernel log's error, warning and failure lines (``dmesg``) and amdgpu's among them.

    Lines an ``allow`` entry matches are kept apart, each with its reason."""
    simulated, out = run_marked(node, "dmesg", "dmesg", tool="dmesg", as_root=True)
    return {"simulated": simulated, **parse_kernel_log(out, p)}


def parse_kernel_log(text: str, p: KernelLogParams) -> dict[str, Any]:
    flag, amdgpu = _words(p.flag), _words(p.amdgpu)
    allow = [(re.compile(a.match), a.reason) for a in p.allow]
    flagged: list[str] = []
    allowed: list[dict[str, str]] = []
    for raw in text.splitlines():
        line = re.sub(r"^\[[^\]]*\]\s*", "", raw).strip()  # [   37.76] / [Tue Aug 26 ...]
        if not flag.search(line):
            continue
        reason = next((r for pattern, r in allow if pattern.search(line)), None)
        if reason is None:
            flagged.append(line)
        else:
            allowed.append({"line": line, "reason": reason})
    errors = [line for line in flagged if "amdgpu" in line.lower() and amdgpu.search(line)]
    return {
        "lines": len(text.splitlines()),
        "flagged_count": len(flagged),
        "flagged": flagged[:SHOWN_LINES],
        "amdgpu_error_count": len(errors),
        "amdgpu_errors": errors[:SHOWN_LINES],
        "allowed": allowed,
    }


def _words(words: tuple[str, ...]) -> re.Pattern[str]:
    return re.compile("|".join(re.escape(w) for w in words), re.I)


# -- PCIe: lspci ----------------------------------------------------------------------------------


class PcieParams(Params):
    #: The GPUs' PCI vendor:device (AMD's table: MI300X 1002:74a1, MI308X 1002:74a2).
    gpu_device: str = Field(pattern=r"^[0-9a-fA-F]{4}:[0-9a-fA-F]{4}$")
    #: The declared backend ports, as the fabric checks take them (roce_nic_interfaces: netdev
    #: names or {name, device}); none: every RDMA port but bonds and disabled ones.
    backend: tuple[str | dict[str, Any], ...] = ()


_HEADER = re.compile(
    r"^(?P<path>(?:[0-9a-f]{4}:)?[0-9a-f]{2}:[0-9a-f]{2}\.[0-7](?:/[0-9a-f:.]+)*)\s+"
    r".*\[(?P<ids>[0-9a-f]{4}:[0-9a-f]{4})\](?: \(rev [0-9a-f]+\))?(?: \(prog-if .*)?$"
)
_LNKSTA = re.compile(r"LnkSta:\s*Speed ([\d.]+)GT/s(?: \((\w+)\))?, Width x(\d+)(?: \((\w+)\))?")


@kind("pcie", PcieParams)
def pcie(node: MeasuredHost, p: PcieParams) -> dict[str, Any]:
    """GPUs (by PCI id) and backend NICs: link, DevSta fatal bit, ACS on their path (lspci).

    ``lspci -D -PP -nn -vvv`` as root: the GPUs whatever the driver sees, each with its link
    (LnkSta), DevSta's fatal-error bit and the devices with ACS source validation on along its
    path (every bridge above it and itself); the same for each backend NIC."""
    netdevs = _netdevs(node, p.backend)
    links = "; ".join(
        f"printf 'netdev\\t%s\\t%s\\n' {shlex.quote(n)} \"$(basename \"$(readlink -f "
        f'/sys/class/net/{shlex.quote(n)}/device 2>/dev/null)")"'
        for n in netdevs
    )
    script = f"{links + '; ' if links else ''}echo '--- lspci'; lspci -D -PP -nn -vvv"
    simulated, out = run_marked(node, script, "lspci", tool="lspci", as_root=True)
    head, _, listing = out.partition("--- lspci\n")
    devices = parse_lspci(listing)
    nics = {}
    for line in head.splitlines():
        _, netdev, bdf = [*line.split("\t"), "", ""][:3]
        nics[netdev] = _endpoint(devices, bdf if bdf.count(":") == 2 else None)
    gpus = {
        bdf: _endpoint(devices, bdf)
        for bdf, dev in devices.items()
        if dev["ids"] == p.gpu_device.lower()
    }
    return {"simulated": simulated, "count": len(gpus), "gpus": gpus, "nics": nics}


def _netdevs(node: MeasuredHost, declared: tuple[str | dict[str, Any], ...]) -> list[str]:
    """The backend ports' netdevs (:func:`fxkit.gate.measures.fabric.backend_ports`); none
    where the node has no RDMA to read (the GPU checks go on)."""
    try:
        ports = backend_ports(node, declared)
    except MeasureError:
        return []
    return sorted({port.netdev for port in ports if port.netdev})


def _endpoint(devices: dict[str, dict[str, Any]], bdf: str | None) -> dict[str, Any]:
    """A GPU's or NIC's link, its DevSta fatal-error bit and ACS along its path (every bridge
    above it and itself): the devices whose ACSCtl has SrcValid+."""
    dev = devices.get(bdf or "")
    if dev is None:
        return {"bdf": bdf, "speed_gts": None, "width": None, "fatal_err": None, "acs_on": None}
    on_path = [b for b in [*dev["path"], bdf] if devices.get(b, {}).get("acs_src_valid")]
    keys = ("speed_gts", "width", "link_status", "fatal_err")
    return {"bdf": bdf, **{k: dev[k] for k in keys}, "acs_on": on_path}


def parse_lspci(text: str) -> dict[str, dict[str, Any]]:
    """``lspci -D -PP -nn -vvv``: each device by domain:bus:dev.fn with its vendor:device, the
    bridges above it (``-PP``'s path), its link (``LnkSta: Speed 32GT/s (ok), Width x16 (ok)``;
    older lspci leaves out the ``(ok)``), DevSta's ``FatalErr+``/``FatalErr-`` and whether its
    ACSCtl has ``SrcValid+``. lspci run without root shows ``<access denied>``: an error."""
    if "<access denied>" in text:
        raise MeasureError(
            "lspci could not read the devices' capabilities (<access denied>): it needs root "
            "(the connection's user, or sudo)"
        )
    devices: dict[str, dict[str, Any]] = {}
    current: dict[str, Any] | None = None
    for line in text.splitlines():
        header = _HEADER.match(line)
        if header:
            path = slot_path(header.group("path"))
            current = {
                "ids": header.group("ids"),
                "path": path[:-1],
                "speed_gts": None,
                "width": None,
                "link_status": None,
                "fatal_err": None,
                "acs_src_valid": False,
            }
            devices[path[-1]] = current
            continue
        if current is None:
            continue
        link = _LNKSTA.search(line)
        if link:
            current["speed_gts"] = float(link.group(1))
            current["width"] = int(link.group(3))
            states = {s for s in (link.group(2), link.group(4)) if s}
            current["link_status"] = "downgraded" if "downgraded" in states else "ok"
        elif "DevSta:" in line:
            fatal = re.search(r"\bFatalErr[+-]", line)  # not NonFatalErr
            current["fatal_err"] = fatal.group(0) if fatal else None
        elif "ACSCtl:" in line:
            current["acs_src_valid"] = "SrcValid+" in line
    return devices


def slot_path(text: str) -> list[str]:
    """``0000:00:01.1/01:00.0/05:00.0`` -> every element with the domain (``-D`` prints it
    once, before the path's root); without ``-D`` the domain is 0000."""
    parts = text.split("/")
    domain = parts[0][:5] if parts[0].count(":") == 2 else "0000:"
    return [p if p.count(":") == 2 else domain + p for p in parts]
