"""Replacing a file on a host so that it is always the old file or the new one, whole.

The new content arrives on the command's stdin, followed by its sha256 on a line of its own
(:func:`content_stream`: a thread hashes each chunk while the connection sends it, so the
controller's hash costs no time of its own). The host copies exactly the expected number of bytes
into a temp file beside the target, ``.NAME.fxkit.PID.XXXXXX`` (PID: the writing shell's), reads
the sha256 line after them and hashes the temp file. Only when all the bytes and the sha256 line
arrived and the sha256 matches is the temp file renamed over the target; a transfer that broke off
(fxkit killed, the link dropped) leaves the old file untouched. The writing shell removes its temp
file on every exit, HUP, INT, PIPE and TERM included; one killed outright (SIGKILL, a crash)
leaves it behind, and the next write of the same file removes it: temp files whose writing shell
is gone (no ``/proc/PID``) are deleted before a new one is made.

A read-modify-write (a line, a block, an fstab entry: :func:`fxkit.ops.files.edit_file`) gives
the sha256 of what it read (``expect``): the file is renamed into place only when the target
still has it, and otherwise the command exits :data:`CHANGED_RC` and writes nothing, so an edit
made meanwhile by another run or a person is never lost (compare-and-swap). The check and the
rename hold a ``flock`` on the target's directory, so two writers of one file cannot both pass
the check; a host without ``flock`` (util-linux) gets the check alone.

The host needs sh and GNU coreutils only (``dd`` with ``count_bytes`` never reads past its count,
so the sha256 line is left for ``read``); openssl's sha256 is used for a file of 1 MiB or more
where it is installed. A file of :data:`ONE_PASS_FROM` or more is written and hashed in one pass
by the host's python3 (the inventory's ``ansible_python_interpreter``) where it has one
(:data:`WRITER`): the hash then runs while the content arrives, not after it, and the temp file
is not read back.
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from shlex import quote

#: Between a target's name and the writer's PID in its temp files' names.
TEMP_MARK = ".fxkit."
#: Bytes hashed and handed to the connection at a time.
CHUNK = 2**20
#: Exit status of a write whose target is no longer what its ``expect`` says: nothing written.
CHANGED_RC = 108
#: Seconds a write waits for another fxkit write in the same directory to rename its file.
LOCK_WAIT = 60
#: ``expect`` of a target that was missing when it was read.
ABSENT = "absent"
#: Bytes from which a write is hashed on the host with openssl, not coreutils (:func:`_hasher`).
OPENSSL_FROM = 2**20
#: Bytes from which the host writes and hashes the content in one pass (:data:`WRITER`), where
#: it has python3. fxkit's own choice, no vendor figure: below it the hash after the copy costs
#: little (64 MiB: 50 ms with openssl here; docs/BENCHMARKS.md, Uploads, "One pass").
ONE_PASS_FROM = 64 << 20
#: Copies exactly argv[1] bytes of stdin (never more: the sha256 line follows) into the temp
#: file argv[2], hashing them on the way (hashlib's OpenSSL), and prints their sha256; stops
#: early at end of input (the sha256 line's ``read`` then finds the transfer broken off).
WRITER = """import hashlib, os, sys
left, digest, buffer = int(sys.argv[1]), hashlib.sha256(), memoryview(bytearray(1 << 20))
stdin = sys.stdin.buffer.raw
try:
    fd = os.open(sys.argv[2], os.O_WRONLY | os.O_TRUNC)
    while left:
        want, got = min(left, len(buffer)), 0
        while got < want:  # a whole block, as dd's fullblock: few writes, few updates
            n = stdin.readinto(buffer[got:want])
            if not n:
                break
            got += n
        block, left = buffer[:got], left - got
        digest.update(block)
        while block:
            block = block[os.write(fd, block):]
        if got < want:
            break
except OSError as exc:
    temp, target = sys.argv[2:4]
    sys.exit("fxkit: cannot write %s: %s; %s is unchanged" % (temp, exc.strerror, target))
print(digest.hexdigest())
"""


def expected(content: bytes | None) -> str:
    """:func:`replace_command`'s ``expect`` for a target that was read as ``content``."""
    return ABSENT if content is None else hashlib.sha256(content).hexdigest()


def replace_command(
    path: str,
    size: int,
    *,
    before_rename: str = "",
    expect: str | None = None,
    umask: int = 0o077,
    python: str = "python3",
) -> str:
    """The shell command that replaces ``path`` with the ``size`` bytes of
    :func:`content_stream`, which it reads on its stdin.

    ``before_rename`` runs once the content is verified, with ``"$t"`` the temp file and ``"$p"``
    the target (set attributes, keep a backup); when it fails, nothing is renamed. The temp file
    is created with mode ``0666 & ~umask`` (0600 unless told). The command fails (rc != 0, the
    reason on stderr) when the content did not arrive whole, and with :data:`CHANGED_RC` when
    ``expect`` (see :func:`expected`) is given and the target differs.

    Every step that a shell can do itself is a builtin (the temp file is made with ``set -C``,
    the directory is cut from the path): on the host the write starts ``dd``, one hash and
    ``mv``, and what ``before_rename`` and ``expect`` need."""
    temp = f'"$d/.$n{TEMP_MARK}"'  # a quoted shell word: the prefix of every temp file
    steps = [
        f"p={quote(path)}",
        "case $p in */*) d=${p%/*}; d=${d:-/};; *) d=.;; esac",
        "n=${p##*/}",
        f"for s in {temp}*; do w=${{s#{temp}}}; w=${{w%%.*}}; "
        '[ -f "$s" ] && [ ! -d "/proc/$w" ] && rm -f -- "$s"; done',
        _hasher(size),
        # The writer's PID and a random suffix name it; set -C creates it only if it is new.
        f"t={temp}$$.{secrets.token_hex(4)}",
        f"umask {umask:03o}; set -C",
        'true 2>/dev/null > "$t" || { e=$(true 2>&1 > "$t"); echo "fxkit: cannot create a temp '
        'file in $d: ${e##*: }; $p is unchanged" >&2; exit 1; }',
        "set +C",
        "trap 'rm -f -- \"$t\"' EXIT",
        "trap 'exit 129' HUP; trap 'exit 130' INT; trap 'exit 141' PIPE; trap 'exit 143' TERM",
        _copy(size, expect in (None, ABSENT) and size >= ONE_PASS_FROM, python),
        # The sha256 line comes after the content: without it the transfer broke off (a content
        # cut short leaves dd reading into the sha256 line, and read then finds none).
        f'read -r want || {{ got=$(wc -c < "$t"); echo "fxkit: the transfer broke '
        f'off after $got of {size} bytes; $p is unchanged" >&2; exit 1; }}',
    ]
    if expect is None or expect == ABSENT:
        steps += ['[ -n "$sum" ] || sum=$($sha < "$t")', _CORRUPTED]
    if expect is not None:
        steps += _unchanged(expect)
    # Once renamed there is nothing left to remove: the EXIT trap would start an rm for nothing.
    final = 'mv -f -- "$t" "$p" && trap - EXIT'
    steps.append(f"{before_rename} && {final}" if before_rename else final)
    return "\n".join(steps)


def _copy(size: int, one_pass: bool, python: str) -> str:
    """Copies the content into the temp file; sets ``$sum`` where it was hashed on the way
    (``one_pass`` and ``python`` on the host), else leaves it empty."""
    dd = f'dd bs={CHUNK} iflag=fullblock,count_bytes count={size} status=none of="$t" || exit 1'
    if not one_pass:
        return f"sum=; {dd}"
    writer = f'{quote(python)} -I -S -c {quote(WRITER)} {size} "$t" "$p"'
    found = f"command -v {quote(python)} >/dev/null"
    return f"if {found}; then sum=$({writer}) || exit 1; else sum=; {dd}; fi"


def _hasher(size: int) -> str:
    """Sets ``$sha`` to the command that hashes ``size`` bytes cheapest: openssl's sha256 (SHA-NI
    where the CPU has it) is 5-8x faster per byte than coreutils', but takes 4-5 ms more CPU to
    start; the two break even near :data:`OPENSSL_FROM` (1.3 ms and 5.6 ms for 2 kB, 7.3 and 6.9
    ms for 1 MiB, 56 and 15 ms for 8 MiB on this project's VM)."""
    if size < OPENSSL_FROM:
        return "sha=sha256sum"
    return (
        "if command -v openssl >/dev/null; then sha='openssl dgst -sha256 -r'; "
        "else sha=sha256sum; fi"
    )


_CORRUPTED = (
    '[ "${sum%% *}" = "$want" ] || { echo "fxkit: the content arrived corrupted '
    '(sha256 differs); $p is unchanged" >&2; exit 1; }'
)


def _unchanged(expect: str) -> list[str]:
    """Steps that lock the target's directory (held until the command ends) and exit
    :data:`CHANGED_RC` unless the target is as ``expect`` says. A target that was absent is
    checked without hashing anything; one that had content is hashed with the temp file, by one
    ``sha256sum`` (an edit's file is small: one process matters more than openssl's speed)."""
    changed = (
        f'{{ echo "fxkit: $p changed since it was read; it is unchanged" >&2; exit {CHANGED_RC}; }}'
    )
    lock = [
        'exec 9< "$d"',
        f"if command -v flock >/dev/null; then flock -w {LOCK_WAIT} 9 || {{ echo "
        '"fxkit: another write in $d held its lock for too long; $p is unchanged" >&2; '
        "exit 1; }; fi",
    ]
    if expect == ABSENT:
        return [*lock, f'[ ! -e "$p" ] || {changed}']
    return [
        *lock,
        # Two lines, the temp file's then the target's (a missing target: one line).
        'sums=$(sha256sum -- "$t" "$p" 2>/dev/null); sum=${sums%%"\n"*}; now=${sums#"$sum"}',
        'sum=${sum#\\\\}; now=${now#"\n"}; now=${now#\\\\}',
        _CORRUPTED,
        f'[ "${{now%% *}}" = {quote(expect)} ] || {changed}',
    ]


def content_stream(data: bytes) -> Iterator[memoryview]:
    """What :func:`replace_command`'s command reads: ``data`` in chunks (views, no copies), then
    their sha256 on a line of its own. Each chunk is hashed by a thread while it is sent
    (hashlib releases the GIL)."""
    view, digest = memoryview(data), hashlib.sha256()
    with ThreadPoolExecutor(1) as hasher:  # one thread: the chunks are hashed in order
        for start in range(0, len(view), CHUNK):
            chunk = view[start : start + CHUNK]
            hasher.submit(digest.update, chunk)
            yield chunk
    yield memoryview(f"{digest.hexdigest()}\n".encode())
