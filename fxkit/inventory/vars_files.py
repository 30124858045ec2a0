"""``group_vars/`` and ``host_vars/`` of an inventory source, found as Ansible finds them.

For a group or host NAME the first of ``NAME``, ``NAME.yml``, ``NAME.yaml``, ``NAME.json`` that
exists is used; if it is a directory, every file inside it with one of these suffixes or none
is read and merged, later files winning: entries sorted by name, a subdirectory without a
suffix read the same way where it sorts, hidden entries and backups (``name~``) skipped, as
Ansible's ``host_group_vars`` plugin does.
"""

from __future__ import annotations

import os
from pathlib import Path

from fxkit.errors import InventoryError
from fxkit.varfiles import Variables, load_vars_file

EXTENSIONS = ("", ".yml", ".yaml", ".json")


class VarsFiles:
    """The ``group_vars`` or ``host_vars`` folder of one source, for one inventory load: listed
    once, each file read once, however many hosts and groups ask."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self._names = set(os.listdir(folder)) if folder.is_dir() else set()
        self._read: dict[str, Variables] = {}

    def read(self, name: str) -> Variables:
        """Merged variables for group or host ``name``, each set at ``path:line``."""
        if name not in self._read:
            merged = Variables()
            for path in self._files_for(name):
                merged.merge(load_vars_file(path, InventoryError))
            self._read[name] = merged
        return self._read[name]

    def _files_for(self, name: str) -> list[Path]:
        for extension in EXTENSIONS:
            if f"{name}{extension}" in self._names:
                path = self.folder / f"{name}{extension}"
                return _files_in(path) if path.is_dir() else [path]
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
