#!/usr/bin/env python3
"""fxkit rollout's register/deregister hook for bench/rollout_lb.py: adds or removes one
``ADDRESS:PORT`` line of the balancer's backends file on the instance's host (over SSH, with
the inventory's settings), written whole (a temporary file, renamed).

    fxkit rollout ... \\
      --deregister-hook 'python3 bench/rollout_lb_hook.py -i INV --file /run/lb/backends
                         {host} {address}:{port}' \\
      --register-hook   '... the same ...'

The event (register or deregister) comes from ``FXKIT_HOOK_EVENT``.
"""

from __future__ import annotations

import argparse
import os
import sys

from rollout_lb import edit_command  # type: ignore[import-not-found]  # beside this file

from fxkit.connection import ConnectOptions, connect
from fxkit.inventory import Inventory


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("-i", "--inventory", required=True)
    parser.add_argument("--file", required=True, help="the backends file on the host")
    parser.add_argument("--known-hosts", default=None)
    parser.add_argument("host")
    parser.add_argument("backend", help="ADDRESS:PORT")
    args = parser.parse_args()
    event = os.environ.get("FXKIT_HOOK_EVENT", "")
    if event not in ("register", "deregister"):
        print(f"FXKIT_HOOK_EVENT is {event!r}: not register or deregister", file=sys.stderr)
        return 2
    [host] = Inventory.load([args.inventory]).select(args.host)
    options = ConnectOptions(known_hosts=args.known_hosts)
    with connect(host.name, host.vars, options) as conn:
        done = conn.run(edit_command(args.file, args.backend, event))
    if not done.ok:
        print(f"{args.host}: {done.stderr.strip()}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
