"""``fxkit inventory --list/--graph/--host``, compared with real ansible-inventory output."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from inventory_helpers import ANSIBLE, FLEET, REPO, write

from fxkit.cli import cli
from fxkit.inventory import Inventory

FLEET_YML = str(FLEET / "fleet.yml")


def fxkit(*args: str) -> str:
    result = CliRunner().invoke(cli, ["inventory", *args], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.output


def test_list_has_ansible_inventory_shape() -> None:
    # Source: ansible-inventory -i fleet.yml --list (ansible-core 2.19.14)
    expected = json.loads((ANSIBLE / "list.json").read_text())
    expected["_meta"].pop("profile")
    listed = json.loads(fxkit("-i", FLEET_YML, "--list"))
    assert listed == expected
    assert listed["all"] == {"children": ["ungrouped", "gpu", "storage", "zeta", "alpha"]}
    assert listed["gpu"] == {"children": ["rack1", "rack2"]}
    assert listed["ungrouped"] == {"hosts": ["bastion"]}


@pytest.mark.parametrize("source", ["fleet.yml", "fleet.ini"])
def test_graph_is_ansible_inventory_graph(source: str) -> None:
    # Source: ansible-inventory -i fleet.yml --graph (ansible-core 2.19.14)
    graph = fxkit("-i", str(FLEET / source), "--graph")
    assert graph == (ANSIBLE / "graph.txt").read_text()
    assert graph.splitlines()[:4] == ["@all:", "  |--@ungrouped:", "  |  |--bastion", "  |--@gpu:"]


def test_graph_of_one_group() -> None:
    assert fxkit("-i", FLEET_YML, "--graph", "gpu") == (ANSIBLE / "graph-gpu.txt").read_text()


def test_host_prints_merged_vars() -> None:
    expected = json.loads((ANSIBLE / "host-gpu03.json").read_text())
    assert json.loads(fxkit("-i", FLEET_YML, "--host", "gpu03")) == expected


def test_list_with_limit_keeps_only_matching_hosts() -> None:
    listed = json.loads(fxkit("-i", FLEET_YML, "--list", "--limit", "gpu:!rack2"))
    assert set(listed["_meta"]["hostvars"]) == {"gpu01", "gpu02"}
    assert listed["storage"] == {"hosts": ["gpu02"]}
    assert "rack2" not in listed and "ungrouped" not in listed


def test_example_inventory_graph() -> None:
    graph = fxkit("-i", str(REPO / "inventory" / "mi308x.yml"), "--graph").splitlines()
    assert graph[:5] == [
        "@all:",
        "  |--@ungrouped:",
        "  |--@gpu_nodes:",
        "  |  |--@gpu_rack1:",
        "  |  |  |--gpu01",
    ]
    assert "  |--@storage_targets:" in graph


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--list", "--graph"], "exactly one of"),
        ([], "exactly one of"),
        (["--list", "gpu"], "with --graph only"),
    ],
)
def test_usage_errors(args: list[str], message: str) -> None:
    result = CliRunner().invoke(cli, ["inventory", "-i", FLEET_YML, *args])
    assert result.exit_code == 2 and message in result.output


def run_fxkit(*args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "fxkit", "inventory", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--host", "gpu99"], "no host named 'gpu99'"),
        (["--graph", "gpu99"], "no group named 'gpu99'"),
        (["--list", "--limit", "nosuch"], "no hosts matched 'nosuch'"),
        (["--list", "--limit", "gpu:!"], "operator without a name"),
    ],
)
def test_lookup_errors_print_one_line_without_traceback(args: list[str], message: str) -> None:
    result = run_fxkit("-i", FLEET_YML, *args)
    assert result.returncode == 2
    assert message in result.stderr and "Traceback" not in result.stderr


def test_inventory_error_shows_file_line_and_hint(tmp_path: Path) -> None:
    bad = write(tmp_path, "hosts.ini", "[gpu]\ngpu01 ansible_user ops\n")
    result = run_fxkit("-i", str(bad), "--list")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert f"error: {bad}:2: expected key=value" in result.stderr
    assert "hint: one host per line" in result.stderr


SECRETS = """
all:
  vars: {registry_token: tok-3141592, max_tokens: 4096}
  hosts:
    gpu01: {ansible_become_password: sudo-2718281, ansible_user: ops}
"""


def test_secret_variables_are_masked_unless_asked_for(tmp_path: Path) -> None:
    path = str(write(tmp_path, "hosts.yml", SECRETS))
    host = json.loads(fxkit("-i", path, "--host", "gpu01"))
    assert host == {
        "ansible_become_password": "********",
        "registry_token": "********",
        "max_tokens": 4096,  # a secret needs a whole name part: tokens is not token
        "ansible_user": "ops",
    }
    listed = fxkit("-i", path, "--list")
    assert "sudo-2718281" not in listed and "tok-3141592" not in listed
    assert json.loads(listed)["_meta"]["hostvars"]["gpu01"]["ansible_become_password"] == (
        "********"
    )
    shown = json.loads(fxkit("-i", path, "--host", "gpu01", "--show-secrets"))
    assert shown["ansible_become_password"] == "sudo-2718281"
    assert shown["registry_token"] == "tok-3141592"
    listed = json.loads(fxkit("-i", path, "--list", "--show-secrets"))
    assert listed["_meta"]["hostvars"]["gpu01"]["registry_token"] == "tok-3141592"


CASES = Path(__file__).resolve().parent / "data" / "inventory" / "cases"


def test_list_hosts_prints_what_ansible_prints(monkeypatch: pytest.MonkeyPatch) -> None:
    # Source: ansible 'dc:!east' -i ini_tree/hosts.ini --limit '!w2' --list-hosts
    # (ansible-core 2.19.14, cases/ansible/ini_tree/list-hosts.txt)
    monkeypatch.chdir(CASES)
    shown = fxkit("-i", "ini_tree/hosts.ini", "--list-hosts", "dc:!east", "--limit", "!w2")
    assert shown == (CASES / "ansible" / "ini_tree" / "list-hosts.txt").read_text()


def test_list_hosts_of_several_sources_in_order(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(CASES)
    shown = fxkit("-i", "multi/b/hosts.yml", "-i", "multi/a", "--list-hosts", "gpu[1:],storage")
    assert shown == "  hosts (4):\n    gpu3\n    gpu2\n    gpu1\n    nas1\n"


def test_list_hosts_that_match_nothing_warns(tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, ["inventory", "-i", FLEET_YML, "--list-hosts", "nosuch"])
    assert result.exit_code == 0 and "  hosts (0):" in result.output
    assert "no hosts matched 'nosuch'" in result.output


def test_play_list_hosts_prints_what_ansible_playbook_prints(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Source: ansible-playbook playbook/site.yml -i ini_tree/hosts.ini --limit 'e*,w*,east'
    # --list-hosts (ansible-core 2.19.14, cases/ansible/ini_tree/play-list-hosts.txt).
    # Play 1's 'east' is the host east (a plain host name wins), play 2's '!east' the group.
    # ansible-playbook prints each play's hosts as a Python set (in no set order); fxkit prints
    # them in the order the run takes them, which is Ansible's order for the pattern.
    monkeypatch.chdir(CASES)
    args = ["play", "playbook/site.yml", "-i", "ini_tree/hosts.ini", "--limit", "e*,w*,east"]
    result = CliRunner().invoke(cli, [*args, "--list-hosts"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    expected = (CASES / "ansible" / "ini_tree" / "play-list-hosts.txt").read_text()
    assert sections(result.output) == sections(expected)
    inv = Inventory.load(CASES / "ini_tree" / "hosts.ini")
    hosts = [h.name for h in inv.select("all:!east", "e*,w*,east")]
    assert result.output.endswith("    hosts (4):\n" + "".join(f"      {h}\n" for h in hosts))


def sections(text: str) -> list[tuple[str, frozenset[str]]]:
    """Each play's heading lines and its set of host lines."""
    plays = text.split("\n\n")
    return [
        (
            "\n".join(line for line in play.splitlines() if not line.startswith("      ")),
            frozenset(line.strip() for line in play.splitlines() if line.startswith("      ")),
        )
        for play in plays
    ]


def test_play_merges_several_inventories(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(CASES)
    book = write(tmp_path, "site.yml", "- hosts: gpu:!rack2\n")
    args = ["play", str(book), "-i", "multi/a/hosts.ini", "-i", "multi/b/hosts.yml"]
    result = CliRunner().invoke(cli, [*args, "--list-hosts"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert result.output.endswith("    hosts (2):\n      gpu1\n      gpu3\n")
