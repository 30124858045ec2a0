"""Inventory sources as ``-i`` takes them: a file, a directory of files, or ``host1,host2``.

A directory is read as Ansible reads it: every entry, sorted by name, except hidden ones,
``group_vars``, ``host_vars``, ``vars_plugins`` and names ending in one of
:data:`IGNORED_SUFFIXES` (Ansible's ``INVENTORY_IGNORE_EXTS``); a subdirectory is read the
same way. ``group_vars/`` and ``host_vars/`` are read from the source given with ``-i``: inside
a directory source, beside a file source (see :func:`vars_folder`).

A file ending in ``.yml``, ``.yaml`` or ``.json`` is YAML; one without a suffix is YAML when it
parses as a mapping, else INI; any other file is INI. Where Ansible would warn that it could
not parse a source and go on without its hosts, fxkit refuses it.
"""

from __future__ import annotations

import os
from pathlib import Path

from fxkit.errors import InventoryError
from fxkit.inventory.draft import Draft
from fxkit.inventory.hostnames import parse_address
from fxkit.inventory.ini_format import parse_ini
from fxkit.inventory.yaml_format import parse_yaml
from fxkit.yamlfile import Marked, read_text, read_yaml

YAML_SUFFIXES = (".yml", ".yaml", ".json")
IGNORED_NAMES = ("group_vars", "host_vars", "vars_plugins")
IGNORED_SUFFIXES = (
    *(".pyc", ".pyo", ".swp", ".bak", "~", ".rpm", ".md", ".txt", ".rst"),
    *(".orig", ".cfg", ".retry"),
)


def is_host_list(source: str | Path) -> bool:
    """``-i 'gpu01,gpu02:2222'`` (a comma, and no such path): a list of hosts."""
    return "," in str(source) and not os.path.exists(source)


def vars_folder(source: str | Path) -> Path | None:
    """Where ``group_vars/`` and ``host_vars/`` of ``source`` are: the directory itself, or the
    directory of the file; none for a host list."""
    if is_host_list(source):
        return None
    path = Path(source)
    return path if path.is_dir() else path.parent


def read_source(draft: Draft, source: str | Path) -> None:
    """Add one ``-i`` source to ``draft``."""
    if is_host_list(source):
        _read_host_list(draft, str(source))
        return
    path = Path(source)
    if not path.exists():
        raise InventoryError(
            "inventory not found",
            where=str(path),
            hint="pass an inventory file or directory with -i, e.g. -i inventory/mi308x.yml",
        )
    if not path.is_dir():
        _read_file(draft, path)
    elif not _read_directory(draft, path):
        raise InventoryError(
            "no inventory file in this directory",
            where=str(path),
            hint="put YAML or INI inventory files in it (hidden files, group_vars/, host_vars/ "
            f"and names ending in {', '.join(IGNORED_SUFFIXES)} are not read)",
        )


def _read_directory(draft: Draft, folder: Path) -> int:
    """Read the inventory files in ``folder`` and its subdirectories; how many there were."""
    count = 0
    for entry in sorted(os.listdir(folder)):
        path = folder / entry
        if _ignored(entry):
            continue
        if path.is_dir():
            count += _read_directory(draft, path)
        else:
            _read_file(draft, path)
            count += 1
    return count


def _ignored(name: str) -> bool:
    return name.startswith(".") or name in IGNORED_NAMES or name.endswith(IGNORED_SUFFIXES)


def _read_host_list(draft: Draft, source: str) -> None:
    """Ansible's ``host_list`` source: no ranges, and a host already known is left as it is."""
    for item in source.split(","):
        item = item.strip()
        if not item:
            continue
        try:
            name, port = parse_address(item, allow_ranges=False)
        except ValueError:
            name, port = item, None
        if name not in draft.hosts:
            draft.add_host("ungrouped", name, port)


def _read_file(draft: Draft, path: Path) -> None:
    if path.suffix == ".toml":
        raise InventoryError(
            "TOML inventories are not supported",
            where=str(path),
            hint="write it as YAML (ansible-inventory -i THIS --list --yaml) or INI",
        )
    text = read_text(path, InventoryError)
    if text.startswith("#!") and os.access(path, os.X_OK):
        raise InventoryError(
            "executable inventory scripts are not supported",
            where=str(path),
            hint="save its output as a file (ansible-inventory -i THIS --list > hosts.json), "
            "or move the script out of the inventory directory",
        )
    if path.suffix in YAML_SUFFIXES:
        parse_yaml(draft, path)
        return
    if not path.suffix and not text.lstrip().startswith("["):
        try:
            data = read_yaml(path, InventoryError)
        except InventoryError:
            data = None
        if isinstance(data, Marked):
            parse_yaml(draft, path, data)
            return
    parse_ini(draft, path, text)
