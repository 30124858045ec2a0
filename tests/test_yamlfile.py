"""fxkit.yamlfile: the one YAML reader behind inventories, playbooks, vars files and defaults."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from fxkit import yamlfile
from fxkit.engine.playbook import Playbook
from fxkit.errors import FxkitError, InventoryError, PlaybookError
from fxkit.inventory import Inventory
from fxkit.varfiles import load_vars_file
from fxkit.yamlfile import (
    MAX_ALIAS_VALUES,
    Marked,
    MarkedList,
    line_at,
    plain,
    read_yaml,
    type_name,
)

TEXT = """\
# a comment
name: node
roles:
  - base
  - role: rocm
    tags: [gpu]
vars:
  x: 1
"""


def test_mappings_and_lists_remember_their_lines(tmp_path: Path) -> None:
    path = tmp_path / "book.yml"
    path.write_text(TEXT)
    data = read_yaml(path)
    assert isinstance(data, Marked) and isinstance(data["roles"], MarkedList)
    assert data.line == 2 and data.line_of("vars") == 7
    assert line_at(data, ["roles", 1]) == (5, ["roles", 1])
    assert line_at(data, ["roles", 1, "tags"]) == (6, ["roles", 1, "tags"])
    assert line_at(data, ["vars", "x"]) == (8, ["vars", "x"])
    # Parts not in the YAML (Pydantic's union member names) are skipped.
    assert line_at(data, ["roles", "list[str]", 0]) == (4, ["roles", 0])
    assert plain(data) == {
        "name": "node",
        "roles": ["base", {"role": "rocm", "tags": ["gpu"]}],
        "vars": {"x": 1},
    }
    assert type(plain(data)["roles"]) is list
    assert (type_name(data), type_name(data["roles"]), type_name("s")) == ("dict", "list", "str")


@pytest.mark.parametrize("error", [FxkitError, InventoryError, PlaybookError])
def test_syntax_errors_are_the_callers_error_with_file_line_and_hint(
    tmp_path: Path, error: type[FxkitError]
) -> None:
    path = tmp_path / "bad.yml"
    path.write_text("a: 1\nb: [unclosed\nc: 3\n")
    with pytest.raises(error) as err:
        read_yaml(path, error)
    assert type(err.value) is error
    assert err.value.where == f"{path}:3"
    assert "invalid YAML" in err.value.message and "syntax error" in (err.value.hint or "")


@pytest.mark.parametrize(
    ("value", "says"),
    [("9" * 5000, "is not a number fxkit can read: Exceeds the limit (4300 digits)"),
     ("2001-13-01", "'2001-13-01' is not a date fxkit can read: month must be in 1..12")],
)  # fmt: skip
@pytest.mark.parametrize("lines", [True, False])
def test_values_python_cannot_convert_are_errors_at_their_line(
    tmp_path: Path, value: str, says: str, lines: bool
) -> None:
    path = tmp_path / "vars.yml"
    path.write_text(f"a: 1\nb:\n  - {value}\n")
    with pytest.raises(InventoryError) as err:
        read_yaml(path, InventoryError, lines=lines)
    assert err.value.where == f"{path}:3" and says in err.value.message
    assert "quote it" in (err.value.hint or "")


def test_unknown_tags_and_unreadable_files(tmp_path: Path) -> None:
    path = tmp_path / "vault.yml"
    path.write_text("a: 1\npassword: !vault |\n  abc\n")
    with pytest.raises(PlaybookError, match="!vault") as err:
        read_yaml(path, PlaybookError)
    assert err.value.where == f"{path}:2"
    with pytest.raises(PlaybookError, match="cannot read playbook: No such file") as err:
        read_yaml(tmp_path / "gone.yml", PlaybookError, what="playbook", hint="check the path")
    assert err.value.hint == "check the path"
    path.write_text("{[1]: x}\n")
    with pytest.raises(FxkitError, match="mapping key must be a plain value") as err:
        read_yaml(path)
    assert err.value.where == f"{path}:1"


# -- alias bombs, large files, encodings (issue 8, part 5) -------------------------------------

#: The "billion laughs": 9 levels of 9 aliases each, 9**9 (387 million) strings once expanded.
BOMB = "a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n" + "".join(
    f"{name}: &{name} [{', '.join([f'*{prev}'] * 9)}]\n"
    for prev, name in zip("abcdefgh", "bcdefghi", strict=True)
)


def _bomb_line(text: str) -> int:
    """The line of the alias at which the expansion passes MAX_ALIAS_VALUES (levels of 9)."""
    size, line = 9, 1
    for line in range(2, text.count("\n") + 1):
        size *= 9
        if size > MAX_ALIAS_VALUES:
            return line
    return line


@pytest.mark.parametrize(
    ("kind", "name", "text"),
    [
        ("vars file", "vars.yml", BOMB),
        (
            "playbook",
            "book.yml",
            "- hosts: all\n  vars:\n" + "".join(f"    {line}\n" for line in BOMB.splitlines()),
        ),
        (
            "inventory",
            "hosts.yml",
            "all:\n  vars:\n" + "".join(f"    {line}\n" for line in BOMB.splitlines()),
        ),
    ],
)
def test_an_alias_bomb_is_refused_at_the_alias_line(
    tmp_path: Path, kind: str, name: str, text: str
) -> None:
    path = tmp_path / name
    path.write_text(text)
    load = {
        "vars file": lambda: load_vars_file(path),
        "playbook": lambda: Playbook.load(path),
        "inventory": lambda: Inventory.load(path),
    }[kind]
    with pytest.raises(FxkitError, match="aliases expand to more than 1,000,000 values") as err:
        load()
    line = _bomb_line(BOMB) + (text.count("\n") - BOMB.count("\n"))
    assert f"{path}:{line}" in str(err.value)
    assert "alias" in (err.value.hint or "")


def test_aliases_inside_themselves_and_merge_key_bombs_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "vars.yml"
    path.write_text("a: 1\nloop: &loop\n  - x\n  - *loop\n")
    with pytest.raises(FxkitError, match=r"alias \*loop is inside the value it names") as err:
        read_yaml(path)
    assert err.value.where == f"{path}:4"
    # Merge keys double at each level: 2**40 keys once flattened, from 42 lines.
    levels = "".join(f"l{i}: &l{i}\n  <<: [*l{i - 1}, *l{i - 1}]\n" for i in range(1, 41))
    path.write_text("l0: &l0 {k1: 1, k2: 2}\n" + levels)
    with pytest.raises(FxkitError, match="aliases expand to more than") as err:
        read_yaml(path, lines=False)


def test_ordinary_aliases_and_merge_keys_still_load(tmp_path: Path) -> None:
    path = tmp_path / "vars.yml"
    path.write_text(
        "defaults: &defaults {os: ubuntu, rocm: '7.2'}\n"
        "gpu01: {<<: *defaults, rack: r1}\n"
        "gpu02:\n  <<: *defaults\n  rocm: '7.1'\n"
        "ports: &ports [22, 4420]\n"
        "again: *ports\n"
        "note: 'a * in a string is no alias'\n"
    )
    data = read_yaml(path)
    assert data["gpu01"] == {"os": "ubuntu", "rocm": "7.2", "rack": "r1"}
    assert data["gpu02"] == {"os": "ubuntu", "rocm": "7.1"}
    assert data["again"] == [22, 4420] and data.line_of("gpu02") == 3


def test_large_files_are_parsed_by_libyaml_with_their_lines(tmp_path: Path) -> None:
    """PyYAML's C parser where PyYAML has it (its wheels do); lines as the Python parser's."""
    assert issubclass(yamlfile._MarkingLoader, yaml.CSafeLoader) is yaml.__with_libyaml__
    assert issubclass(yamlfile._PlainLoader, yaml.CSafeLoader) is yaml.__with_libyaml__
    path = tmp_path / "vars.yml"
    nodes = "".join(
        f"  gpu{n:04d}:\n    address: 10.0.{n // 256}.{n % 256}\n    gpus: [{n}, {n + 1}]\n"
        f"    bmc: {{user: admin, port: {n}}}\n"
        for n in range(2000)
    )
    path.write_text(f"# {len(nodes)} bytes\nfleet:\n{nodes}")
    assert load_vars_file(path) == yaml.load(path.read_text(), yaml.SafeLoader)
    marked = read_yaml(path)
    assert marked["fleet"].line_of("gpu1999") == 2 + 4 * 1999 + 1
    assert line_at(marked, ["fleet", "gpu0001", "gpus", 1]) == (9, ["fleet", "gpu0001", "gpus", 1])


@pytest.mark.parametrize(
    ("name", "load", "what"),
    [
        ("book.yml", Playbook.load, "playbook"),
        ("vars.yml", load_vars_file, "variables file"),
        ("hosts.yml", Inventory.load, "file"),
    ],
)
def test_a_file_that_is_not_utf8_is_named_at_its_line(
    tmp_path: Path, name: str, load: Any, what: str
) -> None:
    path = tmp_path / name
    path.write_bytes("# réglages\nall:\n  vars:\n    site: Orléans\n".encode("latin-1"))
    with pytest.raises(FxkitError) as err:
        load(path)
    assert err.value.where == f"{path}:1"
    assert f"cannot read {what}: not UTF-8: byte 0xe9 at line 1, column 4" in err.value.message
    assert "UTF-8" in (err.value.hint or "")
    path.write_bytes("all:\n  vars:\n    site: Orléans\n".encode("latin-1"))
    with pytest.raises(FxkitError) as err:
        load(path)
    assert err.value.where == f"{path}:3" and "line 3, column 14" in err.value.message
