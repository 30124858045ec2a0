"""ethtool: the pause parameters (``-a``, ``-A``) of the profile's RDMA netdevs, nothing else.

No recorded ``ethtool -a`` of a Thor2 port was found: the text is ethtool's own format
(netlink/pause.c: ``Pause parameters for IF:``, ``Autonegotiate:``, ``RX:``, ``TX:``, the
negotiated result with autonegotiation on), the starting state the profile's (see its
SOURCES.md).
"""

from __future__ import annotations

from typing import Any

from .common import Profile, Tool, fail, load_state, save_state

ON_OFF = ("on", "off")


def ethtool(p: Profile, args: list[str], stdin: str, entry: dict[str, Any]) -> int:
    if len(args) < 2 or args[0] not in ("-a", "--show-pause", "-A", "--pause"):
        fail("ethtool", "the fxkit lab's stand-in answers -a and -A only", 1)
    option, dev, rest = args[0], args[1], args[2:]
    if dev not in [port["netdev"] for port in p["rdma"]["ports"]]:
        fail("", "netlink error: no device matches name\nnetlink error: No such device", 1)
    state = load_state("ethtool.json", {})
    mine = state.setdefault(
        dev, dict(p["rdma"].get("pause", {"autoneg": "on", "rx": "on", "tx": "on"}))
    )
    if option in ("-a", "--show-pause"):
        if rest:
            fail("ethtool", "bad command line argument(s)", 1)
        print(f"Pause parameters for {dev}:")
        print(f"Autonegotiate:\t{mine['autoneg']}\nRX:\t\t{mine['rx']}\nTX:\t\t{mine['tx']}")
        if mine["autoneg"] == "on":  # show_pause_autoneg_status: what the link partner agreed
            print(f"RX negotiated: {mine['rx']}\nTX negotiated: {mine['tx']}")
        print()
        return 0
    if len(rest) % 2 or not rest:
        fail("ethtool", "bad command line argument(s)", 1)
    for key, value in zip(rest[::2], rest[1::2], strict=True):
        if key not in ("autoneg", "rx", "tx") or value not in ON_OFF:
            fail("ethtool", "bad command line argument(s)", 1)
        mine[key] = value
    save_state("ethtool.json", state)
    return 0


TOOLS: dict[str, Tool] = {"ethtool": ethtool}
