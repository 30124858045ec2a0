"""dcb (iproute2): ``pfc``, ``ets`` and ``app`` of the profile's RDMA netdevs, shown and set.

No recorded output of dcb on a Thor2 port was found: the JSON and text are built from iproute2's
source (dcb/dcb_pfc.c, dcb_ets.c, dcb_app.c, dcb.c at ee2a4a86), the starting state from what
bnxt_en's DCB callbacks report before anything was set (all zero: strict TSAs, no PFC, an empty
application table; see the profile's SOURCES.md).
"""

from __future__ import annotations

import json
from typing import Any

from .common import Profile, Tool, fail, load_state, save_state

PRIOS = range(8)
TSAS = ("strict", "cbs", "ets", "vendor")
#: The application selectors this stand-in keeps, by dcb's keyword and JSON name.
SELECTORS = {
    "dscp-prio": "dscp_prio",
    "dgram-port-prio": "dgram_port_prio",
    "stream-port-prio": "stream_port_prio",
}


def _fresh() -> dict[str, Any]:
    def zeros() -> list[int]:
        return [0] * 8

    return {
        "pfc": {"pfc_cap": 8, "macsec_bypass": False, "delay": 0, "prio_pfc": [False] * 8},
        "ets": {
            "willing": False,
            "ets_cap": 8,
            "cbs": False,
            "tc_bw": zeros(),
            "pg_bw": zeros(),
            "tc_tsa": ["strict"] * 8,
            "prio_tc": zeros(),
            "reco_tc_bw": zeros(),
            "reco_tc_tsa": ["strict"] * 8,
            "reco_prio_tc": zeros(),
        },
        "app": [],
    }


def _mapping(words: list[str], keys: range | None, what: str) -> list[tuple[int, str]]:
    """``3:on 4:off`` / ``all:off`` -> [(3, "on"), (4, "off")] (dcb_parse_mapping)."""
    pairs: list[tuple[int, str]] = []
    for word in words:
        key, sep, value = word.partition(":")
        if not sep:
            fail("", f'Invalid {what} mapping "{word}"', 1)
        if key == "all" and keys is not None:
            pairs += [(k, value) for k in keys]
            continue
        if not key.isdigit() or (keys is not None and int(key) not in keys):
            fail("", f'Invalid {what} mapping "{word}"', 1)
        pairs.append((int(key), value))
    return pairs


def _groups(args: list[str], keywords: tuple[str, ...]) -> dict[str, list[str]]:
    """``prio-tc 3:1 tc-bw 0:50`` -> {"prio-tc": ["3:1"], "tc-bw": ["0:50"]}."""
    groups: dict[str, list[str]] = {}
    current = None
    for word in args:
        if word in keywords:
            current = groups.setdefault(word, [])
        elif current is None:
            fail("", f'What is "{word}"?', 1)
        else:
            current.append(word)
    return groups


def _set_pfc(state: dict[str, Any], args: list[str]) -> None:
    groups = _groups(args, ("prio-pfc",))
    for prio, value in _mapping(groups.get("prio-pfc", []), PRIOS, "PRIO:PFC"):
        if value not in ("on", "off"):
            fail("", f'Invalid PFC value "{value}", expected on or off', 1)
        state["prio_pfc"][prio] = value == "on"


def _set_ets(state: dict[str, Any], args: list[str]) -> None:
    groups = _groups(args, ("tc-tsa", "tc-bw", "prio-tc"))
    for tc, tsa in _mapping(groups.get("tc-tsa", []), PRIOS, "TC:TSA"):
        if tsa not in TSAS:
            fail("", f'Invalid TSA "{tsa}"', 1)
        state["tc_tsa"][tc] = tsa
    for tc, bw in _mapping(groups.get("tc-bw", []), PRIOS, "TC:BW"):
        state["tc_bw"][tc] = int(bw)
    for prio, klass in _mapping(groups.get("prio-tc", []), PRIOS, "PRIO:TC"):
        if not klass.isdigit() or int(klass) > 7:
            fail("", "In PRIO:TC mapping, TC is expected to be 0..7", 1)
        state["prio_tc"][prio] = int(klass)
    total, has_ets = sum(state["tc_bw"]), "ets" in state["tc_tsa"]
    if total != 100 and (has_ets or total):  # dcb_ets_validate_bw
        fail("", f"Bandwidth percentages in TC sum to {total}%, expected 100%", 1)


def _set_app(entries: list[list[Any]], verb: str, args: list[str]) -> list[list[Any]]:
    groups = _groups(args, tuple(SELECTORS))
    for keyword, words in groups.items():
        selector = SELECTORS[keyword]
        for protocol, prio in _mapping(words, None, "PID:PRIO"):
            entry = [selector, protocol, int(prio)]
            if verb == "replace":  # dcb_app_table_remove_replaced: same selector and protocol
                entries = [e for e in entries if e[:2] != entry[:2]]
            if verb == "del":
                entries = [e for e in entries if e != entry]
            elif entry not in entries:
                entries.append(entry)
    return entries


def _print_obj(obj: str, state: dict[str, Any], as_json: bool) -> None:
    if obj == "app":
        apps = sorted(state["app"], key=lambda e: (list(SELECTORS.values()).index(e[0]), e[1:]))
        shown: dict[str, list[list[Any]]] = {}
        for selector, protocol, prio in apps:
            shown.setdefault(selector, []).append([protocol, prio, " "])
        if as_json:
            print(json.dumps(shown))
        for keyword, selector in SELECTORS.items():
            if selector in shown and not as_json:
                print(f"{keyword} " + " ".join(f"{p}:{q} " for p, q, _ in shown[selector]))
        return
    data = state[obj]
    if as_json:
        print(json.dumps(data))
        return
    for key, value in data.items():
        name = key.replace("_", "-")
        if isinstance(value, list):
            shown_values = (_word(v) for v in value)
            print(f"{name} " + " ".join(f"{i}:{v}" for i, v in enumerate(shown_values)) + " ")
        else:
            print(f"{name} {_word(value)} ")


def _word(value: Any) -> str:
    """As dcb prints a value: booleans as on/off (print_on_off)."""
    return ("on" if value else "off") if isinstance(value, bool) else str(value)


def dcb(p: Profile, args: list[str], stdin: str, entry: dict[str, Any]) -> int:
    as_json = False
    while args and args[0].startswith("-"):
        option = args.pop(0)
        if option in ("-j", "-json", "--json"):
            as_json = True
        elif option not in ("-p", "-pretty", "--pretty", "-s", "-statistics"):
            fail("", f'Option "{option}" is unknown, try "dcb -help".', 1)
    if len(args) < 4 or args[0] not in ("pfc", "ets", "app") or args[2] != "dev":
        fail("", "Usage: dcb [ OPTIONS ] { app | ets | pfc } { COMMAND | help }", 1)
    obj, verb, dev, rest = args[0], args[1], args[3], args[4:]
    if dev not in [port["netdev"] for port in p["rdma"]["ports"]]:
        fail("", f'Cannot find device "{dev}"', 1)
    state = load_state("dcb.json", {})
    mine = state.setdefault(dev, _fresh())
    if verb == "show":
        _print_obj(obj, mine, as_json)
        return 0
    if obj in ("pfc", "ets") and verb == "set":
        (_set_pfc if obj == "pfc" else _set_ets)(mine[obj], rest)
    elif obj == "app" and verb in ("add", "del", "replace"):
        mine["app"] = _set_app(mine["app"], verb, rest)
    else:
        fail("", f'Command "{verb}" is unknown, try "dcb {obj} help".', 1)
    save_state("dcb.json", state)
    return 0


TOOLS: dict[str, Tool] = {"dcb": dcb}
