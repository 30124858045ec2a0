"""What every stand-in shares: the host's paths, the profile, the call log and the state."""

from __future__ import annotations

import argparse
import json
import os
import select
import socket
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

MARKER = Path("/etc/fxkit-lab/host.json")
CALL_LOG = Path("/var/log/fxkit-lab/calls.jsonl")
STATE = Path("/var/lib/fxkit-lab")
FABRIC = Path("/etc/fxkit-lab/fabric.json")
#: The folder every host of the fleet sees (host-init.sh): where two hosts' stand-ins meet.
SHARED = Path("/run/fxkit-lab/shared")
CONFIGFS = Path("/sys/kernel/config")
NVMET = CONFIGFS / "nvmet"
SYS_NET = Path("/sys/class/net")
HOSTNQN, HOSTID = Path("/etc/nvme/hostnqn"), Path("/etc/nvme/hostid")
DISCOVERY_CONF = Path("/etc/nvme/discovery.conf")
NVMET_CONFIG = Path("/etc/nvmet/config.json")

Profile = dict[str, Any]
#: A stand-in: (the profile, its arguments, what came on stdin, the call log's entry) -> exit code.
Tool = Callable[[Profile, list[str], str, dict[str, Any]], int]


def read_stdin() -> str:
    """What the caller sent on stdin, without waiting on a stdin left open and silent."""
    if sys.stdin is None or sys.stdin.isatty():
        return ""
    data = bytearray()
    fd = sys.stdin.fileno()
    while select.select([fd], [], [], 0.05)[0]:
        chunk = os.read(fd, 65536)
        if not chunk:
            break
        data += chunk
    return data.decode(errors="replace")


def log_call(entry: dict[str, Any]) -> None:
    CALL_LOG.parent.mkdir(parents=True, exist_ok=True)
    line = (json.dumps(entry) + "\n").encode()
    fd = os.open(CALL_LOG, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)  # one write in append mode: lines of parallel calls never mix
    finally:
        os.close(fd)


def load_profile() -> Profile:
    name = json.loads(MARKER.read_text())["profile"]
    here = Path(__file__).resolve().parent.parent  # /usr/local/lib/fxkit-lab
    data: Profile = json.loads((here / name / "profile.json").read_text())
    data["dir"] = here / name
    return data


def load_state(name: str, default: Any) -> Any:
    try:
        return json.loads((STATE / name).read_text())
    except FileNotFoundError:
        return default


def save_state(name: str, value: Any) -> None:
    STATE.mkdir(parents=True, exist_ok=True)
    tmp = STATE / f".{name}.tmp"
    tmp.write_text(json.dumps(value, indent=1) + "\n")
    tmp.replace(STATE / name)


def fail(tool: str, message: str, rc: int = 1) -> NoReturn:
    print(f"{tool}: {message}" if tool else message, file=sys.stderr)
    raise SystemExit(rc)


def own_address() -> str:
    """The host's address on the lab's network (its line of /etc/hosts)."""
    name = socket.gethostname()
    for line in Path("/etc/hosts").read_text().splitlines():
        words = line.split()
        if name in words[1:]:
            return words[0]
    return "127.0.0.1"


def netdev_attr(name: str, attribute: str, default: str = "") -> str:
    try:
        return (SYS_NET / name / attribute).read_text().strip()
    except OSError:
        return default


def new_parser(prog: str) -> argparse.ArgumentParser:
    return argparse.ArgumentParser(prog=prog, add_help=False, allow_abbrev=False)
