"""Every role's README table of variables is the one its role.py ``Vars`` generates
(``make docs`` rewrites it); a role without ``Vars`` (a defaults.yml) has a hand-written table
that names exactly the variables of its defaults.yml, each with the default that file gives it."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from fxkit import reference
from fxkit.engine.role import RoleLoader
from fxkit.engine.rolevars import BEGIN

ROLES = Path(__file__).resolve().parent.parent / "roles"
HEADER = re.compile(r"\|\s*variable\s*\|\s*default\s*\|\s*meaning\s*\|")
CODE = re.compile(r"`([^`]*)`")


def readme_table(readme: Path) -> dict[str, str]:
    """The table's variables and the first code span of their default cell ("" when none)."""
    lines = readme.read_text().splitlines()
    start = next((i for i, line in enumerate(lines) if HEADER.fullmatch(line.strip())), None)
    assert start is not None, f"{readme} has no | variable | default | meaning | table"
    rows: dict[str, str] = {}
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        name, default = (cell.strip() for cell in line.strip("|").split("|")[:2])
        variable = CODE.fullmatch(name)
        if variable is None:  # a row that explains a variable's keys ("namespace keys")
            continue
        code = CODE.search(default)
        rows[variable[1]] = code[1] if code else ""
    return rows


def same_default(text: str, value: Any) -> bool:
    """Whether the README's ``text`` says ``value``: as YAML, or as the string itself."""
    try:
        if yaml.safe_load(text) == value:
            return True
    except yaml.YAMLError:
        pass
    return text == value


@pytest.mark.parametrize("role", sorted(p.name for p in ROLES.iterdir() if p.is_dir()))
def test_the_readme_table_is_generated_from_the_declaration(role: str) -> None:
    readme = (ROLES / role / "README.md").read_text()
    model = RoleLoader([ROLES]).load(role).vars_model
    if model is None:
        pytest.skip(f"{role} has no Vars yet: its defaults.yml is checked below")
    assert readme.count(BEGIN) == 1, f"{role}: README.md has no generated table"
    assert readme == reference.role_readme(role), f"{role}: README table is stale: run make docs"


@pytest.mark.parametrize(
    "role", sorted(p.name for p in ROLES.iterdir() if (p / "defaults.yml").is_file())
)
def test_the_readme_table_matches_defaults_yml(role: str) -> None:
    defaults = yaml.safe_load((ROLES / role / "defaults.yml").read_text()) or {}
    table = readme_table(ROLES / role / "README.md")
    assert sorted(set(defaults) - set(table)) == [], f"{role}: in defaults.yml, not in README"
    assert sorted(set(table) - set(defaults)) == [], f"{role}: in README, not in defaults.yml"
    wrong = {
        name: (table[name], value)
        for name, value in defaults.items()
        if not same_default(table[name], value)
    }
    assert wrong == {}, f"{role}: README default != defaults.yml (README, defaults.yml)"


def test_the_table_reader_finds_what_a_table_says(tmp_path: Path) -> None:
    readme = tmp_path / "README.md"
    readme.write_text(
        "# r\n\n| variable | default | meaning |\n|---|---|---|\n"
        '| `r_a` | `""` (required) | a |\n| keys of a | | ... |\n| `r_b` | `[x, y]` | b |\n\n'
        "| `r_c` | `1` | after the table |\n"
    )
    assert readme_table(readme) == {"r_a": '""', "r_b": "[x, y]"}
    assert same_default('""', "") and same_default("[x, y]", ["x", "y"])
    assert same_default("{{ r_root }}/etc", "{{ r_root }}/etc") and not same_default("1", 2)
