"""Every built-in role declares its variables (role.py's ``Vars``), and its README's table of
variables is the one that declaration generates (``make docs`` rewrites it)."""

from __future__ import annotations

from pathlib import Path

import pytest

from fxkit import reference
from fxkit.engine.role import RoleLoader
from fxkit.engine.rolevars import BEGIN

ROLES = Path(__file__).resolve().parent.parent / "roles"


@pytest.mark.parametrize("role", sorted(p.parent.name for p in ROLES.glob("*/role.py")))
def test_the_readme_table_is_generated_from_the_declaration(role: str) -> None:
    readme = (ROLES / role / "README.md").read_text()
    assert RoleLoader([ROLES]).load(role).vars_model is not None, f"{role} declares no Vars"
    assert not (ROLES / role / "defaults.yml").exists()
    assert readme.count(BEGIN) == 1, f"{role}: README.md has no generated table"
    assert readme == reference.role_readme(role), f"{role}: README table is stale: run make docs"
