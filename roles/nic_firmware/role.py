"""nic_firmware: the NICs' firmware (NVM) settings read and compared with the values the
guides require: ConnectX through ``mlxconfig``, Broadcom Thor2 through ``niccli``.

A difference is reported with the command that fixes it. Only with ``nic_firmware_write`` does
the role write the NVM itself, and then it says what is true: the NVM holds the new value, the
running firmware uses it after a firmware reset or a reboot. ``mlxconfig -e`` shows the value
in force ("Current") beside the NVM's ("Next Boot"): the last step compares that.
"""

from __future__ import annotations

from dataclasses import dataclass
from shlex import quote
from typing import Annotated, Literal

from pydantic import Field

from fxkit.engine.role import Host
from fxkit.engine.rolevars import RoleKeys, RoleVars, Whole, pattern
from fxkit.facts.netaddr import Bond, front_end
from fxkit.facts.nicfw import MlxconfigQuery, NiccliOption, PciAddress, niccli_target
from fxkit.facts.rdma import NetInterface, RdmaLink, RdmaPort, driver_family
from fxkit.ops.base import OpContext, Result, failed, ok, skipped

# -- variables ------------------------------------------------------------------------------------

RdmaDevice = Annotated[str, pattern(r"[A-Za-z0-9_.-]{1,63}", "an RDMA device name")]
MlxName = Annotated[str, pattern(r"[A-Z][A-Z0-9_]*", "an mlxconfig parameter name")]
NvmName = Annotated[str, pattern(r"[a-z][a-z0-9_]*", "a niccli option name")]

#: AMD's NIC installation guide, "MLX Config" (system-acceptance-docs docs/network/
#: nic-installation.md): the four settings it queries and sets on every ConnectX-7.
AMD_MLXCONFIG = {
    "P2P_ORDERING_MODE": 1,
    "RDMA_SELECTIVE_REPEAT_EN": 1,
    "PCI_WR_ORDERING": 1,
    "ATS_ENABLED": 1,
}


class Option(RoleKeys):
    """One niccli NVM option."""

    name: NvmName = Field(description="the option, as `niccli getoption -name` takes it")
    value: Whole = Field(ge=0, description="the value wanted")
    scope: Whole | None = Field(None, ge=0, description="`-scope N` (none: not given)")


#: ROCm/gpu-cluster-networking docs/how-to/single-node-config.rst, "RoCE configuration script
#: for Broadcom Thor NIC": relaxed ordering, RDMA support in both scopes, the RoCE profile.
AMD_NICCLI = [
    {"name": "pcie_relaxed_ordering", "value": 1},
    {"name": "support_rdma", "value": 1, "scope": 0},
    {"name": "support_rdma", "value": 1, "scope": 1},
    {"name": "performance_profile", "value": 1},
]


class Vars(RoleVars):
    nic_firmware_devices: list[RdmaDevice] = Field(
        [],
        description="RDMA devices to check (none: every one `rdma link` shows, the front-end "
        "bond left out)",
        examples=[["mlx5_0", "mlx5_1"]],
    )
    nic_firmware_mlxconfig: dict[MlxName, Annotated[Whole, Field(ge=0)]] = Field(
        AMD_MLXCONFIG,
        description="ConnectX: mlxconfig parameter -> value wanted (AMD's NIC installation "
        "guide, MLX Config)",
        examples=[{"ATS_ENABLED": 1, "PCI_WR_ORDERING": 1}],
    )
    nic_firmware_niccli: list[Option] = Field(
        [Option.model_validate(o) for o in AMD_NICCLI],
        description="Thor2: niccli NVM options wanted (ROCm's Thor2 RoCE script)",
        examples=[[{"name": "support_rdma", "value": 1, "scope": 0}]],
    )
    nic_firmware_write: bool = Field(
        False,
        description="write differing values to the NVM (then a firmware reset or a reboot "
        "applies them); false: only report them with the command that fixes them",
        examples=[False, True],
    )
    nic_firmware_on_difference: Literal["fail", "report"] = Field(
        "fail",
        description="a value that differs (in the NVM, or in force until a reset): `fail` "
        "the host, or `report` it and go on",
        examples=["fail", "report"],
    )


def validate(v: Vars) -> None:
    """What the types cannot say: each niccli option and scope once."""
    seen: set[tuple[str, int | None]] = set()
    for i, option in enumerate(v.nic_firmware_niccli):
        key = (option.name, option.scope)
        if key in seen:
            raise v.wrong(
                f"nic_firmware_niccli[{i}]",
                f"{option.name} (scope {option.scope}) is listed twice",
                "list each option and scope once",
            )
        seen.add(key)


# -- the devices ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Nic:
    """An RDMA device as found: its netdev and family, the name its tool takes, or why not."""

    device: str
    netdev: str = ""
    #: ``connectx`` or ``thor2``.
    family: str = ""
    #: What mlxconfig's ``-d`` gets: the PCI address, else the RDMA device name.
    target: str = ""
    missing: str = ""


def resolve(host: Host, port: RdmaPort) -> Nic:
    netdev = port.netdev or ""
    iface = host.fact(NetInterface, netdev) if netdev else None
    family = driver_family(iface.driver if iface and not iface.missing else "", port.device)
    if not family:
        why = f"{port.device} is neither ConnectX (mlx5_core) nor Broadcom Thor2 (bnxt_en)"
        return Nic(port.device, netdev, missing=why)
    target = host.fact(PciAddress, port.device) or port.device
    return Nic(port.device, netdev, family, target)


def nics(host: Host, v: Vars) -> list[Nic]:
    """The devices to check: the listed ones, else every RDMA device but a front-end bond."""
    links = host.fact(RdmaLink)
    if not host.needs(not links.missing, "NIC firmware", links.missing):
        return []
    if v.nic_firmware_devices:
        found = []
        for device in v.nic_firmware_devices:
            port = links.by_device(device)
            if port is None:
                shown = ", ".join(p.device for p in links.ports)
                found.append(Nic(device, missing=f"no RDMA device {device} (rdma link: {shown})"))
            else:
                found.append(resolve(host, port))
        return found
    return [
        resolve(host, port)
        for port in links.ports
        if not front_end(port.device, host.fact(Bond, port.netdev) if port.netdev else None)
    ]


# -- ConnectX: mlxconfig --------------------------------------------------------------------------


def mlx_set(target: str, values: dict[str, int]) -> str:
    pairs = " ".join(quote(f"{k}={x}") for k, x in values.items())
    return f"mlxconfig -y -d {quote(target)} set {pairs}"


def reset_hint(nic: Nic) -> str:
    return f"a firmware reset (`mlxfwreset -d {quote(nic.target)} reset`) or a reboot"


def nvm_differences(ctx: OpContext, nic: Nic, wanted: dict[str, int]) -> tuple[dict[str, str], str]:
    """(parameter -> what the NVM holds, for those that differ; why they cannot be read)."""
    info = ctx.fresh(MlxconfigQuery, nic.target)
    if info.missing:
        return {}, info.missing
    absent = [name for name in wanted if name not in info.params]
    if absent:
        return {}, f"mlxconfig -d {nic.target} query shows no {', '.join(absent)}"
    return {
        name: info.params[name].next.text
        for name, want in wanted.items()
        if info.params[name].next.number != want
    }, ""


def converge_mlx(
    ctx: OpContext, nic: Nic, wanted: dict[str, int], write: bool, fail: bool
) -> Result:
    """Read the NVM's values (mlxconfig ``Next Boot``); where they differ, write them (with
    ``write``) and read them back, or report the command that would.

    Example::

        host.call(converge_mlx, nic, {"ATS_ENABLED": 1}, False, True)
    """
    differ, why = nvm_differences(ctx, nic, wanted)
    if why:
        return failed(f"{nic.device}: {why}")
    if not differ:
        return ok(f"{nic.device}: NVM holds {', '.join(f'{k}={x}' for k, x in wanted.items())}")
    fix = {k: wanted[k] for k in differ}
    found = ", ".join(f"{k} is {text}, wanted {wanted[k]}" for k, text in differ.items())
    command = mlx_set(nic.target, fix)
    if not write:
        msg = (
            f"{nic.device}: {found}; fix: `{command}`, then {reset_hint(nic)} (or set "
            "nic_firmware_write: true)"
        )
        return failed(msg) if fail else ok(msg)
    result = ctx.change(
        command,
        would=f"write {', '.join(f'{k}={x}' for k, x in fix.items())} to the NVM of {nic.device}",
        done=f"wrote {', '.join(f'{k}={x}' for k, x in fix.items())} to the NVM of {nic.device}; "
        f"the firmware uses them after {reset_hint(nic)}",
        diff="".join(f"{nic.device} {k}: {differ[k]} -> {x}\n" for k, x in fix.items()),
    )
    if not result.changed or ctx.check:
        return result
    still, why = nvm_differences(ctx, nic, wanted)
    if why or still:
        return failed(f"{nic.device}: after `{command}`: {why or still}")
    result.data["reset_required"] = True
    return result


def in_force_mlx(ctx: OpContext, nic: Nic, wanted: dict[str, int], fail: bool) -> Result:
    """The values the running firmware uses (mlxconfig ``Current``) are the wanted ones.

    Example::

        host.call(in_force_mlx, nic, {"ATS_ENABLED": 1}, True)
    """
    if ctx.check:
        return skipped("check mode: nothing was changed, so there is nothing to verify")
    info = ctx.fresh(MlxconfigQuery, nic.target)
    params = {k: info.params.get(k) for k in wanted}
    unknown = [k for k, p in params.items() if p is None or p.current is None]
    if info.missing or unknown:
        return skipped(
            f"{nic.device}: mlxconfig does not show the running value of "
            f"{', '.join(unknown) or 'any parameter'} ({info.missing or 'no Current column'}); "
            f"after a write, {reset_hint(nic)} applies it"
        )
    pending = {
        k: p.current.text
        for k, p in params.items()
        if p and p.current and p.current.number != wanted[k]
    }
    if not pending:
        return ok(f"{nic.device}: the running firmware uses {', '.join(wanted)} as wanted")
    msg = (
        f"{nic.device}: the running firmware still uses "
        f"{', '.join(f'{k} {x}' for k, x in pending.items())}; the NVM holds the wanted "
        f"values, in force after {reset_hint(nic)}"
    )
    return failed(msg) if fail else ok(msg)


# -- Thor2: niccli --------------------------------------------------------------------------------


def converge_niccli(ctx: OpContext, nic: Nic, option: Option, write: bool, fail: bool) -> Result:
    """Read one NVM option (``niccli getoption``); where it differs, write it (with ``write``)
    and read it back, or report the command that would.

    Example::

        host.call(converge_niccli, nic, Option(name="support_rdma", value=1, scope=0), False, True)
    """
    what = f"{option.name}{'' if option.scope is None else f' (scope {option.scope})'}"
    read = ctx.fresh(NiccliOption, nic.netdev, option.name, option.scope)
    if read.missing:
        return failed(f"{nic.netdev}: niccli cannot read {what}: {read.missing}")
    if read.value == option.value:
        return ok(f"{nic.netdev}: NVM holds {what} = {option.value}")
    base = niccli_target(nic.netdev, option.name, option.scope).format("setoption")
    command = f"{base} -value {option.value}"
    if not write:
        msg = (
            f"{nic.netdev}: {what} is {read.value}, wanted {option.value}; fix: `{command}`, "
            "then a reboot (or set nic_firmware_write: true)"
        )
        return failed(msg) if fail else ok(msg)
    result = ctx.change(
        command,
        would=f"write {what} = {option.value} to the NVM of {nic.netdev}",
        done=f"wrote {what} = {option.value} to the NVM of {nic.netdev}; the NIC uses it after "
        "a reboot",
        diff=f"{nic.netdev} {what}: {read.value} -> {option.value}\n",
    )
    if not result.changed or ctx.check:
        return result
    after = ctx.fresh(NiccliOption, nic.netdev, option.name, option.scope)
    if after.value != option.value:
        return failed(f"{nic.netdev}: {what} reads {after.value} after `{command}`")
    result.data["reset_required"] = True
    return result


# -- the role -------------------------------------------------------------------------------------


def apply(host: Host, v: Vars) -> None:
    found = nics(host, v)
    fail = v.nic_firmware_on_difference == "fail"
    checked = []
    for nic in found:
        if not host.needs(not nic.missing, f"firmware of {nic.device}", nic.missing):
            continue
        if nic.family == "connectx":
            tool, probe = "mlxconfig", host.fact(MlxconfigQuery, nic.target).missing
        elif v.nic_firmware_niccli:
            first = v.nic_firmware_niccli[0]
            tool = "niccli"
            probe = host.fact(NiccliOption, nic.netdev, first.name, first.scope).missing
        else:
            continue  # no niccli option wanted
        if host.needs(f"{tool} not found" not in probe, f"firmware of {nic.device}", probe):
            checked.append(nic)
    # Every device is read and reported, then the host fails once if any differed.
    results = []
    wanted = dict(v.nic_firmware_mlxconfig)
    nvm_as_wanted = []
    for nic in checked:
        if nic.family == "connectx":
            step = host.task(f"NVM of {nic.device}", ignore_errors=True)
            result = step.call(converge_mlx, nic, wanted, v.nic_firmware_write, fail)
            results.append(result)
            if not result.failed and (result.changed or "NVM holds" in result.msg):
                nvm_as_wanted.append(nic)
            continue
        for option in v.nic_firmware_niccli:
            step = host.task(f"NVM {option.name} of {nic.netdev}", ignore_errors=True)
            results.append(step.call(converge_niccli, nic, option, v.nic_firmware_write, fail))
    for nic in nvm_as_wanted:  # what runs now, where the NVM holds the wanted values
        step = host.task(f"firmware in force on {nic.device}", ignore_errors=True)
        results.append(step.call(in_force_mlx, nic, wanted, fail))
    bad = [r for r in results if r.failed]
    if bad:
        host.fail(
            f"{len(bad)} NIC firmware check(s) failed (see above); each names the command "
            "that fixes it"
        )
