"""Rewrite the generated parts of the docs: each role's README table of variables, from its
role.py ``Vars`` (between the markers of :mod:`fxkit.engine.rolevars`). Run by ``make docs``;
tests/test_role_docs.py fails when a README is out of step."""

from __future__ import annotations

import sys
from pathlib import Path

from fxkit.engine.role import RoleLoader
from fxkit.engine.rolevars import BEGIN, END, readme_table

ROLES = Path(__file__).resolve().parent.parent / "roles"


def role_readme(role: str) -> str:
    """The role's README with its table regenerated."""
    loaded = RoleLoader([ROLES]).load(role)
    readme = (ROLES / role / "README.md").read_text()
    if loaded.vars_model is None or BEGIN not in readme:
        return readme
    head, rest = readme.split(BEGIN, 1)
    return head + readme_table(loaded.vars_model) + rest.split(END, 1)[1]


def main() -> int:
    for folder in sorted(p for p in ROLES.iterdir() if (p / "role.py").is_file()):
        readme = folder / "README.md"
        text = role_readme(folder.name)
        if text != readme.read_text():
            readme.write_text(text)
            print(f"rewrote {readme}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
