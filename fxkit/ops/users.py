"""Users and groups."""

from __future__ import annotations

from shlex import quote

from fxkit.facts.users import GroupMembership
from fxkit.ops.base import OpContext, Result, changed, failed, failed_run, ok


def group_member(ctx: OpContext, user: str, groups: str | list[str]) -> Result:
    """Ensure ``user`` belongs to ``groups`` (added to them; other memberships are kept)."""
    wanted = [groups] if isinstance(groups, str) else list(groups)
    current = ctx.probe(GroupMembership, user)
    if current is None:
        return failed(f"no such user: {user}")
    missing = [g for g in wanted if g not in current]
    if not missing:
        return ok(f"{user} is in {', '.join(wanted)}")
    before = " ".join(sorted(current))
    diff = f"groups of {user}: {before} -> {' '.join([before, *missing])}\n" if ctx.diff else None
    if ctx.check:
        return changed(f"would add {user} to {', '.join(missing)}", diff)
    names = quote(",".join(missing))
    result = ctx.run(
        f"if command -v usermod >/dev/null; then usermod -aG {names} -- {quote(user)}; "
        f"else for g in {' '.join(quote(g) for g in missing)}; "
        f'do gpasswd -a {quote(user)} "$g" >/dev/null || exit; done; fi'
    )
    if not result.ok:
        return failed_run(f"adding {user} to {', '.join(missing)}", result)
    return changed(f"added {user} to {', '.join(missing)}", diff)
