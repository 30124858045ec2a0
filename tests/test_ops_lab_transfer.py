"""copy, download and mount on real lab hosts (the ``converge`` pattern of test_ops_lab.py).

download fetches from an HTTP server started inside the host on 127.0.0.1 (lab hosts have no
route out) and stopped by the test. Lab hosts lack CAP_SYS_ADMIN: mount's fstab entry converges,
the mount and umount steps are skipped with that reason.
"""

from __future__ import annotations

import hashlib
import os
import re
import shlex
from collections.abc import Iterator
from pathlib import Path

import pytest
from sync_helpers import when

from fxkit.connection.base import Connection
from fxkit.facts import FactCache
from fxkit.lab import SUDO_USER, Fleet
from fxkit.ops.base import OpContext, Result, Status
from fxkit.ops.mounts import mount
from fxkit.ops.transfer import copy, download, download_command
from tests.test_ops_lab import converge, sh

pytestmark = pytest.mark.lab

UUID = "UUID=0b3c4f5e-8d4a-4c7e-9f1a-2a6e3c1d9b7f"
NO_CAP = "this host lacks CAP_SYS_ADMIN (a container?); the fstab entry applies at boot"


@pytest.fixture(scope="module")
def fleet(lab_fleet) -> Fleet:
    return lab_fleet(1, name="opsa")


@pytest.fixture(scope="module")
def root(fleet: Fleet) -> Iterator[Connection]:
    with fleet.connect("lab01") as conn:
        yield conn


def digest_on_host(root: Connection, path: str) -> str:
    return root.run(f"sha256sum < {shlex.quote(path)} 2>/dev/null").stdout.split(" ")[0]


def test_copy_a_controller_artifact(root: Connection, tmp_path: Path) -> None:
    src, dest = tmp_path / "model.tar", "/srv/artifacts/model.tar"
    data = os.urandom(8 << 20)
    src.write_bytes(data)
    digest = hashlib.sha256(data).hexdigest()
    sh(root, "rm -rf /srv/artifacts && mkdir -p /srv/artifacts")

    preview, applied, again = converge(
        root,
        copy,
        str(src),
        dest,
        mode="0640",
        sha256=digest,
        state=lambda: digest_on_host(root, dest),
    )
    assert preview.diff == f"{dest}: absent -> sha256 {digest} ({len(data)} bytes from {src})\n"
    assert applied.msg == f"created {dest}" and again.msg == "file as wanted"
    assert digest_on_host(root, dest) == digest
    assert sh(root, f"stat -c %a:%s {dest}") == f"640:{len(data)}\n"

    src.write_bytes(b"tampered")
    refused = copy(OpContext(root, FactCache(root)), str(src), dest, sha256=digest)
    assert refused.failed and "nothing copied to /srv/artifacts/model.tar" in refused.msg
    assert digest_on_host(root, dest) == digest
    missing = copy(OpContext(root, FactCache(root)), str(src), "/srv/none/model.tar")
    assert missing.failed and "/srv/none is not a directory on the host" in missing.msg
    assert sh(root, "ls -A /srv/artifacts") == "model.tar\n"  # no temp file left


def test_copy_through_become(fleet: Fleet, tmp_path: Path) -> None:
    password = fleet.become_password()
    if password is None:
        pytest.skip("sudo is not installed: lab hosts have no non-root user (apt-get install sudo)")
    src, dest = tmp_path / "key.bin", "/etc/fxkit-copied.bin"
    src.write_bytes(os.urandom(1 << 20))
    digest = hashlib.sha256(src.read_bytes()).hexdigest()
    with (
        fleet.connect("lab01") as root,
        fleet.connect("lab01", ansible_user=SUDO_USER, ansible_become_password=password) as user,
    ):
        converge(
            user,
            copy,
            str(src),
            dest,
            mode="0600",
            become=True,
            state=lambda: digest_on_host(root, dest),
        )
        assert digest_on_host(root, dest) == digest
        assert sh(root, f"stat -c %U:%a {dest}") == "root:600\n"
        sh(root, f"rm -f {dest}")


@pytest.fixture
def served(root: Connection) -> Iterator[str]:
    """http://127.0.0.1:PORT/ of python3's http.server inside the host, serving /srv/www."""
    if not root.run("command -v python3").ok:
        pytest.skip("needs python3 on the lab hosts")
    pid = sh(
        root,
        "rm -rf /srv/www /srv/dl && mkdir -p /srv/www /srv/dl && cd /srv/www && "
        "{ nohup python3 -u -m http.server 0 --bind 127.0.0.1 >/tmp/fxkit-http.log 2>&1 "
        "</dev/null & echo $!; }",
    ).strip()
    try:
        when(lambda: b"port " in (root.get("/tmp/fxkit-http.log") or b""), "the server listened")
        found = re.search(r"port (\d+)", (root.get("/tmp/fxkit-http.log") or b"").decode())
        assert found, root.get("/tmp/fxkit-http.log")
        yield f"http://127.0.0.1:{found[1]}"
    finally:
        root.run(f"kill {pid}")


def test_download_from_a_site_mirror(root: Connection, served: str) -> None:
    sh(root, "head -c 3000000 /dev/urandom > /srv/www/rocm.tar")
    digest = digest_on_host(root, "/srv/www/rocm.tar")
    url, dest = f"{served}/rocm.tar", "/srv/dl/rocm.tar"

    preview, applied, again = converge(
        root, download, url, dest, digest, mode="0644", state=lambda: digest_on_host(root, dest)
    )
    assert preview.msg == f"would download {url} to {dest}"
    assert preview.diff == f"{dest}: absent -> sha256 {digest} ({url})\n"
    assert applied.msg == f"downloaded {url} to {dest}" and again.status is Status.OK
    assert digest_on_host(root, dest) == digest

    # The mirror's file changed: refused, the verified file stays.
    sh(root, "echo other > /srv/www/rocm.tar")
    other = digest_on_host(root, "/srv/www/rocm.tar")
    stale = download(OpContext(root, FactCache(root)), url, "/srv/dl/new.tar", digest)
    assert stale.failed and f"has sha256 {other}, not the expected {digest}" in stale.msg
    assert "/srv/dl/new.tar is unchanged" in stale.msg
    gone = download(OpContext(root, FactCache(root)), f"{served}/none", "/srv/dl/x", digest)
    assert gone.failed and "404" in gone.msg, gone.msg
    assert sh(root, "ls -A /srv/dl") == "rocm.tar\n"  # nothing partial, no temp file
    assert digest_on_host(root, dest) == digest

    # The same command with wget, where the host has it.
    if root.run("command -v wget").ok:
        fetched = root.run(download_command(url, "/srv/dl/w.tar", other, "wget", None, None, None))
        assert fetched.ok, fetched
        assert digest_on_host(root, "/srv/dl/w.tar") == other


@pytest.fixture
def fstab(root: Connection) -> Iterator[str]:
    saved = root.get("/etc/fstab")
    yield "/etc/fstab"
    if saved is None:
        root.run("rm -f /etc/fstab")
    else:
        root.put("/etc/fstab", saved)


def test_mount_entry_converges_and_mounting_is_skipped(root: Connection, fstab: str) -> None:
    path = "/srv/my models"
    line = f"{UUID} /srv/my\\040models xfs defaults,_netdev,nofail 0 2"
    before = root.get(fstab) or b""

    preview, applied, again = converge(
        root,
        mount,
        path,
        UUID,
        "xfs",
        opts=["defaults", "_netdev", "nofail"],
        passno=2,
        state=lambda: root.get(fstab),
    )
    assert preview.diff.endswith(f"+{line}\n")
    assert applied.msg == f"updated {fstab}; mount {path} skipped: {NO_CAP}"
    assert root.get(fstab) == before + f"{line}\n".encode()
    assert again.status is Status.SKIPPED
    assert again.msg == f"{fstab} entry as wanted; mount {path} skipped: {NO_CAP}"
    assert root.run(f"test -e {shlex.quote(path)}").rc == 1  # no mount point made for nothing

    # /tmp is mounted in the host (a tmpfs): unmounting it is the step that cannot run.
    def unmount_tmp(ctx: OpContext) -> Result:
        return mount(ctx, "/tmp", "tmpfs", "tmpfs", state="unmounted")

    _, applied, again = converge(root, unmount_tmp, state=lambda: root.get(fstab))
    assert applied.msg == f"updated {fstab}; unmount /tmp skipped: {NO_CAP}"
    assert again.status is Status.SKIPPED

    def remove(ctx: OpContext, point: str) -> Result:
        return mount(ctx, point, state="absent")

    converge(root, remove, path, state=lambda: root.get(fstab))
    _, applied, _ = converge(root, remove, "/tmp", state=lambda: root.get(fstab))
    assert applied.msg == f"updated {fstab}; unmount /tmp skipped: {NO_CAP}"
    assert root.get(fstab) == before
