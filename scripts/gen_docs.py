"""Rewrite the generated parts of the docs: each role's README table of variables, from its
role.py ``Vars`` (between the markers of :mod:`fxkit.engine.rolevars`). Run by ``make docs``;
tests/test_role_docs.py fails when a README is out of step.

``python scripts/gen_docs.py [ROLES_FOLDER ...]`` does the same for other roles folders (a
playbook's own ``roles/``); without one, fxkit's built-in roles."""

from __future__ import annotations

import sys
from pathlib import Path

from fxkit.engine.role import RoleLoader
from fxkit.engine.rolevars import BEGIN, END, readme_table

ROLES = Path(__file__).resolve().parent.parent / "roles"


def role_readme(role: str, roles: Path = ROLES) -> str:
    """The role's README with its table regenerated."""
    loaded = RoleLoader([roles]).load(role)
    readme = (roles / role / "README.md").read_text()
    if loaded.vars_model is None or BEGIN not in readme:
        return readme
    head, rest = readme.split(BEGIN, 1)
    return head + readme_table(loaded.vars_model) + rest.split(END, 1)[1]


def main(folders: list[str]) -> int:
    for roles in [Path(f) for f in folders] or [ROLES]:
        for folder in sorted(p for p in roles.iterdir() if (p / "role.py").is_file()):
            readme = folder / "README.md"
            text = role_readme(folder.name, roles)
            if text != readme.read_text():
                readme.write_text(text)
                print(f"rewrote {readme}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
