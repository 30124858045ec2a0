"""A signed local mirror laid out like repo.radeon.com, for the rocm_host role on lab hosts.

The packages are small stand-ins named ``amdgpu-dkms`` and ``rocm`` (no files of the real ones,
no dependencies), built with the real dpkg-deb and indexed with dpkg-scanpackages on the
controller; each suite's Release is clear-signed (InRelease) with a key generated for the run
(tests/gpg_helpers.py). The layout is repo.radeon.com's::

    rocm/rocm.gpg.key                                   the armored public key
    rocm/apt/<rocm_repo>/dists/<codename>/...           rocm (two versions)
    graphics/<graphics_repo>/ubuntu/dists/<codename>/   an empty index
    amdgpu/<amdgpu_repo>/ubuntu/dists/<codename>/...    amdgpu-dkms (two versions)

Releases say ``Origin: repo.radeon.com``, as AMD's do, so that the role's pin applies. Put on a
host with :func:`install`; the role then runs with ``rocm_repo_base: file://<root>``.
"""

from __future__ import annotations

import email.utils
import hashlib
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from fxkit.connection.base import Connection
from tests.gpg_helpers import SigningKey

ROOT = "/srv/rocm-mirror"
REPOS = {"rocm": "7.2.2", "graphics": "7.2.1", "amdgpu": "30.30"}
#: Stand-in packages: name -> (the repository holding them, versions, oldest first).
PACKAGES = {
    "rocm": ("rocm", ("7.2.1.70201-1", "7.2.2.70202-1")),
    "amdgpu-dkms": ("amdgpu", ("6.16.6.30300-1", "6.16.13.30301-1")),
}


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
    return f"rocm/apt/{version}" if repo == "rocm" else f"{repo}/{version}/ubuntu"


def build(key: SigningKey, arch: str, codenames: tuple[str, ...] = ("jammy", "noble")) -> Mirror:
    """The mirror's files, built on the controller."""
    armored = key.armored.encode()
    mirror = Mirror(ROOT, hashlib.sha256(armored).hexdigest(), {"rocm/rocm.gpg.key": armored})
    with tempfile.TemporaryDirectory(prefix="fxrocm") as tmp:
        work = Path(tmp)
        for repo in REPOS:
            top = work / repo_dir(repo)
            pool = top / "pool" / "main"
            pool.mkdir(parents=True)
            for name, (holder, versions) in PACKAGES.items():
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
                mirror.files[f"{dists}/InRelease"] = key.clearsign(
                    _release(codename, arch, listing, index)
                )
    return mirror


def _package(build_dir: Path, name: str, version: str, arch: str, pool: Path) -> None:
    root = build_dir / f"{name}-{version}"
    (root / "DEBIAN").mkdir(parents=True)
    doc = root / "usr" / "share" / "doc" / name
    doc.mkdir(parents=True)
    (doc / "README").write_text(f"fxkit lab stand-in for {name} {version}\n")
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


def _release(codename: str, arch: str, listing: str, index: bytes) -> bytes:
    return (
        "Origin: repo.radeon.com\nLabel: repo.radeon.com\n"
        f"Suite: {codename}\nCodename: {codename}\n"
        f"Date: {email.utils.formatdate(usegmt=True)}\n"
        f"Architectures: {arch}\nComponents: main\n"
        f"SHA256:\n {hashlib.sha256(index).hexdigest()} {len(index)} {listing}\n"
    ).encode()


def install(conn: Connection, mirror: Mirror) -> None:
    """Put the mirror's files on a host, below ``mirror.root``."""
    folders = sorted({str(Path(mirror.root, p).parent) for p in mirror.files})
    result = conn.run(f"rm -rf {mirror.root} && mkdir -p " + " ".join(folders))
    assert result.ok, result
    for path, content in mirror.files.items():
        conn.put(f"{mirror.root}/{path}", content)
    # As a web server's files are: readable by apt's unprivileged _apt user too.
    result = conn.run(f"chmod -R a+rX {mirror.root}")
    assert result.ok, result
