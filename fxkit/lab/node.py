"""What makes a lab host look like the node an inventory describes (``fxkit lab up --like``),
before the user's playbooks run on it:

- the lab's signed apt mirror (:mod:`fxkit.lab.mirror`), built once per fleet in its folder and
  seen read-only by every host at :data:`~fxkit.lab.mirror.LAB_ROOT`: repo.radeon.com's layout
  for the roles, and the node's distribution archive (kernel headers, nvme-cli, nvmetcli) in
  the host's apt sources, as a node has its distribution's;
- an Ubuntu ``/etc/os-release`` (the mirror's release: ROCm 7.2 supports it) on hosts with
  simulated hardware; their packages stay this machine's (docs/lab.md says so);
- GRUB's defaults file, as an Ubuntu server has it;
- the user the inventory logs in as (``ansible_user``), which the roles may name.

The overlay inventory then gives the roles the mirror's address and key digest.
"""

from __future__ import annotations

import shlex
import subprocess
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from fxkit.lab import mirror
from fxkit.lab.fleet import Fleet
from fxkit.lab.signing import signing_key

#: The release the hosts with simulated hardware say they run (in ROCm 7.2's matrix).
RELEASE = ("24.04.3", "noble")
OS_RELEASE = (
    'PRETTY_NAME="Ubuntu {version} LTS"\nNAME="Ubuntu"\nVERSION_ID="{short}"\n'
    'VERSION="{version} LTS"\nVERSION_CODENAME={codename}\nID=ubuntu\nID_LIKE=debian\n'
    "UBUNTU_CODENAME={codename}\n"
)
GRUB = "/etc/default/grub"
GRUB_TEXT = 'GRUB_DEFAULT=0\nGRUB_TIMEOUT=5\nGRUB_CMDLINE_LINUX_DEFAULT=""\nGRUB_CMDLINE_LINUX=""\n'


def arch() -> str:
    """This machine's dpkg architecture: the hosts run its /usr."""
    return subprocess.run(
        ["dpkg", "--print-architecture"], capture_output=True, text=True, check=True
    ).stdout.strip()


def lab_mirror(fleet: Fleet) -> tuple[dict[str, Any], bytes]:
    """Build the fleet's mirror once (in ``FLEET/mirror``); the overlay's variables for it, and
    its key as apt's keyring takes it."""
    folder = fleet.dir / "mirror"
    digest = folder / "key.sha256"
    dearmored = folder / "key.gpg"
    if not digest.exists():
        with signing_key("fxkit lab mirror") as key:
            built = mirror.build(key, arch(), (RELEASE[1],), mirror.LAB_ROOT, mirror.NODE_PACKAGES)
            tmp = folder.with_name(".mirror.tmp")
            mirror.write(built, tmp)
            (tmp / "key.gpg").write_bytes(key.dearmored())
            (tmp / "key.sha256").write_text(built.key_sha256 + "\n")
            tmp.rename(folder)
    overlay = {
        "rocm_repo_base": f"file://{mirror.LAB_ROOT}",
        "rocm_host_key_sha256": digest.read_text().strip(),
        "rocm_host_apt_arch": arch(),
    }
    return overlay, dearmored.read_bytes()


def prepare(fleet: Fleet, names: list[str], users: dict[str, str], keyring: bytes) -> None:
    """Shape each of ``names`` as its node: where it has simulated hardware, os-release, GRUB's
    file and the mirror's distribution archive; the inventory's login user (``users``)."""

    def one(name: str) -> None:
        with fleet.connect(name) as conn:
            user = users.get(name)
            if user and user != "root":
                conn.run(f"id {shlex.quote(user)} >/dev/null 2>&1 || useradd {shlex.quote(user)}")
            if fleet.profile_of(name):
                version, codename = RELEASE
                text = OS_RELEASE.format(
                    version=version, short=version.rsplit(".", 1)[0], codename=codename
                )
                conn.run("rm -f /etc/os-release")
                conn.put("/etc/os-release", text.encode())
                conn.run(f"test -e {GRUB} || printf %s {shlex.quote(GRUB_TEXT)} > {GRUB}")
                served = mirror.Mirror(mirror.LAB_ROOT, "")
                mirror.add_ubuntu_archive(conn, served, arch(), keyring)

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(one, names))


def login_users(sources: list[str], names: list[str]) -> dict[str, str]:
    """Each host's ``ansible_user`` in the user's inventory, where it is a plain name."""
    from fxkit.inventory import Inventory

    inventory = Inventory.load(sources)
    found = {}
    for name in names:
        user = inventory.hosts[name].vars.get("ansible_user")
        if isinstance(user, str) and user.replace("-", "").replace("_", "").isalnum():
            found[name] = user
    return found
