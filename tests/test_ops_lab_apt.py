"""apt_repository, apt_pin and package_hold on real lab hosts, with the host's real apt.

The repository is a signed one built inside the host: a package, its Packages index and a
Release file clear-signed by a key the real gpg made on the controller. apt-get update then
checks the signature with the keyring fxkit dearmored, so a wrong key fails as it would in the
field. Each operation goes through the ``converge`` pattern of test_ops_lab.py.
"""

from __future__ import annotations

import email.utils
import hashlib
from collections.abc import Iterator

import pytest

from fxkit.connection.base import Connection
from fxkit.facts import FactCache
from fxkit.lab import Fleet
from fxkit.ops.apt import apt_pin, apt_repository, package_hold
from fxkit.ops.base import OpContext, Result, Status
from fxkit.ops.packages import packages
from tests.gpg_helpers import SigningKey, signing_key
from tests.test_ops_lab import converge, sh

pytestmark = pytest.mark.lab

PKG = "fxkit-signed-pkg"
REPO = "/srv/signed"
SOURCES = "/etc/apt/sources.list.d/fxkit-lab.sources"
LIST = "/etc/apt/sources.list.d/fxkit-lab.list"
KEYRING = "/etc/apt/keyrings/fxkit-lab.gpg"
PIN = "/etc/apt/preferences.d/fxkit-lab"


@pytest.fixture(scope="module")
def root(lab_fleet) -> Iterator[Connection]:
    fleet: Fleet = lab_fleet(1, name="opsa")  # of its own: these tests change apt's state
    with fleet.connect("lab01") as conn:
        yield conn


@pytest.fixture(scope="module")
def key() -> Iterator[SigningKey]:
    with signing_key() as made:
        yield made


@pytest.fixture(scope="module")
def arch(root: Connection, key: SigningKey) -> Iterator[str]:
    """A signed repository at file:/srv/signed, suite ``lab``, component ``main``, with
    ``fxkit-signed-pkg`` 1.0; the host's architecture."""
    tools = sh(root, "for t in apt-get dpkg-deb dpkg-scanpackages apt-mark; do command -v $t; done")
    if len(tools.split()) < 4:
        pytest.skip("needs apt-get, apt-mark, dpkg-deb and dpkg-scanpackages on the lab hosts")
    arch = sh(root, "dpkg --print-architecture").strip()
    index = f"main/binary-{arch}/Packages"
    sh(
        root,
        f"set -e; rm -rf {REPO} /tmp/spkg; "
        f"mkdir -p {REPO}/pool {REPO}/dists/lab/main/binary-{arch} /tmp/spkg/DEBIAN "
        f"/tmp/spkg/usr/share/doc/{PKG}; "
        f"echo signed > /tmp/spkg/usr/share/doc/{PKG}/README; "
        f"printf '%s\\n' 'Package: {PKG}' 'Version: 1.0' 'Architecture: all' "
        "'Maintainer: fxkit <fxkit@localhost>' 'Description: fxkit signed test package' "
        "> /tmp/spkg/DEBIAN/control; "
        f"dpkg-deb --root-owner-group --build /tmp/spkg {REPO}/pool/{PKG}_1.0_all.deb >/dev/null; "
        f"cd {REPO} && dpkg-scanpackages --multiversion pool > dists/lab/{index} 2>/dev/null",
    )
    listing = root.get(f"{REPO}/dists/lab/{index}") or b""
    release = (
        "Origin: fxkit-lab\nLabel: fxkit-lab\nSuite: lab\nCodename: lab\n"
        f"Date: {email.utils.formatdate(usegmt=True)}\nArchitectures: {arch}\nComponents: main\n"
        f"SHA256:\n {hashlib.sha256(listing).hexdigest()} {len(listing)} {index}\n"
    )
    root.put(f"{REPO}/dists/lab/InRelease", key.clearsign(release.encode()))
    yield arch
    root.run(
        f"apt-mark unhold {PKG}; dpkg --purge {PKG}; "
        f"rm -rf {REPO} /tmp/spkg {SOURCES} {LIST} {KEYRING} {PIN}"
    )


def policy(root: Connection) -> str:
    return sh(root, f"apt-cache policy {PKG}")


def files(root: Connection) -> tuple[bytes | None, ...]:
    return root.get(SOURCES), root.get(LIST), root.get(KEYRING)


def test_signed_repository_pin_and_hold(root: Connection, key: SigningKey, arch: str) -> None:
    args = ("fxkit-lab", f"file:{REPO}", "lab", "main")
    preview, applied, again = converge(
        root,
        apt_repository,
        *args,
        key=key.armored,
        architectures=arch,
        update=True,
        state=lambda: files(root),
    )
    stanza = (
        f"Types: deb\nURIs: file:{REPO}\nSuites: lab\nComponents: main\n"
        f"Architectures: {arch}\nSigned-By: {KEYRING}\n"
    )
    assert f"binary content of {KEYRING} differs" in preview.diff
    assert "".join(f"+{line}\n" for line in stanza.splitlines()) in preview.diff
    assert preview.data["commands"][-1].startswith("apt-get update -q -o Dir::Etc::SourceList=")
    assert applied.msg.endswith("refreshed apt's index of fxkit-lab")
    assert not applied.data["apt_update_needed"]
    assert files(root) == (stanza.encode(), None, key.dearmored())
    assert sh(root, f"stat -c %a {KEYRING} {SOURCES}") == "644\n644\n"
    assert again.msg == "apt source fxkit-lab as wanted" and not again.data["apt_update_needed"]
    # apt verified the InRelease signature with the keyring and knows the package from it.
    assert "Candidate: 1.0" in policy(root) and f"500 file:{REPO} lab/main" in policy(root)

    # The pin: apt reads the preferences file and ranks the repository's versions at 600.
    pin_path = lambda: root.get(PIN)  # noqa: E731
    preview, applied, _ = converge(
        root, apt_pin, "fxkit-lab", "release o=fxkit-lab", 600, state=pin_path
    )
    assert preview.diff == (
        f"--- /dev/null\n+++ {PIN}\n@@ -0,0 +1,3 @@\n"
        "+Package: *\n+Pin: release o=fxkit-lab\n+Pin-Priority: 600\n"
    )
    assert f"600 file:{REPO} lab/main" in policy(root)

    # Install it from the signed repository, then hold it: apt-mark's own list says so.
    assert packages(OpContext(root, FactCache(root)), PKG).changed
    held = lambda: sh(root, "apt-mark showhold")  # noqa: E731
    preview, applied, again = converge(root, package_hold, [PKG], state=held)
    assert preview.diff == f"{PKG}: unheld -> held\n" and applied.msg == f"held {PKG}"
    assert held() == f"{PKG}\n" and again.msg == "packages held"
    assert sh(root, f"dpkg-query -W -f '${{db:Status-Want}}' {PKG}") == "hold"
    _, applied, again = converge(root, _release, PKG, state=held)
    assert applied.msg == f"unheld {PKG}" and held() == "" and again.msg == "packages unheld"


def _release(ctx: OpContext, names: str) -> Result:
    return package_hold(ctx, names, state="unheld")


def test_one_line_style_replaces_the_stanza_and_a_wrong_key_fails(
    root: Connection, key: SigningKey, arch: str
) -> None:
    ctx = OpContext(root, FactCache(root), diff=True)
    args = ("fxkit-lab", f"file:{REPO}", "lab", "main")
    assert apt_repository(ctx, *args, key=key.armored, architectures=arch).status in (
        Status.OK,
        Status.CHANGED,
    )
    result = apt_repository(ctx, *args, key=key.armored, architectures=arch, style="one-line")
    line = f"deb [arch={arch} signed-by={KEYRING}] file:{REPO} lab main\n"
    assert result.changed and result.data["apt_update_needed"]
    assert result.msg == f"created {LIST}; removed {SOURCES}"
    assert files(root) == (None, line.encode(), key.dearmored())
    refreshed = apt_repository(ctx, *args, key=key.armored, architectures=arch, style="one-line")
    assert refreshed.status is Status.OK  # nothing changed: no update either
    sh(root, f"apt-get update -q -o Dir::Etc::SourceList={LIST} -o Dir::Etc::SourceParts=-")

    with signing_key("someone else") as other:
        wrong = apt_repository(
            ctx, *args, key=other.armored, architectures=arch, style="one-line", update=True
        )
    assert wrong.failed and wrong.data["apt_update_needed"], wrong
    assert "NO_PUBKEY" in wrong.msg or "not signed" in wrong.msg, wrong.msg
    assert root.get(KEYRING) == other.dearmored()

    def removed(ctx: OpContext) -> Result:
        return apt_repository(ctx, *args, state="absent")

    _, applied, again = converge(root, removed, state=lambda: files(root))
    assert applied.msg == f"removed {LIST}; removed {KEYRING}" and files(root) == (None,) * 3
    assert again.msg == "apt source fxkit-lab absent"


def test_a_dnf_host_skips_apt_steps(root: Connection) -> None:
    """The host's own /etc/os-release says Rocky Linux 9 (its /etc is an overlay of its own)."""
    saved = sh(root, "readlink /etc/os-release || true").strip()
    content = root.get("/etc/os-release")
    root.run("rm -f /etc/os-release")
    root.put(
        "/etc/os-release",
        b'NAME="Rocky Linux"\nID="rocky"\nID_LIKE="rhel centos fedora"\nVERSION_ID="9.3"\n'
        b'PRETTY_NAME="Rocky Linux 9.3 (Blue Onyx)"\n',
    )
    try:
        for check in (True, False):
            ctx = OpContext(root, FactCache(root), check=check)
            rocky = "apt hosts only, and this one is Rocky Linux 9.3 (Blue Onyx)"
            hold = package_hold(ctx, "rocm")
            assert hold.status is Status.SKIPPED
            assert hold.msg == f"package holds: {rocky} (dnf: use the versionlock plugin)"
            repo = apt_repository(
                ctx, "rocm", "https://repo.radeon.com/rocm/apt/7.2", "noble", "main"
            )
            assert repo.status is Status.SKIPPED and repo.msg == f"apt source rocm: {rocky}"
            pin = apt_pin(ctx, "rocm", "origin repo.radeon.com", 600)
            assert pin.status is Status.SKIPPED and pin.msg == f"apt pin rocm: {rocky}"
        assert root.get("/etc/apt/sources.list.d/rocm.sources") is None
        assert root.get("/etc/apt/preferences.d/rocm") is None
    finally:
        root.run("rm -f /etc/os-release")
        if saved:
            sh(root, f"ln -s {saved} /etc/os-release")
        elif content is not None:
            root.put("/etc/os-release", content)
