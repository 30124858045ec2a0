"""Two writers of one file on a real lab host (issue 27, item 7): every read-modify-write
operation (line, block, sysctl, mount's fstab, kernel_cmdline) keeps what another writer changed
between its read and its write, or fails clearly; ``line`` gets mode, owner and group.

The interleaving is not left to chance: :class:`Interleaved` runs the other writer's edit, to the
end, right after the operation's read and before its write (the explicit synchronisation point),
over a second SSH connection to the same host, as a second ``fxkit play`` would.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pytest

from fxkit.connection.base import Connection
from fxkit.facts import FactCache
from fxkit.lab import Fleet
from fxkit.ops.base import OpContext, Result, Status
from fxkit.ops.files import EDIT_ATTEMPTS
from fxkit.ops.kernel import kernel_cmdline, sysctl
from fxkit.ops.lines import block, line
from fxkit.ops.mounts import mount

pytestmark = pytest.mark.lab

DIR = "/srv/fxkit-concurrent"
UUID = "UUID=0b3c4f5e-8d4a-4c7e-9f1a-2a6e3c1d9b7f"


@dataclass
class Interleaved(OpContext):
    """An operation's context whose first ``times`` file reads are each followed by
    ``meanwhile()``: another writer's whole edit, between this operation's read and its write."""

    meanwhile: Callable[[], object] = lambda: None
    times: int = 1

    def get(self, path: str) -> bytes | None:
        content = super().get(path)
        if self.times > 0:
            self.times -= 1
            self.meanwhile()
        return content


def context(conn: Connection, **kwargs: object) -> OpContext:
    return OpContext(conn, FactCache(conn), **kwargs)  # type: ignore[arg-type]


@pytest.fixture
def other(fleet: Fleet) -> Iterator[Connection]:
    """The other writer: a second root connection to the same host."""
    with fleet.connect("lab01") as conn:
        yield conn


@pytest.fixture
def folder(root: Connection) -> Iterator[str]:
    assert root.run(f"rm -rf {DIR} && mkdir -p {DIR}").ok
    yield DIR
    assert root.run(f"rm -rf {DIR}").ok


def text(conn: Connection, path: str) -> str:
    return (conn.get(path) or b"").decode()


#: Each read-modify-write operation: the file before, the call, and the file after it when the
#: other writer added "# edited meanwhile" between the call's read and its write.
EDITS: dict[str, tuple[str, Callable[[OpContext, str], Result], str]] = {
    "line": (
        "a = 1\n",
        lambda ctx, p: line(ctx, p, "mine = 2"),
        "a = 1\n# edited meanwhile\nmine = 2\n",
    ),
    "block": (
        "a = 1\n",
        lambda ctx, p: block(ctx, p, "mine = 2"),
        "a = 1\n# edited meanwhile\n"
        "# BEGIN FXKIT MANAGED BLOCK\nmine = 2\n# END FXKIT MANAGED BLOCK\n",
    ),
    "sysctl": (
        "vm.dirty_ratio = 5\n",
        lambda ctx, p: sysctl(ctx, "vm.swappiness", 7, file=p),
        "vm.dirty_ratio = 5\n# edited meanwhile\nvm.swappiness = 7\n",
    ),
    "mount": (
        "/dev/sda1 / ext4 defaults 0 1\n",
        lambda ctx, p: mount(ctx, "/mnt/models", UUID, "xfs", state="present", fstab=p),
        f"/dev/sda1 / ext4 defaults 0 1\n# edited meanwhile\n{UUID} /mnt/models xfs defaults 0 0\n",
    ),
    "kernel_cmdline": (
        'GRUB_CMDLINE_LINUX_DEFAULT="quiet"\n',
        lambda ctx, p: kernel_cmdline(ctx, ["iommu=pt"], grub_file=p, update_grub=False),
        'GRUB_CMDLINE_LINUX_DEFAULT="quiet iommu=pt"\n# edited meanwhile\n',
    ),
}


@pytest.mark.parametrize("name", EDITS)
def test_an_edit_made_between_the_read_and_the_write_is_kept(
    root: Connection, other: Connection, folder: str, name: str
) -> None:
    before, call, after = EDITS[name]
    path = f"{folder}/{name}.conf"
    root.put(path, before.encode())

    def meanwhile() -> None:
        assert line(context(other), path, "# edited meanwhile").changed

    result = call(Interleaved(root, FactCache(root), meanwhile=meanwhile), path)
    assert result.changed and not result.failed, result
    assert text(root, path) == after


def test_two_writers_of_30_lines_each_lose_none(
    root: Connection, other: Connection, folder: str
) -> None:
    """Each of writer A's 30 lines is read, then writer B adds one of its own lines, whole, then
    A writes: without the compare-and-swap A's write drops B's line, 30 times."""
    path = f"{folder}/limits.conf"
    for i in range(30):

        def meanwhile(i: int = i) -> None:
            assert line(context(other), path, f"b {i}").changed

        result = line(Interleaved(root, FactCache(root), meanwhile=meanwhile), path, f"a {i}")
        assert result.changed and not result.failed, result
    lines = text(root, path).splitlines()
    assert sorted(lines) == sorted([f"a {i}" for i in range(30)] + [f"b {i}" for i in range(30)])


def test_a_file_that_keeps_changing_fails_clearly_and_loses_nothing(
    root: Connection, other: Connection, folder: str
) -> None:
    path = f"{folder}/busy.conf"
    root.put(path, b"a = 1\n")
    count = iter(range(100))

    def meanwhile() -> None:
        assert line(context(other), path, f"other {next(count)}").changed

    ctx = Interleaved(root, FactCache(root), meanwhile=meanwhile, times=100)
    result = line(ctx, path, "mine = 2")
    assert result.status is Status.FAILED, result
    assert path in result.msg and f"{EDIT_ATTEMPTS} times" in result.msg, result.msg
    assert text(root, path) == "a = 1\n" + "".join(f"other {i}\n" for i in range(EDIT_ATTEMPTS))
    assert root.run(f"ls -A {folder}").stdout == "busy.conf\n"  # no temp file left behind


def test_check_mode_reads_once_and_writes_nothing(root: Connection, folder: str) -> None:
    path = f"{folder}/check.conf"
    root.put(path, b"a = 1\n")
    ctx = Interleaved(root, FactCache(root), check=True, diff=True)
    result = line(ctx, path, "mine = 2")
    assert result.msg == f"would update {path}" and "+mine = 2\n" in (result.diff or "")
    assert text(root, path) == "a = 1\n"


# -- line's mode, owner and group -------------------------------------------------------------


def stat(conn: Connection, path: str) -> str:
    return conn.run(f"stat -c %U:%G:%a {shlex.quote(path)}").stdout.strip()


def test_line_sets_mode_owner_and_group_with_check_mode_and_diff(
    root: Connection, folder: str, sudo_user: str
) -> None:
    path = f"{folder}/token.env"
    who = dict(owner=sudo_user, group=sudo_user)

    preview = line(context(root, check=True, diff=True), path, "TOKEN=hunter2", mode="0600", **who)
    assert preview.msg == f"would create {path}" and "+TOKEN=hunter2\n" in (preview.diff or "")
    assert root.get(path) is None
    created = line(context(root), path, "TOKEN=hunter2", mode="0600", **who)
    assert created.changed and stat(root, path) == f"{sudo_user}:{sudo_user}:600"
    assert line(context(root), path, "TOKEN=hunter2", mode="0600", **who).status is Status.OK

    # Content as wanted, attributes not: only they change, each step shown and idempotent.
    assert root.run(f"chmod 644 {path} && chown root:root {path}").ok
    preview = line(context(root, check=True, diff=True), path, "TOKEN=hunter2", mode=0o600, **who)
    assert preview.diff == (
        f"mode: 0644 -> 0600\nowner: root -> {sudo_user}\ngroup: root -> {sudo_user}\n"
    )
    assert stat(root, path) == "root:root:644"
    changed = line(context(root, diff=True), path, "TOKEN=hunter2", mode=0o600, **who)
    assert changed.msg == (
        f"changed mode 0644 -> 0600, owner root -> {sudo_user}, group root -> {sudo_user} of {path}"
    )
    assert stat(root, path) == f"{sudo_user}:{sudo_user}:600"

    # New content and a new mode at once: one write, the temp file has the mode before the
    # rename; the diff says both. A secret line stays out of the diff.
    both = line(context(root, diff=True), path, "TOKEN=swordfish", regexp="^TOKEN=", mode="0640")
    assert both.changed and both.diff == (
        f"mode: 0600 -> 0640\n--- {path}\n+++ {path}\n@@ -1 +1 @@\n-TOKEN=hunter2\n"
        "+TOKEN=swordfish\n"
    )
    assert stat(root, path) == f"{sudo_user}:{sudo_user}:640"
    hidden = line(
        context(root, diff=True), path, "TOKEN=x", regexp="^TOKEN=", mode="0600", secret=True
    )
    assert hidden.diff == f"mode: 0640 -> 0600\ncontent of {path} changed (hidden: secret)\n"
    assert text(root, path) == "TOKEN=x\n" and stat(root, path).endswith(":600")


def test_block_and_line_through_become_keep_an_edit_made_meanwhile(
    fleet: Fleet, root: Connection, folder: str, sudo_user: str
) -> None:
    """A root-only file edited through sudo: the digest and the rename run as root too."""
    path = f"{folder}/secret.conf"
    root.put(path, b"a = 1\n")
    assert root.run(f"chmod 600 {path}").ok
    password = fleet.become_password()
    count = iter(range(2))
    with fleet.connect("lab01", ansible_user=sudo_user, ansible_become_password=password) as user:

        def meanwhile() -> None:
            assert line(context(root), path, f"# edited meanwhile {next(count)}").changed

        ctx = Interleaved(user, FactCache(user), become=True, meanwhile=meanwhile)
        assert line(ctx, path, "key = 2", mode="0600").changed
        ctx = Interleaved(user, FactCache(user), become=True, meanwhile=meanwhile)
        assert block(ctx, path, "b = 3").changed
    assert text(root, path).splitlines() == [
        "a = 1",
        "# edited meanwhile 0",
        "key = 2",
        "# edited meanwhile 1",
        "# BEGIN FXKIT MANAGED BLOCK",
        "b = 3",
        "# END FXKIT MANAGED BLOCK",
    ]
    assert stat(root, path) == "root:root:600"
