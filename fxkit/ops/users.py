"""Users and groups."""

from __future__ import annotations

from shlex import quote

from fxkit.facts.users import GroupMembership
from fxkit.ops.base import OpContext, Result, failed, ok


def group_member(ctx: OpContext, user: str, groups: str | list[str]) -> Result:
    """Ensure ``user`` belongs to ``groups`` (added to them; other memberships are kept).

    Example::

        host.group_member("vllm", ["render", "video"])
    """
    wanted = [groups] if isinstance(groups, str) else list(groups)
    current = ctx.probe(GroupMembership, user)
    if current is None:
        return failed(f"no such user: {user}")
    missing = [g for g in wanted if g not in current]
    if not missing:
        return ok(f"{user} is in {', '.join(wanted)}")
    before = " ".join(sorted(current))
    names = quote(",".join(missing))
    return ctx.change(
        f"if command -v usermod >/dev/null; then usermod -aG {names} -- {quote(user)}; "
        f"else for g in {' '.join(quote(g) for g in missing)}; "
        f'do gpasswd -a {quote(user)} "$g" >/dev/null || exit; done; fi',
        would=f"add {user} to {', '.join(missing)}",
        done=f"added {user} to {', '.join(missing)}",
        diff=f"groups of {user}: {before} -> {' '.join([before, *missing])}\n",
    )
