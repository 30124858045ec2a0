"""Inventory parsing and variable merging, checked against real ansible-inventory output."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from inventory_helpers import ANSIBLE, DATA, FLEET, REPO, write

from fxkit.inventory import Inventory, InventoryHost
from fxkit.inventory.views import as_graph, as_list


def ansible_list(path: Path = ANSIBLE / "list.json") -> dict:
    data = json.loads(path.read_text())
    data["_meta"].pop("profile")  # ansible-core 2.19's serialisation profile, not inventory data
    return data


@pytest.mark.parametrize("name", ["fleet.yml", "fleet.ini"])
def test_fleet_matches_ansible_inventory_list(name: str) -> None:
    # Source: ansible-inventory -i fleet.yml --list (ansible-core 2.19.14), see ansible/README.md
    assert as_list(Inventory.load(FLEET / name)) == ansible_list()


@pytest.mark.parametrize("name", ["edge.yml", "edge.ini"])
def test_corner_cases_match_ansible_inventory(name: str) -> None:
    # Source: ansible-inventory -i edge/NAME --list / --graph (ansible-core 2.19.14)
    golden = DATA / "edge" / "ansible"
    inv = Inventory.load(DATA / "edge" / name)
    assert as_list(inv) == ansible_list(golden / f"{name}.list.json")
    assert as_graph(inv) + "\n" == (golden / f"{name}.graph.txt").read_text()
    # h1 is listed as ungrouped (before any section, or under all: hosts) and in g1: as in
    # Ansible, a host in any other group is not ungrouped.
    assert "h1" not in inv.groups["ungrouped"].hosts
    assert "g1" in inv.hosts["h1"].groups and "ungrouped" not in inv.hosts["h1"].groups


def test_yaml_and_ini_give_the_same_hosts_vars_and_groups() -> None:
    yml, ini = Inventory.load(FLEET / "fleet.yml"), Inventory.load(FLEET / "fleet.ini")
    assert list(yml.hosts) == ["bastion", "gpu01", "gpu02", "gpu03", "nvme-tgt01"]
    assert yml.hosts == ini.hosts
    # bastion is under all: hosts in YAML, before any section in INI: ungrouped in both
    assert yml.groups["all"].hosts == ["bastion"] and ini.groups["all"].hosts == []
    yml.groups["all"].hosts.clear()
    assert {n: (g.hosts, g.children) for n, g in yml.groups.items()} == {
        n: (g.hosts, g.children) for n, g in ini.groups.items()
    }


def test_merge_order_deeper_groups_win_siblings_alphabetical_files_beat_inline() -> None:
    inv = Inventory.load(FLEET / "fleet.yml")
    gpu01, gpu02, gpu03 = (inv.hosts[n].vars for n in ("gpu01", "gpu02", "gpu03"))
    assert inv.hosts["bastion"].vars["level"] == "all"
    # rack1 (depth 2, child of gpu) beats gpu and storage (depth 1), whatever the file order.
    assert gpu01["level"] == gpu02["level"] == "rack1"
    # zeta and alpha are both depth 1: merged alphabetically, so zeta wins although alpha is later.
    assert gpu01["sib"] == "zeta"
    # group_vars/gpu/ is a directory: 10-rocm.yml then 20-more.yaml; .hidden.yml is skipped.
    assert gpu01["rocm_version"] == "7.2.1" and gpu01["gpu_count"] == 8
    # group_vars/all.yml beats the inline all: vars.
    assert gpu01["ntp"] == "10.0.0.9"
    # Ansible's order puts every group_vars file after every inline group var: group_vars/gpu
    # beats rack2's inline nic, and group_vars/rack2 (no extension, deeper) beats group_vars/gpu.
    assert gpu01["nic"] == "gpu-file" and gpu03["nic"] == "rack2-file"
    # host_vars/gpu03.json beats gpu03's inline vars; the inline host:port gave ansible_port.
    assert gpu03["level"] == "host-file" and gpu03["ansible_port"] == 2222
    # groups: all, then the others in merge order (ancestors before children)
    assert inv.hosts["gpu03"] == InventoryHost("gpu03", gpu03, ["all", "gpu", "rack2"])
    assert inv.hosts["gpu01"].groups == ["all", "alpha", "gpu", "zeta", "rack1"]
    assert inv.hosts["bastion"].groups == ["all", "ungrouped"]


def test_groups_mapping() -> None:
    groups = Inventory.load(FLEET / "fleet.ini").groups
    assert list(groups) == ["all", "ungrouped", "gpu", "rack1", "rack2", "storage", "zeta", "alpha"]
    assert groups["gpu"].children == ["rack1", "rack2"] and groups["gpu"].hosts == []
    assert groups["rack2"].parents == ["gpu"] and groups["rack2"].depth == 2
    assert groups["rack2"].vars == {"level": "rack2", "nic": "rack2-file"}
    assert groups["all"].children[:1] == ["ungrouped"] and groups["all"].depth == 0


def test_group_priority_reorders_groups_of_equal_depth(tmp_path: Path) -> None:
    inv = write(
        tmp_path,
        "hosts.ini",
        """
        [alpha]
        h1
        [alpha:vars]
        x=alpha
        ansible_group_priority=10
        [zeta]
        h1
        [zeta:vars]
        x=zeta
        """,
    )
    assert Inventory.load(inv).hosts["h1"].vars["x"] == "alpha"


def test_connection_variables_pass_through(tmp_path: Path) -> None:
    inv = write(
        tmp_path,
        "hosts.yml",
        """
        all:
          hosts:
            gpu01:
              ansible_host: 10.20.0.11
              ansible_port: 2222
              ansible_user: ops
              ansible_ssh_private_key_file: ~/.ssh/id_ed25519
              ansible_become: true
              ansible_become_password: s3cret
              ansible_connection: ssh
        """,
    )
    assert Inventory.load(inv).hosts["gpu01"].vars == {
        "ansible_host": "10.20.0.11",
        "ansible_port": 2222,
        "ansible_user": "ops",
        "ansible_ssh_private_key_file": "~/.ssh/id_ed25519",
        "ansible_become": True,
        "ansible_become_password": "s3cret",
        "ansible_connection": "ssh",
    }


def test_ini_values_are_python_literals_or_strings(tmp_path: Path) -> None:
    inv = write(
        tmp_path,
        "hosts",  # no extension, not YAML: read as INI, as Ansible does
        """
        [gpu]
        gpu01 n=8 f=1.5 l="[1, 2]" s="two words" b=True t=true ip=10.0.0.1  # comment
        """,
    )
    assert Inventory.load(inv).hosts["gpu01"].vars == {
        "n": 8, "f": 1.5, "l": [1, 2], "s": "two words", "b": True, "t": "true", "ip": "10.0.0.1"
    }  # fmt: skip


def test_json_inventory_is_read_like_yaml(tmp_path: Path) -> None:
    inv = write(tmp_path, "hosts.json", '{"all": {"children": {"g": {"hosts": {"h1": {"x": 1}}}}}}')
    assert Inventory.load(inv).hosts["h1"] == InventoryHost("h1", {"x": 1}, ["all", "g"])


def test_extensionless_yaml_file_is_read_as_yaml(tmp_path: Path) -> None:
    inv = write(tmp_path, "hosts", "all:\n  hosts:\n    web1:\n")
    assert list(Inventory.load(inv).hosts) == ["web1"]


@pytest.mark.parametrize(
    ("text", "names"),
    [
        ("node[01:03]", ["node01", "node02", "node03"]),
        ("n[8:10]", ["n8", "n9", "n10"]),
        ("n[0:6:3]", ["n0", "n3", "n6"]),
        ("db-[a:c]", ["db-a", "db-b", "db-c"]),
        ("r[1:2]n[1:2]", ["r1n1", "r1n2", "r2n1", "r2n2"]),
    ],
)
def test_host_ranges_in_both_formats(tmp_path: Path, text: str, names: list[str]) -> None:
    ini = write(tmp_path, "hosts.ini", f"[g]\n{text} x=1\n")
    yml = write(tmp_path, "hosts.yml", f"all:\n  children:\n    g:\n      hosts:\n        {text}:")
    assert list(Inventory.load(ini).hosts) == names
    assert list(Inventory.load(yml).hosts) == names
    assert Inventory.load(ini).groups["g"].hosts == names


def test_ini_host_ports_and_ranges_with_a_port() -> None:
    inv = Inventory.load(DATA / "edge" / "edge.ini")
    assert inv.hosts["h1"].vars["ansible_port"] == 2200
    assert [inv.hosts[n].vars["ansible_port"] for n in ("n1", "n2", "n3")] == [2222] * 3
    assert inv.hosts["n2"].vars == {"ansible_port": 2222, "a": 1, "b": "two words",
                                    "c": [1, {"k": 2}], "v": "g2"}  # fmt: skip


def test_host_in_several_places_keeps_first_position_and_later_vars(tmp_path: Path) -> None:
    inv = write(tmp_path, "hosts.ini", "[a]\nh1 x=1 y=1\nh2\n[b]\nh1 x=2\n")
    loaded = Inventory.load(inv)
    assert list(loaded.hosts) == ["h1", "h2"]
    assert loaded.hosts["h1"].vars == {"x": 2, "y": 1}


def test_from_hosts_for_ad_hoc_runs() -> None:
    inv = Inventory.from_hosts(["localhost", "gpu01:2222"])
    assert list(inv.hosts) == ["localhost", "gpu01"]
    assert inv.hosts["localhost"] == InventoryHost("localhost", {}, ["all", "ungrouped"])
    assert inv.hosts["gpu01"].vars == {"ansible_port": 2222}
    assert [h.name for h in inv.select("all")] == ["localhost", "gpu01"]


def test_example_mi308x_inventory() -> None:
    inv = Inventory.load(REPO / "inventory" / "mi308x.yml")
    assert list(inv.hosts) == ["gpu01", "gpu02", "gpu03", "gpu04", "nvme-tgt01", "nvme-tgt02"]
    gpu01, tgt = inv.hosts["gpu01"].vars, inv.hosts["nvme-tgt01"].vars
    assert gpu01["ansible_host"] == "10.20.0.11"  # from host_vars/gpu01.yml
    assert gpu01["roce_nic_interfaces"][0] == {"name": "ens6np0", "device": "mlx5_0"}
    assert gpu01["rocm_host_gpu_model"] == "MI308X" and gpu01["ansible_become"] is True
    assert tgt["roce_nic_interfaces"][0]["device"] == "bnxt_re0"
    assert gpu01["nvmeof_initiator_hostnqn"] == tgt["site_gpu_hostnqn"]["gpu01"]
    # the shared model library, then the node's own subsystem (a template of the host's name;
    # tests/test_nvme_fabric.py checks the rendered values against what the targets export)
    assert [c["nqn"] for c in gpu01["nvmeof_initiator_connections"]] == [
        inv.hosts["nvme-tgt01"].vars["nvmeof_target_subsystems"][0]["nqn"],
        "nqn.2026-01.io.fxkit:node-{{ inventory_hostname }}",
    ]
    assert inv.hosts["gpu04"].vars["ansible_port"] == 2222


def test_example_local_inventory() -> None:
    inv = Inventory.load(REPO / "inventory" / "local.yml")
    assert inv.hosts["localhost"].vars == {"ansible_connection": "local"}


def test_ini_equivalent_of_the_mi308x_example(tmp_path: Path) -> None:
    folder = tmp_path / "inventory"
    shutil.copytree(REPO / "inventory", folder)
    shutil.copy(DATA / "mi308x.ini", folder / "mi308x.ini")
    yml, ini = Inventory.load(folder / "mi308x.yml"), Inventory.load(folder / "mi308x.ini")
    assert yml.hosts == ini.hosts
    assert as_list(yml) == as_list(ini)
