"""Shared paths and a helper for the inventory tests."""

from __future__ import annotations

import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DATA = Path(__file__).resolve().parent / "data" / "inventory"
FLEET = DATA / "fleet"
#: real ansible-core 2.19 output for FLEET / "fleet.yml" (see its README.md)
ANSIBLE = FLEET / "ansible"


def write(folder: Path, name: str, text: str) -> Path:
    """Write dedented ``text`` to ``folder/name`` (parents created) and return the path."""
    path = folder / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text).lstrip("\n"))
    return path
