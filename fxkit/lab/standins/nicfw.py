"""NIC firmware (NVM) settings: mlxconfig (ConnectX), niccli (Broadcom Thor2).

Both keep what the NVM holds in /var/lib/fxkit-lab/ (``nicfw.json``): a ``set`` changes the
value used at the next boot, never the running one, as on the NICs (a firmware reset or a
reboot loads it). The profile's ``nicfw`` says what each starts with (see the profile's
SOURCES.md for where the names and values come from).
"""

from __future__ import annotations

from typing import Any

from .common import Profile, Tool, fail, load_state, save_state

STATE = "nicfw.json"


def _devices(p: Profile, prefix: str) -> list[str]:
    return [port["dev"] for port in p["rdma"]["ports"] if port["dev"].startswith(prefix)]


# -- mlxconfig ------------------------------------------------------------------------------------

#: mstflint mlxconfig/mlxcfg_ui.cpp: CONFIG_TABLE_NAME_WIDTH 56, the value column width and the
#: parameter line ``"%s%s     %-48s"`` (diff mark, RO mark, name).
NAME_WIDTH, VALUE_WIDTH = 56, 20


def _text(spec: dict[str, Any], value: int) -> str:
    name = spec.get("names", {}).get(str(value))
    return f"{name}({value})" if name else str(value)


def mlxconfig(p: Profile, args: list[str], stdin: str, entry: dict[str, Any]) -> int:
    verbose = yes = False
    device = ""
    rest: list[str] = []
    while args:
        arg = args.pop(0)
        if arg in ("-e", "--enable_verbosity"):
            verbose = True
        elif arg in ("-y", "--yes"):
            yes = True
        elif arg in ("-d", "--dev") and args:
            device = args.pop(0)
        else:
            rest.append(arg)
    if not device or not rest or rest[0] not in ("q", "query", "s", "set"):
        fail("", "-E- Usage: mlxconfig -d <device> [-e] [-y] query|set [PARAM=VALUE...]", 1)
    spec = p["nicfw"]["mlxconfig"]
    if device not in _devices(p, "mlx5_"):
        fail("", f"-E- Failed to open device: {device}", 1)
    state: dict[str, Any] = load_state(STATE, {})
    nvm = state.setdefault("mlxconfig", {}).setdefault(device, {})
    params = spec["params"]
    wanted: dict[str, int] = {}
    for pair in rest[1:]:
        name, _, value = pair.partition("=")
        if name not in params or not value.lstrip("-").isdigit():
            fail("", f"-E- The Device doesn't support {name} parameter", 1)
        wanted[name] = int(value)
    setting = rest[0] in ("s", "set")
    if setting and not wanted:
        fail("", "-E- Missing parameters to set", 1)
    print("\nDevice #1:\n----------\n")
    for label, text in (
        ("Device type:", spec["device_type"]),
        ("Name:", spec["name"]),
        ("Description:", spec["description"]),
        ("Device:", device),
    ):
        print(f"{label:<20}{text:<20}")
    print()
    columns = (["Default", "Current"] if verbose and not setting else []) + ["Next Boot"]
    if setting:
        columns.append("New")
    print(f"{'Configurations:':<{NAME_WIDTH}}" + " ".join(f"{c:<{VALUE_WIDTH}}" for c in columns))
    marked = False
    for name, param in params.items():
        if setting and name not in wanted:
            continue
        default = int(param["default"])
        current = int(nvm.get(name, {}).get("current", default))
        following = int(nvm.get(name, {}).get("next", current))
        values = [default, current, following] if verbose and not setting else [following]
        if setting:
            values.append(wanted[name])
        diff = "*" if verbose and not setting and following not in (default, current) else " "
        marked |= diff == "*"
        cells = " ".join(f"{_text(param, v):<{VALUE_WIDTH}}" for v in values)
        print(f"{diff}       {name:<48}{cells}")
    if marked:
        print("The '*' shows parameters with next value different from default/current value.")
    if not setting:
        return 0
    print("\n Apply new Configuration? (y/n) [n] : " + ("y" if yes else ""))
    if not yes:
        fail("", "-E- Aborted by user.", 1)
    for name, number in wanted.items():
        held = nvm.setdefault(name, {"current": int(params[name]["default"])})
        held["next"] = number
    save_state(STATE, state)
    print("Applying... Done!\n-I- Please reboot machine to load new configurations.")
    return 0


# -- niccli ---------------------------------------------------------------------------------------


def niccli(p: Profile, args: list[str], stdin: str, entry: dict[str, Any]) -> int:
    """``niccli -dev=IF getoption|setoption -name NAME [-scope N] [-value V]``: the syntax of
    ROCm/gpu-cluster-networking's Thor2 script; the answer's format is this stand-in's own (no
    published sample, see SOURCES.md)."""
    interface = next((a.split("=", 1)[1] for a in args if a.startswith("-dev=")), "")
    words = [a for a in args if not a.startswith("-dev=")]
    verb = words[0] if words else ""
    options = dict(zip(words[1::2], words[2::2], strict=False))
    name, scope = options.get("-name", ""), options.get("-scope", "0")
    netdevs = {port["netdev"] for port in p["rdma"]["ports"] if port["dev"].startswith("bnxt_re")}
    if interface not in netdevs:
        fail("", f"Error: device {interface or '(none)'} not found", 1)
    spec = p["nicfw"]["niccli"]
    if verb not in ("getoption", "setoption") or name not in spec:
        fail("", f"Error: unsupported command or option: {' '.join(args)}", 1)
    state: dict[str, Any] = load_state(STATE, {})
    nvm = state.setdefault("niccli", {}).setdefault(interface, {})
    key = f"{name}:{scope}"
    default = int(spec[name])
    if verb == "setoption":
        value = options.get("-value", "")
        if not value.isdigit():
            fail("", "Error: -value wants a number", 1)
        nvm.setdefault(key, {"current": default})["next"] = int(value)
        save_state(STATE, state)
        print(
            f"{name} (scope {scope}) set to {int(value)}; a reset or reboot is needed to apply it"
        )
        return 0
    held = nvm.get(key, {})
    print(f"{name} (scope {scope}) = {held.get('next', held.get('current', default))}")
    return 0


TOOLS: dict[str, Tool] = {"mlxconfig": mlxconfig, "niccli": niccli}
