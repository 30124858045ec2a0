"""Replacing a file on a host so that it is always the old file or the new one, whole.

The new content arrives on the command's stdin into a temp file beside the target,
``.NAME.fxkit.PID.XXXXXX`` (PID: the writing shell's). Only when exactly the expected number
of bytes arrived and their sha256 matches is the temp file renamed over the target; a transfer
that broke off (fxkit killed, the link dropped) leaves the old file untouched. The writing shell
removes its temp file on every exit, HUP, INT, PIPE and TERM included; one killed outright
(SIGKILL, a crash) leaves it behind, and the next write of the same file removes it: temp files
whose writing shell is gone (no ``/proc/PID``) are deleted before a new one is made.
"""

from __future__ import annotations

import hashlib
from shlex import quote

#: Between a target's name and the writer's PID in its temp files' names.
TEMP_MARK = ".fxkit."


def replace_command(path: str, data: bytes, *, before_rename: str = "") -> str:
    """The shell command that replaces ``path`` with ``data`` (sent to its stdin).

    ``before_rename`` runs once the content is verified, with ``"$t"`` the temp file and ``"$p"``
    the target (set attributes, keep a backup); when it fails, nothing is renamed. The command
    fails (rc != 0, the reason on stderr) when the content did not arrive whole."""
    size, digest = len(data), hashlib.sha256(data).hexdigest()
    temp = f'"$d/.$n{TEMP_MARK}"'  # a quoted shell word: the prefix of every temp file
    steps = [
        f"p={quote(path)}",
        'd=$(dirname -- "$p")',
        "n=${p##*/}",
        f"for s in {temp}*; do w=${{s#{temp}}}; w=${{w%%.*}}; "
        '[ -f "$s" ] && [ ! -d "/proc/$w" ] && rm -f -- "$s"; done',
        f"t=$(mktemp -- {temp}$$.XXXXXX) || exit 1",
        "trap 'rm -f -- \"$t\"' EXIT",
        "trap 'exit 129' HUP; trap 'exit 130' INT; trap 'exit 141' PIPE; trap 'exit 143' TERM",
        'cat > "$t" || exit 1',
        'got=$(wc -c < "$t")',
        f'[ "$got" -eq {size} ] || {{ echo "fxkit: the transfer broke off after $got of {size} '
        'bytes; $p is unchanged" >&2; exit 1; }',
        # openssl's sha256 (SHA-NI where the CPU has it) is 5-8x faster than coreutils'.
        'if command -v openssl >/dev/null; then sum=$(openssl dgst -sha256 -r < "$t"); '
        'else sum=$(sha256sum < "$t"); fi',
        f'[ "${{sum%% *}}" = {digest} ] || {{ echo "fxkit: the content arrived corrupted '
        '(sha256 differs); $p is unchanged" >&2; exit 1; }',
    ]
    final = 'mv -f -- "$t" "$p"'
    steps.append(f"{before_rename} && {final}" if before_rename else final)
    return "\n".join(steps)
