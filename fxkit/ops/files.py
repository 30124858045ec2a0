"""Directories and files: attributes (mode, owner, group) and content, written atomically.

Content is compared by sha256 on the host (one command reads the whole state), and a changed file
is written in one more command: a temp file in the same directory gets the data, the attributes
and is renamed over the old file, so a reader never sees half a file. An edit of a file's content
(a line, a block: :func:`edit_file`) is renamed into place only when the file is still what was
read, and is otherwise read and made again: an edit made meanwhile is never lost.
"""

from __future__ import annotations

import difflib
import hashlib
import posixpath
from collections.abc import Callable
from shlex import quote

from fxkit.connection.atomic import CHANGED_RC, content_stream, expected, replace_command
from fxkit.facts.files import FileInfo, FileStat
from fxkit.ops.base import (
    OpContext,
    OpError,
    Result,
    check_state,
    combine,
    failed,
    ok,
)

#: Mode of files fxkit creates when the caller gives none.
DEFAULT_FILE_MODE = 0o644
#: Times an edit is made again when the file changed between its read and its write.
EDIT_ATTEMPTS = 5

Mode = int | str | None
Owner = int | str | None


def check_path(path: str, *, removing: bool = False) -> None:
    if not path or "\0" in path:
        raise OpError(f"bad path {path!r}")
    if removing and path.rstrip("/") == "":
        raise OpError("refusing to remove /")


def parse_mode(mode: Mode) -> int | None:
    """``0o644``, ``"0644"`` or ``"644"`` -> 0o644; None stays None."""
    if mode is None or isinstance(mode, int):
        return mode
    try:
        return int(mode, 8)
    except ValueError:
        raise OpError(f"bad file mode {mode!r}", hint="give octal digits, e.g. '0644'") from None


def attribute_changes(
    info: FileInfo, mode: int | None, owner: Owner, group: Owner
) -> list[tuple[str, str, str]]:
    """``(attribute, before, after)`` for every attribute of an existing path that differs."""
    changes = []
    if mode is not None and info.mode != mode:
        changes.append(("mode", f"{info.mode:04o}", f"{mode:04o}"))
    if owner is not None and not info.owned_by(owner):
        changes.append(("owner", info.owner, str(owner)))
    if group is not None and not info.grouped(group):
        changes.append(("group", info.group, str(group)))
    return changes


def attribute_command(target: str, mode: int | None, owner: Owner, group: Owner) -> str:
    """chmod/chown commands for a shell word ``target`` (already quoted), joined with ``&&``."""
    steps = []
    if mode is not None:
        steps.append(f"chmod {mode:o} -- {target}")
    if owner is not None or group is not None:
        spec = f"{owner if owner is not None else ''}:{group if group is not None else ''}"
        steps.append(f"chown {quote(spec.rstrip(':'))} -- {target}")
    return " && ".join(steps)


def describe(changes: list[tuple[str, str, str]]) -> str:
    return ", ".join(f"{name} {before} -> {after}" for name, before, after in changes)


def attribute_diff(changes: list[tuple[str, str, str]]) -> str:
    return "".join(f"{name}: {before} -> {after}\n" for name, before, after in changes)


def content_diff(path: str, old: bytes | None, new: bytes) -> str:
    """A unified diff of two versions of ``path`` (``/dev/null`` when it did not exist)."""
    try:
        before = (old or b"").decode().splitlines(keepends=True)
        after = new.decode().splitlines(keepends=True)
    except UnicodeDecodeError:
        return f"binary content of {path} differs ({len(old or b'')} -> {len(new)} bytes)\n"
    lines = difflib.unified_diff(before, after, "/dev/null" if old is None else path, path)
    return "".join(
        line if line.endswith("\n") else line + "\n\\ No newline at end of file\n" for line in lines
    )


def write_command(
    path: str,
    data: bytes,
    *,
    mode: int | None = None,
    owner: Owner = None,
    group: Owner = None,
    backup: bool = False,
    expect: str | None = None,
    python: str = "python3",
) -> str:
    """The one command that atomically replaces ``path`` with ``data``, sent to its stdin as
    :func:`fxkit.connection.atomic.content_stream`; ``python`` the host's interpreter, that
    writes and hashes a big file in one pass.

    The host verifies size and sha256 before the rename: a broken transfer leaves the old file
    (see :mod:`fxkit.connection.atomic`, also for ``expect``). The new file takes the old file's
    mode and owner (or :data:`DEFAULT_FILE_MODE`) unless ``mode``/``owner``/``group`` say
    otherwise; ``backup`` keeps a copy ``path.<time>~`` and prints its name.

    A mode that a new file can be created with (no x, no special bits) is given to the temp file
    as it is made, and the old file's owner is copied only when it is not the writer's: a new
    file costs no chmod or chown on the host.
    """
    created = DEFAULT_FILE_MODE if mode is None else mode
    umask = 0o777 & ~created if created & 0o7111 == 0 else 0o077
    keep_mode = 'chmod --reference="$p" -- "$t"' if mode is None else ""
    keep_owner = (
        '{ [ -O "$p" ] && [ -G "$p" ] || chown --reference="$p" -- "$t"; }'
        if owner is None and group is None
        else ""
    )
    keep = " && ".join(filter(None, [keep_mode, keep_owner]))
    steps = [f'{{ [ ! -e "$p" ] || {{ {keep}; }}; }}'] if keep else []
    if mode is not None and umask == 0o077:
        steps.append(attribute_command('"$t"', mode, None, None))
    if owner is not None or group is not None:
        steps.append(attribute_command('"$t"', None, owner, group))
    if backup:
        steps.append(
            '{ [ ! -e "$p" ] || { b="$p.$(date +%Y-%m-%d@%H:%M:%S)~" && '
            'cp -p -- "$p" "$b" && echo "$b"; }; }'
        )
    return replace_command(
        path,
        len(data),
        before_rename=" && ".join(steps),
        expect=expect,
        umask=umask,
        python=python,
    )


#: What :func:`edit_file` calls with a file's content (None: missing): the new content, or a
#: result to return as it is (nothing to write: "file absent", a failure).
Edit = Callable[[bytes | None], bytes | Result]


def edit_file(
    ctx: OpContext,
    path: str,
    edit: Edit,
    *,
    mode: Mode = None,
    owner: Owner = None,
    group: Owner = None,
    backup: bool = False,
    secret: bool = False,
) -> Result:
    """Read ``path``, ``edit`` its content and write the new content (a read-modify-write: line,
    block, sysctl, fstab...), with the attributes :func:`file` takes.

    The write is a compare-and-swap: it renames the new file into place only when the file still
    has the content that was read. When another writer (a second run, a person) changed it in
    between, the file is read and edited again, up to :data:`EDIT_ATTEMPTS` times; after that the
    operation fails and the file keeps the other writer's content.
    """
    want_mode = parse_mode(mode)
    attributes = (want_mode, owner, group) != (None, None, None)
    for _ in range(EDIT_ATTEMPTS):
        info = ctx.fresh(FileStat, path) if attributes else None
        old = ctx.get(path)
        new = edit(old)
        if isinstance(new, Result):
            return new
        if new == old:
            if info is None:
                return ok("content as wanted")
            return _set_attributes(ctx, path, info, want_mode, owner, group)
        result = _put(
            ctx,
            path,
            new,
            exists=old is not None,
            diff=_write_diff(path, info, want_mode, owner, group, old, new, secret),
            mode=want_mode,
            owner=owner,
            group=group,
            backup=backup,
            expect=expected(old),
        )
        if result.data.get("rc") != CHANGED_RC:
            return result
    return failed(
        f"{path} changed between fxkit's read and its write {EDIT_ATTEMPTS} times in a row "
        "(another run or a person is editing it); it keeps their content: run again when they "
        "are done"
    )


def _write_diff(
    path: str,
    info: FileInfo | None,
    mode: int | None,
    owner: Owner,
    group: Owner,
    old: bytes | None,
    new: bytes,
    secret: bool,
) -> str:
    """The diff of a write: the attributes of the existing file that change, then the content."""
    changes = attribute_changes(info, mode, owner, group) if info and info.exists else []
    hidden = f"content of {path} changed (hidden: secret)\n"
    return attribute_diff(changes) + (hidden if secret else content_diff(path, old, new))


def _put(
    ctx: OpContext,
    path: str,
    data: bytes,
    *,
    exists: bool,
    diff: str | None,
    mode: int | None = None,
    owner: Owner = None,
    group: Owner = None,
    backup: bool = False,
    expect: str | None = None,
) -> Result:
    """Write new content (in check mode: say it would)."""
    verb = "update" if exists else "create"
    command = write_command(
        path,
        data,
        mode=mode,
        owner=owner,
        group=group,
        backup=backup,
        expect=expect,
        python=ctx.conn.python,
    )
    result = ctx.change(
        command,
        stdin=content_stream(data),
        would=f"{verb} {path}",
        done=f"{verb}d {path}",
        diff=diff,
    )
    if backup and result.changed and result.data.get("stdout", "").strip():
        result.data["backup"] = result.data["stdout"].strip()
    return result


def directory(
    ctx: OpContext,
    path: str,
    mode: Mode = None,
    owner: Owner = None,
    group: Owner = None,
    state: str = "present",
) -> Result:
    """Ensure a directory exists with the given attributes (parents are created too), or is
    removed with everything in it (``state="absent"``).

    Example::

        host.directory("/etc/fxkit", mode="0755", owner="root")
    """
    check_state(state, ("present", "absent"))
    check_path(path, removing=state == "absent")
    want_mode = parse_mode(mode)
    info = ctx.fresh(FileStat, path)
    q = quote(path)
    if info.exists and info.type != "directory":
        return failed(f"{path} exists and is a {info.type}, not a directory")
    if state == "absent":
        if not info.exists:
            return ok("absent")
        return _act(ctx, f"rm -rf -- {q}", "remove", path, "state: directory -> absent\n")
    if not info.exists:
        made = f"mkdir -p -m {want_mode:o} -- {q}" if want_mode is not None else f"mkdir -p -- {q}"
        command = " && ".join(filter(None, [made, attribute_command(q, None, owner, group)]))
        return _act(ctx, command, "create", path, "state: absent -> directory\n")
    return _set_attributes(ctx, path, info, want_mode, owner, group)


def file(
    ctx: OpContext,
    path: str,
    content: str | bytes | None = None,
    mode: Mode = None,
    owner: Owner = None,
    group: Owner = None,
    backup: bool = False,
    state: str = "present",
    secret: bool = False,
) -> Result:
    """Ensure a regular file has ``content`` (when given) and the given attributes, or is absent.

    With ``content=None`` only the attributes of an existing file are managed. ``backup`` keeps
    the old version as ``path.<time>~``; ``secret`` keeps the content out of diffs. A symbolic
    link at ``path`` is replaced by a regular file when content is given.

    Example::

        host.file("/etc/modprobe.d/amdgpu.conf", content="options amdgpu noretry=0\\n")
    """
    check_state(state, ("present", "absent"))
    check_path(path)
    want_mode = parse_mode(mode)
    info = ctx.fresh(FileStat, path)
    q = quote(path)
    if info.exists and info.type not in ("file", "link"):
        return failed(f"{path} exists and is a {info.type}, not a file")
    if state == "absent":
        if not info.exists:
            return ok("absent")
        return _act(ctx, f"rm -f -- {q}", "remove", path, "state: file -> absent\n")
    if content is None:
        if not info.exists:
            return failed(f"{path} does not exist: pass content to create it")
        return _set_attributes(ctx, path, info, want_mode, owner, group)

    data = content.encode() if isinstance(content, str) else content
    if info.type == "file" and info.sha256 == hashlib.sha256(data).hexdigest():
        return _set_attributes(ctx, path, info, want_mode, owner, group)
    diff = None
    if ctx.diff:  # the old content costs one more round trip, only for the diff
        old = ctx.get(path) if info.type == "file" else None
        diff = _write_diff(path, info, want_mode, owner, group, old, data, secret)
    return _put(
        ctx,
        path,
        data,
        exists=info.exists,
        diff=diff,
        mode=want_mode,
        owner=owner,
        group=group,
        backup=backup,
    )


def link(ctx: OpContext, path: str, target: str) -> Result:
    """Ensure ``path`` is a symbolic link to ``target`` (as written: a relative target is
    relative to the link's folder). A link to elsewhere is replaced at once (a new link renamed
    over it: no moment without one); a file or directory there is an error, left as it is.

    Example::

        host.link("/opt/fxkit/venvs/qwen32b", "qwen32b.venvs/v-0123456789ab")
    """
    check_path(path)
    if not target or "\0" in target:
        raise OpError(f"bad link target {target!r} for {path}")
    info = ctx.fresh(FileStat, path)
    if info.exists and info.type != "link":
        return failed(
            f"{path} exists and is a {info.type}, not a link: move it away to let fxkit link it"
        )
    q = quote(path)
    old = ctx.read(f"readlink -- {q}").stdout.rstrip("\n") if info.exists else ""
    if old == target:
        return ok(f"links to {target}")
    tmp = quote(f"{path}.fxkit-link")
    verb = "relink" if old else "link"
    return ctx.change(
        f"ln -sfn -- {quote(target)} {tmp} && mv -fT -- {tmp} {q}",
        would=f"{verb} {path} -> {target}",
        done=f"{verb}ed {path} -> {target}",
        diff=f"link: {old or 'absent'} -> {target}\n",
    )


def in_directory(ctx: OpContext, path: str, write: Callable[[], Result]) -> Result:
    """``write()`` a file of a configuration directory (``*.d``, a unit directory), creating the
    directory first where the host lacks it (a system without kmod has no /etc/modprobe.d)."""
    parent = directory(ctx, posixpath.dirname(path))
    if parent.failed:
        return parent
    result = write()
    return combine(parent, result) if parent.changed else result


def _set_attributes(
    ctx: OpContext, path: str, info: FileInfo, mode: int | None, owner: Owner, group: Owner
) -> Result:
    changes = attribute_changes(info, mode, owner, group)
    if not changes:
        return ok(f"{info.type} as wanted")
    command = attribute_command(quote(path), mode, owner, group)
    return _act(ctx, command, f"change {describe(changes)} of", path, attribute_diff(changes))


def _act(ctx: OpContext, command: str, verb: str, path: str, diff: str) -> Result:
    """Change ``path`` with one command: ``verb`` is "create", "remove" or "change <what> of"
    ("would create /x" in check mode, "created /x" after the change)."""
    first, _, rest = verb.partition(" ")
    done = " ".join(filter(None, [first + "d", rest, path]))
    return ctx.change(command, would=f"{verb} {path}", done=done, diff=diff)
