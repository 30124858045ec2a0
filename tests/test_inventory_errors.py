"""Every inventory mistake is an InventoryError naming the file and line, with a hint."""

from __future__ import annotations

from pathlib import Path

import pytest
from inventory_helpers import write

from fxkit.errors import InventoryError
from fxkit.inventory import Inventory

YAML_CASES = {
    "syntax error": (
        """
        all:
          children:
            gpu:
              hosts:
                gpu01:
               ansible_user: ops
        """,
        6,
        "YAML syntax error",
    ),
    "group not a mapping": (
        """
        all:
          children:
            gpu: [gpu01, gpu02]
        """,
        3,
        "group 'gpu' must be a mapping, not list",
    ),
    "hosts as a list": (
        """
        all:
          children:
            gpu:
              hosts:
                - gpu01
        """,
        4,
        "'hosts' of group 'gpu' must be a mapping, not list",
    ),
    "host vars not a mapping": (
        """
        all:
          children:
            gpu:
              hosts:
                gpu01:
                gpu02: 10.0.0.2
        """,
        6,
        "the vars of host 'gpu02' in group 'gpu' must be a mapping, not str",
    ),
    "vars not a mapping": (
        """
        all:
          vars:
            - ntp=10.0.0.1
        """,
        2,
        "'vars' of group 'all' must be a mapping, not list",
    ),
    "unexpected key": (
        """
        all:
          children:
            gpu:
              host:
                gpu01:
        """,
        4,
        "unexpected key 'host' in group 'gpu'",
    ),
    "top level not a mapping": ("- gpu01\n", 1, "must be a mapping of group names"),
    "cycle in children": (
        """
        all:
          children:
            gpu:
              children:
                rack1:
                  children:
                    gpu:
        """,
        7,
        "group 'gpu' is its own ancestor: all -> gpu -> rack1 -> gpu",
    ),
    "backwards range": (
        """
        all:
          hosts:
            node[08:01]:
        """,
        3,
        "bad host range in 'node[08:01]': range [08:01] runs backwards",
    ),
}

INI_CASES = {
    "unclosed section": ("[gpu\ngpu01\n", 1, "cannot parse section header '[gpu'"),
    "unknown section kind": ("[gpu:hosts]\ngpu01\n", 1, "unknown section kind ':hosts'"),
    "host var without =": ("[gpu]\ngpu01 ansible_user ops\n", 2, "expected key=value"),
    "unclosed quote": ("[gpu]\ngpu01 motd='hello\n", 2, "No closing quotation"),
    "vars line without =": ("[gpu]\ngpu01\n[gpu:vars]\nrocm 7.2\n", 4, "expected key=value"),
    "two names in children": ("[fleet:children]\ngpu storage\n", 2, "one group name"),
    "vars for undefined group": ("[gpu]\ngpu01\n[gpo:vars]\nx=1\n", 3, "never defined"),
    "cycle in children": ("[a:children]\nb\n[b:children]\na\n", 4, "'a' is its own ancestor"),
    "self child": ("[a:children]\na\n", 2, "'a' is its own ancestor"),
}


def check(path: Path, line: int, message: str) -> None:
    with pytest.raises(InventoryError) as err:
        Inventory.load(path)
    text = str(err.value)
    assert text.startswith(f"{path}:{line}: "), text
    assert message in text
    assert err.value.hint, "every inventory error says what to do"


@pytest.mark.parametrize("case", list(YAML_CASES))
def test_yaml_mistakes(tmp_path: Path, case: str) -> None:
    text, line, message = YAML_CASES[case]
    check(write(tmp_path, "hosts.yml", text), line, message)


@pytest.mark.parametrize("case", list(INI_CASES))
def test_ini_mistakes(tmp_path: Path, case: str) -> None:
    text, line, message = INI_CASES[case]
    check(write(tmp_path, "hosts.ini", text), line, message)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(InventoryError, match="inventory not found") as err:
        Inventory.load(tmp_path / "nope.yml")
    assert err.value.where == str(tmp_path / "nope.yml") and err.value.hint


def test_directory_without_inventory_files(tmp_path: Path) -> None:
    # Ansible warns "No inventory was parsed" and goes on with no hosts; fxkit refuses.
    write(tmp_path, "README.md", "[web]\nweb1\n")
    write(tmp_path, "group_vars/all.yml", "x: 1\n")
    with pytest.raises(InventoryError, match="no inventory file in this directory") as err:
        Inventory.load(tmp_path)
    assert err.value.where == str(tmp_path) and ".md" in str(err.value.hint)


@pytest.mark.parametrize(
    ("name", "text", "message"),
    [
        ("aws_ec2.yml", "plugin: amazon.aws.aws_ec2\n", "inventory plugin 'amazon.aws.aws_ec2'"),
        ("hosts.toml", "[web.hosts]\n", "TOML inventories are not supported"),
        ("ec2.py", "#!/usr/bin/env python3\n", "executable inventory scripts"),
    ],
)
def test_sources_fxkit_does_not_read(tmp_path: Path, name: str, text: str, message: str) -> None:
    path = write(tmp_path, name, text)
    path.chmod(0o755)
    with pytest.raises(InventoryError, match=message) as err:
        Inventory.load(tmp_path)
    assert str(err.value).startswith(str(path)) and err.value.hint


def test_group_vars_file_not_a_mapping(tmp_path: Path) -> None:
    inv = write(tmp_path, "hosts.ini", "[gpu]\ngpu01\n")
    bad = write(tmp_path, "group_vars/gpu.yml", "- rocm_version: 7.2\n")
    with pytest.raises(InventoryError, match="must be a mapping") as err:
        Inventory.load(inv)
    assert str(err.value).startswith(f"{bad}:1: ")


def test_host_vars_file_syntax_error(tmp_path: Path) -> None:
    inv = write(tmp_path, "hosts.ini", "gpu01\n")
    bad = write(tmp_path, "host_vars/gpu01/nics.yml", "a: 1\nb: [unclosed\nc: 3\n")
    with pytest.raises(InventoryError, match="YAML syntax error") as err:
        Inventory.load(inv)
    assert str(err.value).startswith(f"{bad}:3: ")


def test_bad_group_priority(tmp_path: Path) -> None:
    inv = write(tmp_path, "hosts.ini", "[gpu]\ngpu01\n[gpu:vars]\nansible_group_priority=high\n")
    with pytest.raises(InventoryError, match="ansible_group_priority of group 'gpu'") as err:
        Inventory.load(inv)
    assert err.value.where == f"{inv}:4" and err.value.hint


@pytest.mark.parametrize(
    "text",
    [
        "[gpu]\ngpu01 ansible_password=hunter2 x9secret\n",  # a password with a space, unquoted
        "[gpu]\ngpu01 ansible_password='hunter2 x9secret\n",  # no closing quote
        "[gpu]\ngpu01\n[gpu:vars]\nansible_password hunter2 x9secret\n",  # ':' or ' ' for '='
    ],
)
def test_ini_errors_never_quote_what_may_be_a_secret(tmp_path: Path, text: str) -> None:
    path = write(tmp_path, "hosts.ini", text)
    with pytest.raises(InventoryError) as err:
        Inventory.load(path)
    message = str(err.value)
    assert "hunter2" not in message and "x9secret" not in message, message
    assert message.startswith(f"{path}:{len(text.splitlines())}: ")  # the last line
    assert "not shown" in message and err.value.hint
