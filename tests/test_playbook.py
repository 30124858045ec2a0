"""Playbooks: the format, and every mistake reported at file:line with a hint."""

from __future__ import annotations

from pathlib import Path

import pytest

from fxkit.engine.playbook import Playbook
from fxkit.errors import PlaybookError

DATA = Path(__file__).parent / "data" / "playbooks"


def test_full_playbook() -> None:
    book = Playbook.load(DATA / "full.yml")
    first, second = book.plays
    assert first.name == "base set-up" and first.hosts == "gpu:&rack1"
    assert first.serial == [1, "50%"] and first.max_fail_percentage == 25
    assert first.become is True and first.tags == ["base"]
    assert first.vars == {"node_role": "inference", "from_vars": "play"}
    assert first.file_vars == {"from_vars": "vars_files", "site": "lab"}
    assert first.secret_vars == ["registry_auth"]
    assert [r.role for r in first.roles] == ["node_base", "nvme_target"]
    assert first.roles[1].tags == ["nvme", "storage"]
    assert first.roles[1].params == {"nvme_port": 4420}
    assert first.roles[1].where == f"{DATA / 'full.yml'}:15"
    assert first.where == f"{DATA / 'full.yml'}:2"
    assert second.name == "login:storage" and second.hosts == "login:storage"
    assert second.serial is None and second.become is None


@pytest.mark.parametrize(
    ("serial", "hosts", "sizes"),
    [
        (None, 5, [5]),
        ([2], 5, [2, 2, 1]),
        (["40%"], 5, [2, 2, 1]),
        (["10%"], 5, [1, 1, 1, 1, 1]),  # a percentage is at least one host
        ([1, "50%"], 7, [1, 3, 3]),  # the last size repeats
        ([1, 2, 10], 4, [1, 2, 1]),
    ],
)
def test_serial_batches(serial: list | None, hosts: int, sizes: list[int]) -> None:
    play = Playbook.load(DATA / "full.yml").plays[0]
    play.serial = serial
    batches = play.batches(list(range(hosts)))
    assert [len(b) for b in batches] == sizes
    assert [h for b in batches for h in b] == list(range(hosts))


def _error(tmp_path: Path, text: str) -> PlaybookError:
    path = tmp_path / "book.yml"
    path.write_text(text)
    with pytest.raises(PlaybookError) as err:
        Playbook.load(path)
    return err.value


def test_unknown_key_points_at_the_key_and_suggests(tmp_path: Path) -> None:
    err = _error(tmp_path, "- name: a\n  hosts: all\n- name: b\n  hosts: all\n  rolse: [x]\n")
    assert err.where == f"{tmp_path / 'book.yml'}:5"
    assert "play 2 (b): unknown key 'rolse'" in err.message
    assert err.hint and "did you mean 'roles'?" in err.hint


def test_missing_hosts(tmp_path: Path) -> None:
    err = _error(tmp_path, "- name: a\n  roles: [x]\n")
    assert err.where == f"{tmp_path / 'book.yml'}:1"
    assert "missing key 'hosts'" in err.message
    assert err.hint == "add 'hosts:' to the play"


def test_role_entry_without_role_key(tmp_path: Path) -> None:
    err = _error(tmp_path, "- hosts: all\n  roles:\n    - a\n    - {rol: b}\n")
    assert err.where == f"{tmp_path / 'book.yml'}:4"
    assert "roles[1]: missing key 'role'" in err.message


@pytest.mark.parametrize(
    ("serial", "reason"),
    [("0", "at least 1 host"), ("'x%'", "neither a number"), ("'150%'", "(0, 100]")],
)
def test_bad_serial(tmp_path: Path, serial: str, reason: str) -> None:
    err = _error(tmp_path, f"- hosts: all\n  serial: {serial}\n")
    assert err.where == f"{tmp_path / 'book.yml'}:2"
    assert reason in err.message


def test_bad_max_fail_percentage(tmp_path: Path) -> None:
    err = _error(tmp_path, "- hosts: all\n\n  max_fail_percentage: 120\n")
    assert err.where == f"{tmp_path / 'book.yml'}:3"
    assert "max_fail_percentage" in err.message


def test_wrong_type_deep_inside(tmp_path: Path) -> None:
    err = _error(tmp_path, "- hosts: all\n  roles:\n    - role: a\n      tags: {x: 1}\n")
    assert err.where == f"{tmp_path / 'book.yml'}:4"
    assert "roles[0].tags" in err.message


def test_yaml_syntax_error(tmp_path: Path) -> None:
    err = _error(tmp_path, "- hosts: all\n  vars: {a: 1\n  roles: []\n")
    assert err.where and err.where.startswith(f"{tmp_path / 'book.yml'}:")
    assert "invalid YAML" in err.message


def test_playbook_must_be_a_list(tmp_path: Path) -> None:
    err = _error(tmp_path, "hosts: all\nroles: []\n")
    assert "a playbook is a list of plays" in err.message


def test_play_must_be_a_mapping(tmp_path: Path) -> None:
    err = _error(tmp_path, "- hosts: all\n- just a string\n")
    assert err.where == f"{tmp_path / 'book.yml'}:2"


def test_missing_vars_file_points_at_the_entry(tmp_path: Path) -> None:
    err = _error(tmp_path, "- hosts: all\n  vars_files:\n    - ok.yml\n    - gone.yml\n")
    assert err.where == f"{tmp_path / 'book.yml'}:3"  # ok.yml is missing too: the first one
    (tmp_path / "ok.yml").write_text("a: 1\n")
    err = _error(tmp_path, "- hosts: all\n  vars_files:\n    - ok.yml\n    - gone.yml\n")
    assert err.where == f"{tmp_path / 'book.yml'}:4"
    assert "'gone.yml'" in err.message


def test_bad_vars_file_names_its_own_line_too(tmp_path: Path) -> None:
    (tmp_path / "site.yml").write_text("a: 1\nb: [unclosed\nc: 3\n")
    err = _error(tmp_path, "- hosts: all\n  vars_files: [site.yml]\n")
    assert err.where == f"{tmp_path / 'book.yml'}:2"
    assert f"{tmp_path / 'site.yml'}:3: invalid YAML" in err.message


def test_missing_playbook_file(tmp_path: Path) -> None:
    with pytest.raises(PlaybookError, match="cannot read playbook"):
        Playbook.load(tmp_path / "absent.yml")


def test_empty_playbook_has_no_plays(tmp_path: Path) -> None:
    (tmp_path / "empty.yml").write_text("# nothing yet\n")
    assert Playbook.load(tmp_path / "empty.yml").plays == []


def test_empty_keys_mean_nothing(tmp_path: Path) -> None:
    (tmp_path / "book.yml").write_text("- hosts: all\n  vars:\n  vars_files:\n  roles:\n  tags:\n")
    [play] = Playbook.load(tmp_path / "book.yml").plays
    assert (play.vars, play.vars_files, play.roles, play.tags) == ({}, [], [], [])
