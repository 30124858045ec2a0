"""``group_vars/`` and ``host_vars/`` beside the inventory file, found as Ansible finds them.

For a group or host NAME the first of ``NAME``, ``NAME.yml``, ``NAME.yaml``, ``NAME.json`` that
exists is used; if it is a directory, every file inside it with one of these suffixes or none
is read and merged, later files winning: entries sorted by name, a subdirectory without a
suffix read the same way where it sorts, hidden entries and backups (``name~``) skipped, as
Ansible's ``host_group_vars`` plugin does.
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
            return _files_in(path)
        if path.exists():
            return [path]
    return []


def _files_in(folder: Path) -> list[Path]:
    found = []
    for entry in sorted(folder.iterdir(), key=lambda path: path.name):
        if entry.name.startswith(".") or entry.name.endswith("~"):
            continue
        if entry.is_dir() and not entry.suffix:
            found += _files_in(entry)
        elif entry.is_file() and entry.suffix in EXTENSIONS:
            found.append(entry)
    return found
