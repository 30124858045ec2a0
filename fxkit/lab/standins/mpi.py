"""Open MPI's mpirun, as rccl-tests' multi-node runs use it (system-acceptance-docs,
docs/common/rccl-benchmarking.md: ``mpirun -np 8 ./all_reduce_perf ... -g 1``).

Lab hosts do not reach each other, so the stand-in launches no remote ranks: it checks what a
real mpirun checks before it starts (-np against the slots of -H, a program to run) and runs the
program once on this host, which answers for the whole job (the all_reduce_perf stand-in prints
a recorded run of two 8-GPU nodes). Options it does not model (``--mca``, ``-x``, ``--bind-to``)
are accepted and ignored.
"""

from __future__ import annotations

import shutil
import subprocess
from typing import Any

from .common import Profile, Tool, fail

#: Open MPI options that take one argument, and ``--mca`` (two).
_ONE = {"-x", "--map-by", "--bind-to", "--rank-by", "--hostfile", "-hostfile", "--prefix"}
_FLAGS = {"--allow-run-as-root", "--oversubscribe", "--tag-output", "--report-bindings"}


def _slots(hosts: str) -> int:
    """The slots of ``-H a:8,b:8`` (a host without ``:N`` has one)."""
    total = 0
    for item in hosts.split(","):
        _, _, count = item.partition(":")
        total += int(count) if count.isdigit() else 1
    return total


def mpirun(p: Profile, args: list[str], stdin: str, entry: dict[str, Any]) -> int:
    np, hosts, i = None, None, 0
    while i < len(args) and args[i].startswith("-"):
        option = args[i]
        if option in ("-np", "-n", "--np"):
            np, i = int(args[i + 1]), i + 2
        elif option in ("-H", "--host", "-host"):
            hosts, i = args[i + 1], i + 2
        elif option in ("--mca", "-mca"):
            i += 3
        elif option in _ONE:
            i += 2
        elif option in _FLAGS:
            i += 1
        else:
            fail("mpirun", f"the lab's stand-in does not know the option {option}", 1)
    program = args[i:]
    if not program:
        fail("", "No executable was specified on the mpirun command line.", 1)
    slots = _slots(hosts) if hosts else 1
    if np is not None and np > slots:
        fail(
            "",
            "There are not enough slots available in the system to satisfy the "
            f"{np}\nslots that were requested by the application:\n\n  {program[0]}",
            1,
        )
    if shutil.which(program[0]) is None:
        fail("", f"mpirun was unable to find the specified executable file: {program[0]}", 1)
    entry["hosts"], entry["np"] = hosts, np
    return subprocess.run(program, check=False).returncode


TOOLS: dict[str, Tool] = {"mpirun": mpirun}
