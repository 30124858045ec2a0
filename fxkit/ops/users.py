"""Users and groups: accounts created, changed and removed with the shadow tools (useradd,
usermod, userdel, groupadd, groupmod, groupdel), their state read with ``getent``."""

from __future__ import annotations

import re
from collections.abc import Sequence
from shlex import quote

from fxkit.facts.users import Group, GroupMembership, User
from fxkit.ops.base import OpContext, OpError, Result, check_state, failed, ok

#: What useradd and groupadd accept everywhere (shadow's default, and Debian's NAME_REGEX, is
#: stricter about case on some systems: the tool says so).
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,31}\$?")


def _check_name(name: str, what: str) -> None:
    if not _NAME.fullmatch(name):
        raise OpError(
            f"bad {what} name {name!r}",
            hint="letters, digits, '_', '.', '-' (at most 32, not starting with a digit or '-')",
        )


def _check_id(value: int | None, what: str) -> None:
    if value is not None and (not isinstance(value, int) or value < 0):
        raise OpError(f"bad {what} {value!r}", hint="a number >= 0")


def _check_field(value: str | None, what: str) -> None:
    if value is not None and (not value.startswith("/") or set(value) & set(":\n")):
        raise OpError(f"bad {what} {value!r}", hint="an absolute path without ':'")


def group(
    ctx: OpContext,
    name: str,
    gid: int | None = None,
    system: bool = False,
    state: str = "present",
) -> Result:
    """Ensure the group ``name`` exists (with ``gid`` when given; ``system`` picks a gid from
    the system range when it is created), or is removed (``state="absent"``).

    Example::

        host.group("vllm", system=True)
    """
    check_state(state, ("present", "absent"))
    _check_name(name, "group")
    _check_id(gid, "gid")
    current = ctx.fresh(Group, name)
    q = quote(name)
    if state == "absent":
        if current is None:
            return ok(f"group {name} absent")
        return ctx.change(
            f"groupdel -- {q}",
            would=f"remove group {name}",
            done=f"removed group {name}",
            diff=f"group {name}: gid {current.gid} -> absent\n",
        )
    if current is None:
        options = [*(["-g", str(gid)] if gid is not None else []), *(["-r"] if system else [])]
        return ctx.change(
            " ".join(["groupadd", *options, "--", q]),
            would=f"create group {name}",
            done=f"created group {name}",
            diff=f"group {name}: absent -> present{f' (gid {gid})' if gid is not None else ''}\n",
        )
    if gid is not None and current.gid != gid:
        return ctx.change(
            f"groupmod -g {gid} -- {q}",
            would=f"change gid of group {name} to {gid}",
            done=f"changed gid of group {name} to {gid}",
            diff=f"gid of group {name}: {current.gid} -> {gid}\n",
        )
    return ok(f"group {name} present (gid {current.gid})")


def user(
    ctx: OpContext,
    name: str,
    uid: int | None = None,
    group: str | int | None = None,
    groups: str | Sequence[str] = (),
    home: str | None = None,
    shell: str | None = None,
    system: bool = False,
    state: str = "present",
) -> Result:
    """Ensure the account ``name`` exists with what is given: ``uid``, primary ``group`` (name
    or gid; it must exist), supplementary ``groups`` (added; others are kept), ``home``,
    ``shell``; or is removed (``state="absent"``; its home is kept).

    A new account gets its home directory created, except a ``system`` account without an
    explicit ``home``; ``system`` (uid from the system range) counts only when it is created.

    Example::

        host.user("vllm", system=True, group="vllm", groups=["render", "video"], shell="/bin/false")
    """
    check_state(state, ("present", "absent"))
    _check_name(name, "user")
    _check_id(uid, "uid")
    _check_field(home, "home directory")
    _check_field(shell, "shell")
    wanted = [groups] if isinstance(groups, str) else list(groups)
    for other in wanted:
        _check_name(other, "group")
    if isinstance(group, str):
        _check_name(group, "group")
    current = ctx.fresh(User, name)
    q = quote(name)
    if state == "absent":
        if current is None:
            return ok(f"user {name} absent")
        return ctx.change(
            f"userdel -- {q}",
            would=f"remove user {name}",
            done=f"removed user {name}",
            diff=f"user {name}: uid {current.uid} -> absent\n",
        )
    if current is None:
        options = [
            *(["-u", str(uid)] if uid is not None else []),
            *(["-g", quote(str(group))] if group is not None else []),
            *(["-G", quote(",".join(wanted))] if wanted else []),
            *(["-d", quote(home)] if home else []),
            *(["-s", quote(shell)] if shell else []),
            *(["-r"] if system else []),
            *(["-m"] if home or not system else []),
        ]
        return ctx.change(
            " ".join(["useradd", *options, "--", q]),
            would=f"create user {name}",
            done=f"created user {name}",
            diff=f"user {name}: absent -> present\n",
        )
    changes: list[tuple[str, str]] = []  # (usermod option, diff line)
    if uid is not None and current.uid != uid:
        changes.append((f"-u {uid}", f"uid: {current.uid} -> {uid}"))
    if group is not None and str(group) not in (current.group, str(current.gid)):
        changes.append((f"-g {quote(str(group))}", f"group: {current.group} -> {group}"))
    missing = [g for g in wanted if g not in current.groups and g != current.group]
    if missing:
        before = " ".join(sorted(current.groups))
        after = " ".join([*sorted(current.groups), *missing])
        changes.append((f"-aG {quote(','.join(missing))}", f"groups: {before} -> {after}"))
    if home is not None and current.home != home:
        changes.append((f"-d {quote(home)}", f"home: {current.home} -> {home}"))
    if shell is not None and current.shell != shell:
        changes.append((f"-s {quote(shell)}", f"shell: {current.shell} -> {shell}"))
    if not changes:
        return ok(f"user {name} present (uid {current.uid})")
    what = ", ".join(line.partition(":")[0] for _, line in changes)
    return ctx.change(
        " ".join(["usermod", *(option for option, _ in changes), "--", q]),
        would=f"change {what} of user {name}",
        done=f"changed {what} of user {name}",
        diff="".join(f"{line.strip()}\n" for _, line in changes),
    )


def group_member(ctx: OpContext, user: str, groups: str | list[str]) -> Result:
    """Ensure ``user`` belongs to ``groups`` (added to them; other memberships are kept).

    Example::

        host.group_member("vllm", ["render", "video"])
    """
    wanted = [groups] if isinstance(groups, str) else list(groups)
    current = ctx.fresh(GroupMembership, user)
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
