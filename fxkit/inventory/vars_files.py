"""``group_vars/`` and ``host_vars/`` beside the inventory file, found as Ansible finds them.

For a group or host NAME the first of ``NAME``, ``NAME.yml``, ``NAME.yaml``, ``NAME.json`` that
exists is used; if it is a directory, every such file inside it (recursively, sorted by path,
hidden files skipped) is read and merged, later files winning.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fxkit.errors import InventoryError
from fxkit.variables import load_vars_file

EXTENSIONS = ("", ".yml", ".yaml", ".json")


def read_vars(folder: Path, name: str) -> dict[str, Any]:
    """Merged variables for ``name`` from ``folder`` (``group_vars`` or ``host_vars``)."""
    merged: dict[str, Any] = {}
    for path in _files_for(folder, name):
        merged.update(load_vars_file(path, InventoryError))
    return merged


def _files_for(folder: Path, name: str) -> list[Path]:
    if not folder.is_dir():
        return []
    for extension in EXTENSIONS:
        path = folder / f"{name}{extension}"
        if path.is_dir():
            return sorted(
                child
                for child in path.rglob("*")
                if child.is_file()
                and child.suffix in EXTENSIONS
                and not any(part.startswith(".") for part in child.relative_to(path).parts)
            )
        if path.is_file():
            return [path]
    return []
