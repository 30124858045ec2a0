"""fxkit.yamlfile: the one YAML reader behind inventories, playbooks, vars files and defaults."""

from __future__ import annotations

from pathlib import Path

import pytest

from fxkit.errors import FxkitError, InventoryError, PlaybookError
from fxkit.yamlfile import Marked, MarkedList, line_at, plain, read_yaml, type_name

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
