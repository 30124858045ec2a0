"""One setting made and proved: read it, run its command only when it differs, read it back.

For settings a fact reads but no operation writes (a NIC's QoS, an address, a route): the
role says what the setting is, the value it wants (in the words its reader returns), the
command that makes it so, and how to read it. Check mode shows the change as a diff and runs
nothing; a value that did not stick fails the step.
"""

from __future__ import annotations

from collections.abc import Callable

from fxkit.ops.base import OpContext, Result, failed, ok


def set_and_read_back(
    ctx: OpContext, what: str, want: str, command: str, read: Callable[[OpContext], str]
) -> Result:
    """Run ``command`` when ``read(ctx)`` is not ``want``; then ``read(ctx)`` must be ``want``.

    Example::

        set_and_read_back(ctx, "MTU of ens6np0", "9000", "ip link set dev ens6np0 mtu 9000",
                          lambda ctx: str(ctx.fresh(NetInterface, "ens6np0").mtu))
    """
    before = read(ctx)
    if before == want:
        return ok(f"{what} is {want}")
    result = ctx.change(
        command,
        would=f"set {what} to {want}",
        done=f"set {what} to {want}",
        diff=f"{what}: {before} -> {want}\n",
    )
    if not result.changed or ctx.check:
        return result
    after = read(ctx)
    if after != want:
        return failed(f"{what}: wanted {want}, found {after} after `{command}`")
    return result
