"""Files that come from elsewhere: copied from the controller, or downloaded by the host.

Both are verified by sha256 and idempotent by it: a host file with the wanted digest is left
alone (its attributes still managed). A copy goes through the one file-writing path
(:func:`fxkit.ops.files.write_command`), the controller's file mapped, not read into memory; a
download lands in a temp file beside the target and is renamed over it only once its digest
matches, so the target is never a partial or unverified file.
"""

from __future__ import annotations

import hashlib
import mmap
import os
import posixpath
import re
import stat
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from shlex import quote
from typing import cast

from fxkit.connection.atomic import CHUNK, content_stream
from fxkit.facts.files import FileInfo, FileStat
from fxkit.ops.base import OpContext, OpError, Result, failed
from fxkit.ops.files import (
    DEFAULT_FILE_MODE,
    Mode,
    Owner,
    attribute_changes,
    attribute_command,
    attribute_diff,
    check_path,
    file,
    parse_mode,
    write_command,
)

_SHA256 = re.compile(r"[0-9a-f]{64}")
_URL = re.compile(r"(https?|ftp|file)://[^\s]+")


def check_sha256(digest: str) -> str:
    """A sha256 as 64 lower-case hex digits (``sha256:`` prefix allowed, as in checksum files)."""
    bare = digest.strip().lower().removeprefix("sha256:")
    if not _SHA256.fullmatch(bare):
        raise OpError(f"bad sha256 {digest!r}", hint="64 hex digits, as sha256sum prints them")
    return bare


@contextmanager
def local_file(src: str | Path) -> Iterator[bytes]:
    """The content of the controller's file ``src``, mapped read-only (no copy in memory)."""
    try:
        regular = stat.S_ISREG(os.stat(src).st_mode)
        f = open(src, "rb") if regular else None  # noqa: SIM115 (closed by the with below)
    except OSError as exc:
        raise OpError(
            f"cannot read {src} on the controller: {exc.strerror}",
            hint="give the path of a file on the controller (relative to the directory fxkit "
            "runs in)",
        ) from None
    if f is None:
        raise OpError(f"{src} on the controller is not a regular file")
    with f:
        if os.fstat(f.fileno()).st_size == 0:
            yield b""
            return
        mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        try:
            # Connections send stdin from any buffer; a mapping is one, without a copy.
            yield cast(bytes, mapped)
        finally:
            # A link lost mid-upload: its error's traceback still holds views of the mapping,
            # which is unmapped once they go. Its error is the one to report.
            with suppress(BufferError):
                mapped.close()


def _as_wanted(
    ctx: OpContext,
    dest: str,
    info: FileInfo,
    digest: str | None,
    mode: Mode,
    owner: Owner,
    group: Owner,
) -> Result | None:
    """The result when ``dest`` has the content (its attributes then managed) or cannot get it;
    None when it is to be written (``digest`` None: not known yet, ``dest`` absent)."""
    if info.exists and info.type not in ("file", "link"):
        return failed(f"{dest} exists and is a {info.type}, not a file: move it away first")
    if digest is not None and info.type == "file" and info.sha256 == digest:
        return file(ctx, dest, mode=mode, owner=owner, group=group)
    parent = posixpath.dirname(dest) or "/"
    if not info.exists and not ctx.read(f"test -d {quote(parent)}").ok:
        return failed(
            f"cannot write {dest}: {parent} is not a directory on the host; create it first "
            "(host.directory)"
        )
    return None


def _digest_diff(
    info: FileInfo,
    dest: str,
    digest: str,
    mode: int | None,
    owner: Owner,
    group: Owner,
    source: str,
) -> str:
    changes = attribute_changes(info, mode, owner, group) if info.exists else []
    before = (
        f"sha256 {info.sha256}" if info.sha256 else ("absent" if not info.exists else info.type)
    )
    return attribute_diff(changes) + f"{dest}: {before} -> sha256 {digest} ({source})\n"


def copy(
    ctx: OpContext,
    src: str | Path,
    dest: str,
    mode: Mode = None,
    owner: Owner = None,
    group: Owner = None,
    sha256: str | None = None,
    backup: bool = False,
) -> Result:
    """Copy the controller's file ``src`` to ``dest`` on the host, unless the host's file already
    has its sha256. With ``sha256`` the controller's file must have that digest, or nothing is
    copied (an artifact shipped to an air-gapped site arrives as it was published).

    Example::

        host.copy("artifacts/rocm-7.2.2.tar.zst", "/srv/mirror/rocm-7.2.2.tar.zst",
                  sha256="9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08")
    """
    check_path(dest)
    want_mode = parse_mode(mode)
    expected = check_sha256(sha256) if sha256 is not None else None
    with local_file(src) as data:
        # The controller hashes its file once: up front where the digest is needed before any
        # byte goes out (a digest to meet, a host file to compare with, a diff to show, check
        # mode), and then passed through to the stream; otherwise while the stream sends it.
        digest = hashlib.sha256(data).hexdigest() if expected is not None else None
        if expected is not None and digest != expected:
            return failed(
                f"{src} on the controller has sha256 {digest}, not the expected {expected}: "
                f"nothing copied to {dest}; fetch the artifact again or fix the digest"
            )
        info = ctx.fresh(FileStat, dest)
        if digest is None and (info.exists or ctx.check or ctx.diff):
            digest = hashlib.sha256(data).hexdigest()
        done = _as_wanted(ctx, dest, info, digest, mode, owner, group)
        if done is not None:
            return done
        diff = None
        if digest is not None:
            diff = _digest_diff(
                info, dest, digest, want_mode, owner, group, f"{len(data)} bytes from {src}"
            )
        verb = "update" if info.exists else "create"
        result = ctx.change(
            write_command(
                dest,
                data,
                mode=want_mode,
                owner=owner,
                group=group,
                backup=backup,
                python=ctx.conn.python,
            ),
            stdin=content_stream(data) if digest is None else known_stream(data, digest),
            would=f"{verb} {dest}",
            done=f"{verb}d {dest}",
            diff=diff,
        )
        if backup and result.changed and result.data.get("stdout", "").strip():
            result.data["backup"] = result.data["stdout"].strip()
        return result


def known_stream(data: bytes, digest: str) -> Iterator[memoryview]:
    """:func:`fxkit.connection.atomic.content_stream` for content whose sha256 is already known:
    its chunks (views, no copies), then that digest on a line of its own; nothing hashed again.
    The host still hashes what arrived and renames nothing that differs."""
    view = memoryview(data)
    for start in range(0, len(view), CHUNK):
        yield view[start : start + CHUNK]
    yield memoryview(f"{digest}\n".encode())


def download_command(
    url: str, dest: str, digest: str, tool: str, mode: int | None, owner: Owner, group: Owner
) -> str:
    """The command that fetches ``url`` with ``tool`` (curl or wget) into a temp file beside
    ``dest``, checks its sha256, gives it the attributes and renames it over ``dest``."""
    fetch = (
        f'curl -fsSL --retry 2 -o "$t" -- {quote(url)}'
        if tool == "curl"
        else f'wget -nv -O "$t" -- {quote(url)}'
    )
    attributes = attribute_command('"$t"', mode, owner, group)
    return "; ".join(
        [
            f"p={quote(dest)}",
            'd=$(dirname -- "$p")',
            't=$(mktemp -- "$d/.${p##*/}.fxkit.XXXXXX") || exit 1',
            "trap 'rm -f -- \"$t\"' EXIT",
            f"{fetch} || exit",
            'sum=$(sha256sum < "$t") || exit',
            f'if [ "${{sum%% *}}" != {digest} ]; then '
            "printf 'fxkit: %s has sha256 %s, not the expected %s: %s is unchanged\\n' "
            f'{quote(url)} "${{sum%% *}}" {digest} "$p" >&2; exit 1; fi',
            'if [ -e "$p" ]; then chmod --reference="$p" -- "$t" && '
            'chown --reference="$p" -- "$t"; '
            f'else chmod {DEFAULT_FILE_MODE:o} -- "$t"; fi || exit',
            *([f"{attributes} || exit"] if attributes else []),
            'mv -f -- "$t" "$p"',
        ]
    )


def download(
    ctx: OpContext,
    url: str,
    dest: str,
    sha256: str,
    mode: Mode = None,
    owner: Owner = None,
    group: Owner = None,
    timeout: float = 3600,
) -> Result:
    """Download ``url`` on the host to ``dest`` (with curl, else wget), unless ``dest`` already
    has the required ``sha256``. The file is renamed into place only after its digest matched.

    Example::

        host.download("http://mirror.site/rocm/rocm.gpg.key", "/srv/keys/rocm.gpg.key",
                      sha256="73f5d8100de6048aa38a8b84cd9a87f05177d208ca3bb1bc4e2e9b6f7b2d6bba")
    """
    check_path(dest)
    want_mode = parse_mode(mode)
    digest = check_sha256(sha256)
    if not _URL.fullmatch(url):
        raise OpError(f"bad URL {url!r}", hint="http://, https://, ftp:// or file://, no spaces")
    info = ctx.fresh(FileStat, dest)
    done = _as_wanted(ctx, dest, info, digest, mode, owner, group)
    if done is not None:
        return done
    found = ctx.read("command -v curl || command -v wget").stdout.strip()
    tool = os.path.basename(found)
    if tool not in ("curl", "wget"):
        return failed(
            f"cannot download to {dest}: neither curl nor wget is on the host; install one"
        )
    if tool == "wget" and url.startswith("file:"):
        return failed(f"cannot download {url} to {dest}: wget reads no file:// URLs; install curl")
    return ctx.change(
        download_command(url, dest, digest, tool, want_mode, owner, group),
        would=f"download {url} to {dest}",
        done=f"downloaded {url} to {dest}",
        diff=_digest_diff(info, dest, digest, want_mode, owner, group, url),
        timeout=timeout,
    )
