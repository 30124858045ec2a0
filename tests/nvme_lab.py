"""Helpers of the NVMe role tests: the first wrong variable of a host as a play names it; on lab
hosts, stand-in packages in a local apt repository of the host, and ``fxkit play`` of one role
with variables.

nvmetcli is not in Debian 12 (this machine) and nvme-cli should not have to be installed on it,
so the tests give each lab host a file: apt repository holding small packages of those names
(built with dpkg-deb, documentation only: no executables, so every fact still finds no tool, as on
a host without NVMe-oF): the roles' install steps then run apt for real. The nvme-cli stand-in
can carry Debian's real postinst (:func:`fxkit.lab.mirror.nvme_cli_postinst`): installing it
then writes /etc/nvme/hostnqn and /etc/nvme/hostid as the real package does.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml
from test_play_lab import Run, cli_play, fxkit_play, write_inventory

from fxkit.connection.base import Connection
from fxkit.engine.role import Role
from fxkit.engine.rolevars import check_vars
from fxkit.engine.variables import HostVars
from fxkit.errors import VarError
from fxkit.lab import Fleet
from tests.lab_helpers import sh

REPO = "/srv/fxkit-nvme-repo"
SOURCES = "/etc/apt/sources.list.d/fxkit-nvme-test.list"


def refusal(role: Role, v: HostVars) -> VarError:
    """The first problem of one host's values, as a play names it before any host is touched:
    a wrong type or value (the role's ``Vars``), else what the role's ``validate`` finds."""
    assert role.vars_model is not None and role.validate is not None
    typed, wrong = check_vars(role.vars_model, v)
    if wrong:
        assert isinstance(wrong[0], VarError)
        return wrong[0]
    with pytest.raises(VarError) as caught:
        role.validate(typed)
    return caught.value


def place(problem: VarError) -> str:
    """The variable or key a problem names: its where, after the host and before where the
    value was set."""
    return problem.where.split(": ", 1)[1].rsplit(" (", 1)[0]


def stand_in_packages(
    conn: Connection, *names: str, postinst: Mapping[str, str] | None = None
) -> None:
    """Packages ``names`` (version 0.0-fxkit) in a local repository the host's apt knows; a
    package in ``postinst`` runs that script when it is configured (and ships /etc/nvme, as
    nvme-cli does)."""
    script = ["set -e", f"rm -rf {REPO} /tmp/fxkit-pkgs", f"mkdir -p {REPO}"]
    for name in names:
        root = f"/tmp/fxkit-pkgs/{name}"
        control = "\n".join(
            [
                f"Package: {name}",
                "Version: 0.0-fxkit",
                "Architecture: all",
                "Maintainer: fxkit tests <fxkit@localhost>",
                f"Description: stand-in for {name} in fxkit's lab tests (no executables)",
                "",
            ]
        )
        script += [
            f"mkdir -p {root}/DEBIAN {root}/usr/share/doc/{name}",
            f"printf %s {shlex.quote(control)} > {root}/DEBIAN/control",
            f"echo 'fxkit lab stand-in' > {root}/usr/share/doc/{name}/README",
            f"dpkg-deb --root-owner-group --build {root} {REPO}/{name}.deb >/dev/null",
        ]
        if name in (postinst or {}):
            script[-1:-1] = [
                f"mkdir -p {root}/etc/nvme",
                f"printf %s {shlex.quote((postinst or {})[name])} > {root}/DEBIAN/postinst",
                f"chmod 755 {root}/DEBIAN/postinst",
            ]
    script.append(f"cd {REPO} && dpkg-scanpackages --multiversion . > Packages 2>/dev/null")
    sh(conn, " && ".join(script))
    conn.put(SOURCES, f"deb [trusted=yes] file:{REPO} ./\n".encode())
    sh(
        conn,
        f"apt-get update -q -o Dir::Etc::SourceList={SOURCES} -o Dir::Etc::SourceParts=- "
        "-o APT::Get::List-Cleanup=0 >/dev/null",
    )


def play_role(
    fleet: Fleet,
    folder: Path,
    role: str,
    hosts: str,
    variables: dict[str, Any],
    *args: str,
    lab: bool = True,
    executable: bool = False,
) -> Run:
    """``fxkit play`` of ``role`` on ``hosts`` with ``variables`` (group vars), the fleet
    marked as lab hosts (``fxkit_lab``) unless ``lab`` is false; in this process, or with
    ``executable`` as a user runs it."""
    playbook = folder / f"{role}.yml"
    playbook.write_text(yaml.safe_dump([{"name": role, "hosts": hosts, "roles": [role]}]))
    inventory = write_inventory(fleet, folder / "inventory.yml", fxkit_lab=lab, **variables)
    play = fxkit_play if executable else cli_play
    return play(playbook, inventory, folder / "events.json", *args)
