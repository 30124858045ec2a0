"""The host's platform: lsmem (util-linux), dmesg (the kernel log), dmidecode (SMBIOS)."""

from __future__ import annotations

from typing import Any

from .common import Profile, Tool, fail

# -- lsmem ----------------------------------------------------------------------------------------


def lsmem(p: Profile, args: list[str], stdin: str, entry: dict[str, Any]) -> int:
    """util-linux lsmem's table and summary (lsmem.c), one range of online blocks; ``-b``:
    sizes in bytes."""
    unknown = [a for a in args if a not in ("-b", "--bytes")]
    if unknown:
        fail("lsmem", f"the lab's lsmem answers [-b], not {unknown}", 1)
    memory = p["memory"]
    online, block = int(memory["online_bytes"]), int(memory["block_bytes"])
    size = (lambda n: str(n)) if args else _human
    width = 15 if args else 5  # lsmem's summary: a 23-wide label, sizes 5 wide, bytes 15
    blocks = f"0-{online // block - 1}"
    print(f"{'RANGE':<37} {'SIZE':>{width}}  STATE REMOVABLE  BLOCK")
    print(f"0x{0:016x}-0x{online - 1:016x} {size(online):>{width}} online       yes {blocks:>6}")
    print()
    print(f"{'Memory block size:':<23} {size(block):>{width}}")
    print(f"{'Total online memory:':<23} {size(online):>{width}}")
    print(f"{'Total offline memory:':<23} {size(0) if args else '0B':>{width}}")
    return 0


def _human(n: int) -> str:
    """lsmem's sizes: powers of 1024, one decimal where needed (``2T``, ``1.5T``, ``128M``)."""
    for suffix, power in (("T", 40), ("G", 30), ("M", 20), ("K", 10)):
        if n >= 1 << power:
            value = n / (1 << power)
            return f"{value:.1f}".rstrip("0").rstrip(".") + suffix
    return f"{n}B"


# -- dmesg ----------------------------------------------------------------------------------------


def dmesg(p: Profile, args: list[str], stdin: str, entry: dict[str, Any]) -> int:
    """The profile's kernel log (its folder's dmesg.txt, a variant's over its base's), as
    ``dmesg`` prints it: ``[seconds] message`` lines. Options are accepted and logged only."""
    print((p["dir"] / "dmesg.txt").read_text(), end="")
    return 0


# -- dmidecode ------------------------------------------------------------------------------------


def dmidecode(p: Profile, args: list[str], stdin: str, entry: dict[str, Any]) -> int:
    """``dmidecode -s KEYWORD``: the one line dmidecode prints for it (the profile's ``dmi``)."""
    if len(args) != 2 or args[0] not in ("-s", "--string"):
        fail("dmidecode", "the lab's dmidecode answers -s KEYWORD", 2)
    values = p["dmi"]
    if args[1] not in values:
        valid = "\n".join(f"  {key}" for key in values)
        fail("", f"Invalid string keyword: {args[1]}\nValid string keywords are:\n{valid}", 2)
    print(values[args[1]])
    return 0


TOOLS: dict[str, Tool] = {"lsmem": lsmem, "dmesg": dmesg, "dmidecode": dmidecode}
