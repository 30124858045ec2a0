"""Where each variable was set: ``HostVars.where(name)`` gives the file:line of the winning
definition (inventories, group_vars/host_vars, playbooks, vars files, ``-e @file``), else how it
was set (``-e #N on the command line``) or the level. Real files in tmp_path."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import pytest
from inventory_helpers import write
from pydantic import Field

from fxkit.engine.playbook import Playbook
from fxkit.engine.record import Recorder
from fxkit.engine.rolevars import RoleVars, check_vars
from fxkit.engine.runner import Runner, RunOptions
from fxkit.engine.variables import HostVars, Layer, parse_extra_vars
from fxkit.errors import TemplateError
from fxkit.inventory import Inventory
from fxkit.varfiles import load_vars_file


def test_yaml_inventory_host_and_group_vars(tmp_path: Path) -> None:
    hosts = write(
        tmp_path,
        "hosts.yml",
        """
        all:
          vars:
            ntp: 10.0.0.1
          children:
            gpu:
              vars: {rocm: '7.2'}
              hosts:
                gpu01:
                  mtu: 9000
                  rack: r1
        """,
    )
    origins = Inventory.load(hosts).hosts["gpu01"].origins
    assert origins == {
        "ntp": f"{hosts}:3",
        "rocm": f"{hosts}:6",
        "mtu": f"{hosts}:9",
        "rack": f"{hosts}:10",
    }


def test_ini_inventory_host_line_port_and_group_vars_section(tmp_path: Path) -> None:
    hosts = write(
        tmp_path,
        "hosts.ini",
        """
        [gpu]
        gpu01:2222 mtu=9000

        [gpu:vars]
        # the ROCm release
        rocm=7.2
        """,
    )
    origins = Inventory.load(hosts).hosts["gpu01"].origins
    assert origins == {
        "ansible_port": f"{hosts}:2",
        "mtu": f"{hosts}:2",
        "rocm": f"{hosts}:6",
    }


def test_group_vars_and_host_vars_files_beat_inline_values(tmp_path: Path) -> None:
    hosts = write(tmp_path, "hosts.ini", "[gpu]\ngpu01 mtu=1500 nic=ens1\n[gpu:vars]\nrocm=7.0\n")
    group_file = write(tmp_path, "group_vars/gpu/10-rocm.yml", "# ROCm\n\nrocm: '7.2'\n")
    all_file = write(tmp_path, "group_vars/all.yml", "ntp: 10.0.0.1\nnic: ens0\n")
    host_file = write(tmp_path, "host_vars/gpu01.json", '{\n  "mtu": 9000\n}\n')
    inv = Inventory.load(hosts)
    assert inv.hosts["gpu01"].vars == {"mtu": 9000, "nic": "ens1", "rocm": "7.2", "ntp": "10.0.0.1"}
    assert inv.hosts["gpu01"].origins == {
        "mtu": f"{host_file}:2",  # host_vars/ beats the inline host var
        "nic": f"{hosts}:2",  # an inline host var beats group_vars/all
        "rocm": f"{group_file}:3",  # group_vars/gpu beats [gpu:vars]
        "ntp": f"{all_file}:1",
    }


def test_the_deeper_group_s_origin_wins(tmp_path: Path) -> None:
    hosts = write(
        tmp_path,
        "hosts.yml",
        """
        all:
          vars: {level: all}
          children:
            gpu:
              vars: {level: gpu}
              children:
                rack1:
                  vars: {level: rack1}
                  hosts: {gpu01: }
        """,
    )
    assert Inventory.load(hosts).hosts["gpu01"].origins == {"level": f"{hosts}:8"}


def test_the_implicit_localhost_says_where_its_connection_comes_from(tmp_path: Path) -> None:
    hosts = write(tmp_path, "hosts.ini", "[all:vars]\nntp=10.0.0.1\n")
    local = Inventory.load(hosts).localhost("localhost")
    assert local.origins == {"ntp": f"{hosts}:2", "ansible_connection": "implicit localhost"}


PLAYBOOK = """
- hosts: all
  vars:
    from_play: 1
    everywhere: play vars
  vars_files: [vars/site.yml]
  roles:
    - role: node
      from_param: 1
      everywhere: role parameters
"""


def role_vars(tmp_path: Path, extra: list[str]) -> HostVars:
    """gpu01's variables as role ``node`` of PLAYBOOK sees them, with ``-e extra``."""
    write(tmp_path, "hosts.yml", "all:\n  hosts:\n    gpu01:\n      from_inventory: 1\n")
    write(tmp_path, "site.yml", PLAYBOOK)
    write(tmp_path, "vars/site.yml", "# site\nfrom_vars_files: 1\neverywhere: vars_files\n")
    write(tmp_path, "roles/node/defaults.yml", "from_defaults: 1\neverywhere: defaults\n")
    write(tmp_path, "roles/node/role.py", "def apply(host, v):\n    pass\n")
    book = Playbook.load(tmp_path / "site.yml")
    options = RunOptions(extra_vars=parse_extra_vars(extra, tmp_path))
    runner = Runner(book, Inventory.load(tmp_path / "hosts.yml"), options, Recorder())
    [play] = book.plays
    [ref] = play.roles
    return runner.role_vars(play, ref, runner.roles.load("node"))["gpu01"]


def test_every_level_says_where_it_set_a_variable(tmp_path: Path) -> None:
    write(tmp_path, "extra.yml", "---\nfrom_extra_file: 1\n")
    v = role_vars(tmp_path, ["from_extra=1", "@extra.yml"])
    assert v.where("from_defaults") == f"{tmp_path}/roles/node/defaults.yml:1"
    assert v.where("from_inventory") == f"{tmp_path}/hosts.yml:4"
    assert v.where("from_play") == f"{tmp_path}/site.yml:3"
    assert v.where("from_vars_files") == f"{tmp_path}/vars/site.yml:2"
    assert v.where("from_param") == f"{tmp_path}/site.yml:8"
    assert v.where("from_extra") == "-e #1 on the command line"
    assert v.where("from_extra_file") == f"{tmp_path}/extra.yml:2"
    assert v.where("inventory_hostname") == "fxkit"
    assert v.source("from_play") == "play vars"  # the level, as before


@pytest.mark.parametrize(
    ("extra", "where"),
    [
        ([], "{tmp}/site.yml:9"),  # role parameters beat play vars and vars_files
        (['{"everywhere": "json"}'], "-e #1 on the command line"),
        (["everywhere=1", "@extra.yml"], "{tmp}/extra.yml:1"),  # the later -e wins
        (["@extra.yml", "everywhere=1"], "-e #2 on the command line"),
    ],
)
def test_the_winning_level_s_origin_is_given(tmp_path: Path, extra: list[str], where: str) -> None:
    write(tmp_path, "extra.yml", "everywhere: extra file\n")
    assert role_vars(tmp_path, extra).where("everywhere") == where.format(tmp=tmp_path)


def test_a_vars_file_gives_the_line_that_wins(tmp_path: Path) -> None:
    path = write(tmp_path, "vars.yml", "<<: {merged: 1}\nrack: r1\nrack: r2\n1: one\n'q': 2\n")
    values = load_vars_file(path)
    assert values == {"merged": 1, "rack": "r2", 1: "one", "q": 2}
    # a key repeated: its last line; a key that is no text (1) has no line
    assert values.origins == {"merged": f"{path}:1", "rack": f"{path}:3", "q": f"{path}:5"}


def test_a_path_into_a_variable_is_where_the_variable_was_set_and_unset_ones_say_so() -> None:
    v = HostVars("h1", [Layer("inventory", {"ports": [{"addr": 1}]}, origins={"ports": "i:7"})])
    assert v.where("ports[0].addr") == v.where("ports.0") == v.where("ports") == "i:7"
    assert v.where("nowhere") == "not set"


class Node(RoleVars):
    from_param: Literal[2] = Field(2, description="must be 2")


def test_a_role_s_variable_error_names_the_file_and_line(tmp_path: Path) -> None:
    _, [error] = check_vars(Node, role_vars(tmp_path, []))
    assert error.where == f"gpu01: from_param ({tmp_path}/site.yml:8)"


def test_a_template_error_in_a_variable_names_its_file_and_line() -> None:
    layer = Layer("inventory", {"url": "http://{{ nowhere }}"}, origins={"url": "hosts.ini:3"})
    with pytest.raises(TemplateError) as err:
        HostVars("h1", [layer])["url"]
    assert err.value.where == "variable 'url' (hosts.ini:3), line 1"
