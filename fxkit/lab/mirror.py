"""A signed local apt mirror laid out like repo.radeon.com, for the roles on lab hosts.

The packages are small stand-ins named ``amdgpu-dkms`` and ``rocm`` (no files of the real ones,
no dependencies), built with the real dpkg-deb and indexed with dpkg-scanpackages on the
controller; amdgpu-dkms's postinst adds and installs its module with ``dkms`` for the running
kernel, as dh_dkms's common.postinst does (skipped, saying so, without the kernel's headers).
An Ubuntu archive beside them holds ``linux-headers-$(uname -r)`` (its /lib/modules/KERNEL/build
link) and ``linux-modules-extra-$(uname -r)``, and, for a lab shaped like an inventory
(:data:`NODE_PACKAGES`), ``nvme-cli`` (Debian 12's real postinst, which writes the host NQN and
ID) and ``nvmetcli``, which the NVMe-oF roles install. Each suite's Release is clear-signed
(InRelease) with a key generated for the mirror (:mod:`fxkit.lab.signing`). The layout is
repo.radeon.com's::

    rocm/rocm.gpg.key                                   the armored public key
    rocm/apt/<rocm_repo>/dists/<codename>/...           rocm (two versions)
    graphics/<graphics_repo>/ubuntu/dists/<codename>/   an empty index
    amdgpu/<amdgpu_repo>/ubuntu/dists/<codename>/...    amdgpu-dkms (two versions)
    ubuntu/dists/<codename>/...                         the kernel's headers and extra modules

AMD's Releases say ``Origin: repo.radeon.com``, as AMD's do, so that the role's pin applies
(the Ubuntu archive's say ``Ubuntu``). ``fxkit lab up --like`` writes it to the fleet's folder
(:func:`write`), which every host sees read-only at :data:`LAB_ROOT`; :func:`install` puts it on
one host instead. The roles then run with ``rocm_repo_base: file://<root>``.
"""

from __future__ import annotations

import email.utils
import hashlib
import os
import subprocess
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from fxkit.connection.base import Connection
from fxkit.errors import FxkitError
from fxkit.lab.signing import SigningKey

ROOT = "/srv/rocm-mirror"
#: Where a lab host sees the fleet's mirror (host-init.sh: read-only).
LAB_ROOT = "/srv/fxkit-lab-mirror"
POSTINST = Path(__file__).with_name("packages") / "nvme-cli.postinst"
REPOS = {"rocm": "7.2.2", "graphics": "7.2.1", "amdgpu": "30.30", "ubuntu": ""}
#: The lab hosts' kernel: they run on this machine's.
KERNEL = os.uname().release
#: Stand-in packages: name -> (the repository holding them, versions, oldest first). The newest
#: amdgpu-dkms builds amdgpu 6.19.14, the version the mi308x profile's loaded amdgpu says.
PACKAGES = {
    "rocm": ("rocm", ("7.2.1.70201-1", "7.2.2.70202-1")),
    "amdgpu-dkms": ("amdgpu", ("6.19.13.30300-1", "6.19.14.30301-1")),
    f"linux-headers-{KERNEL}": ("ubuntu", ("1",)),
    f"linux-modules-extra-{KERNEL}": ("ubuntu", ("1",)),
}
#: What a node's distribution has besides (Debian 12, the hosts' base, has no nvmetcli).
NODE_PACKAGES = {
    "nvme-cli": ("ubuntu", ("2.4+really2.3-3",)),
    "nvmetcli": ("ubuntu", ("0.8-1",)),
}
#: The Ubuntu archive's source line on the hosts (the role does not write it: it is the node's).
UBUNTU_LIST = "/etc/apt/sources.list.d/fxkit-lab-ubuntu.list"


def dkms_version(version: str) -> str:
    """The DKMS version of a stand-in amdgpu-dkms: ``6.19.14.30301-1`` -> ``6.19.14-30301``
    (as AMD's ``1:6.14.14.60404...-2204008.24.04`` builds ``amdgpu/6.14.14-2204008.24.04``)."""
    upstream = version.split("-")[0].split(".")
    return f"{'.'.join(upstream[:3])}-{upstream[3]}"


@dataclass
class Mirror:
    root: str
    key_sha256: str
    #: Relative path -> content.
    files: dict[str, bytes] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return f"file://{self.root}"


def repo_dir(repo: str) -> str:
    """A repository's folder below the mirror's root, as on repo.radeon.com."""
    version = REPOS[repo]
    if repo == "ubuntu":
        return "ubuntu"
    return f"rocm/apt/{version}" if repo == "rocm" else f"{repo}/{version}/ubuntu"


def build(
    key: SigningKey,
    arch: str,
    codenames: tuple[str, ...] = ("jammy", "noble"),
    root: str = ROOT,
    extra: Mapping[str, tuple[str, tuple[str, ...]]] | None = None,
) -> Mirror:
    """The mirror's files, built on the controller, to be served at ``root``; ``extra``:
    more packages (:data:`NODE_PACKAGES`)."""
    armored = key.armored.encode()
    mirror = Mirror(root, hashlib.sha256(armored).hexdigest(), {"rocm/rocm.gpg.key": armored})
    packages = {**PACKAGES, **(extra or {})}
    with tempfile.TemporaryDirectory(prefix="fxrocm") as tmp:
        work = Path(tmp)
        for repo in REPOS:
            top = work / repo_dir(repo)
            pool = top / "pool" / "main"
            pool.mkdir(parents=True)
            for name, (holder, versions) in packages.items():
                if holder == repo:
                    for version in versions:
                        _package(work / "build", name, version, arch, pool)
            index = subprocess.run(
                ["dpkg-scanpackages", "--multiversion", "pool"],
                cwd=top, capture_output=True, check=True,
            ).stdout  # fmt: skip
            for deb in pool.rglob("*.deb"):
                mirror.files[str(deb.relative_to(work))] = deb.read_bytes()
            for codename in codenames:
                dists = f"{repo_dir(repo)}/dists/{codename}"
                listing = f"main/binary-{arch}/Packages"
                mirror.files[f"{dists}/{listing}"] = index
                origin = "Ubuntu" if repo == "ubuntu" else "repo.radeon.com"
                mirror.files[f"{dists}/InRelease"] = key.clearsign(
                    _release(codename, arch, listing, index, origin)
                )
    return mirror


def _package(build_dir: Path, name: str, version: str, arch: str, pool: Path) -> None:
    root = build_dir / f"{name}-{version}"
    (root / "DEBIAN").mkdir(parents=True)
    doc = root / "usr" / "share" / "doc" / name
    doc.mkdir(parents=True)
    (doc / "README").write_text(f"fxkit lab stand-in for {name} {version}\n")
    _contents(root, name, version)
    (root / "DEBIAN" / "control").write_text(
        f"Package: {name}\nVersion: {version}\nArchitecture: {arch}\n"
        "Maintainer: fxkit <fxkit@localhost>\n"
        f"Description: fxkit lab stand-in for {name} (not the real package)\n"
    )
    folder = pool / name[0] / name
    folder.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        ["dpkg-deb", "--root-owner-group", "--build", str(root),
         str(folder / f"{name}_{version}_{arch}.deb")],
        capture_output=True, check=True,
    )  # fmt: skip


def _contents(root: Path, name: str, version: str) -> None:
    """What the stand-in holds beyond its README: the headers' build link, the extra modules'
    folder, amdgpu-dkms's postinst."""
    modules = root / "usr" / "lib" / "modules" / KERNEL
    if name.startswith("linux-headers-"):
        (root / "usr" / "src" / name).mkdir(parents=True)
        (root / "usr" / "src" / name / "Makefile").write_text("# fxkit lab stand-in\n")
        modules.mkdir(parents=True)
        (modules / "build").symlink_to(f"/usr/src/{name}")
    elif name.startswith("linux-modules-extra-"):
        (modules / "kernel" / "fxkit-lab-extra").mkdir(parents=True)
    elif name == "nvme-cli":
        (root / "etc" / "nvme").mkdir(parents=True)
        postinst = root / "DEBIAN" / "postinst"
        postinst.write_text(nvme_cli_postinst())
        postinst.chmod(0o755)
    elif name == "amdgpu-dkms":
        dkms = dkms_version(version)
        postinst = root / "DEBIAN" / "postinst"
        postinst.write_text(
            # The lab's dkms is in /usr/local/bin, which dpkg's PATH for maintainer scripts
            # may lack (a node's is /usr/sbin/dkms).
            '#!/bin/sh\nset -e\nPATH="/usr/local/bin:$PATH"\ncommand -v dkms >/dev/null || exit 0\n'
            f"dkms add -m amdgpu -v {dkms}\nk=$(uname -r)\n"
            f'if [ -e "/lib/modules/$k/build" ]; then dkms install -m amdgpu -v {dkms} -k "$k"\n'
            'else echo "Module build for kernel $k was skipped since the kernel headers for this '
            'kernel do not seem to be installed."; fi\n'
        )
        postinst.chmod(0o755)


def nvme_cli_postinst() -> str:
    """Debian 12's nvme-cli 2.4+really2.3-3 postinst (packages/nvme-cli.postinst; its source:
    tests/data/reference/SOURCES.md), the two tools it runs replaced by what they print where
    they are absent (the stand-in ships no executables): ``nvme gen-hostnqn`` an NQN of a random
    UUID (libnvme's way on a machine without a DMI product UUID), ``uuidgen`` a random UUID."""
    text = POSTINST.read_text()
    random = "cat /proc/sys/kernel/random/uuid"
    nqn = f'echo "nqn.2014-08.org.nvmexpress:uuid:$({random})"'
    return text.replace("nvme gen-hostnqn", nqn).replace("uuidgen", random)


def write(mirror: Mirror, folder: Path) -> None:
    """The mirror's files below ``folder`` (readable by all, as a web server's are)."""
    for path, content in mirror.files.items():
        target = folder / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(content)
        target.chmod(0o644)
    for directory in [folder, *folder.rglob("*")]:
        if directory.is_dir():
            directory.chmod(0o755)


def _release(codename: str, arch: str, listing: str, index: bytes, origin: str) -> bytes:
    return (
        f"Origin: {origin}\nLabel: {origin}\n"
        f"Suite: {codename}\nCodename: {codename}\n"
        f"Date: {email.utils.formatdate(usegmt=True)}\n"
        f"Architectures: {arch}\nComponents: main\n"
        f"SHA256:\n {hashlib.sha256(index).hexdigest()} {len(index)} {listing}\n"
    ).encode()


def _run(conn: Connection, command: str) -> str:
    result = conn.run(command)
    if not result.ok:
        raise FxkitError(
            f"{command.split()[0]} exited {result.rc}: {(result.stderr or result.stdout)[-300:]}",
            where=f"host {conn.name}",
        )
    return result.stdout


def install(conn: Connection, mirror: Mirror) -> None:
    """Put the mirror's files on a host, below ``mirror.root``."""
    folders = sorted({str(Path(mirror.root, p).parent) for p in mirror.files})
    _run(conn, f"rm -rf {mirror.root} && mkdir -p " + " ".join(folders))
    for path, content in mirror.files.items():
        conn.put(f"{mirror.root}/{path}", content)
    # As a web server's files are: readable by apt's unprivileged _apt user too.
    _run(conn, f"chmod -R a+rX {mirror.root}")


def add_ubuntu_archive(conn: Connection, mirror: Mirror, arch: str, dearmored: bytes) -> None:
    """The node's own Ubuntu archive (the mirror's), as a node has its distribution's before
    the role runs: its source, the key it is signed with, apt's index of it."""
    keyring = "/etc/apt/keyrings/fxkit-lab-ubuntu.gpg"
    _run(conn, "mkdir -p /etc/apt/keyrings")
    conn.put(keyring, dearmored)
    codename = _run(conn, ". /etc/os-release && echo $VERSION_CODENAME").strip()
    line = f"deb [arch={arch} signed-by={keyring}] {mirror.url}/ubuntu {codename} main\n"
    conn.put(UBUNTU_LIST, line.encode())
    _run(
        conn,
        f"chmod 644 {keyring} {UBUNTU_LIST} && apt-get update -q "
        f"-o Dir::Etc::sourcelist={UBUNTU_LIST} -o Dir::Etc::sourceparts=- "
        "-o APT::Get::List-Cleanup=0",
    )
