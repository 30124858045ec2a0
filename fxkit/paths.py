"""Where the built-in roles, playbooks, inventories and gates live.

In a wheel they are package data inside ``fxkit/`` (``fxkit/roles``, ``fxkit/playbooks``,
``fxkit/inventories``, ``fxkit/gates``); in a source checkout (and an editable install, which
points at it) they are the top-level ``roles/``, ``playbooks/``, ``inventory/`` and ``gates/``
folders beside ``fxkit/``.
Found from the package's own location: ``importlib.util.find_spec("fxkit.roles")`` finds nothing
in an editable install, because these folders hold no ``__init__.py``.
"""

from __future__ import annotations

from pathlib import Path

from fxkit.errors import FxkitError

PACKAGE = Path(__file__).resolve().parent

#: Folder name inside the installed package -> folder name in the source checkout.
_BUILTIN = {
    "roles": "roles",
    "playbooks": "playbooks",
    "inventories": "inventory",
    "gates": "gates",
}


def builtin(kind: str) -> Path:
    """The folder of built-in ``roles``, ``playbooks``, ``inventories`` or ``gates``."""
    installed = PACKAGE / kind
    checkout = PACKAGE.parent / _BUILTIN[kind]
    for folder in (installed, checkout):
        if folder.is_dir():
            return folder
    raise FxkitError(
        f"the built-in {kind} are missing (looked in {installed} and {checkout})",
        hint="reinstall fxkit: pip install --force-reinstall fxkit",
    )


def resolve(path: str | Path, kind: str) -> Path:
    """``path`` if it exists, else the built-in file or folder of that name (site -> site.yml)."""
    given = Path(path)
    if given.exists() or given.is_absolute():
        return given
    for suffix in ("", ".yml", ".yaml"):
        candidate = builtin(kind) / f"{path}{suffix}"
        if candidate.exists():
            return candidate
    return given
