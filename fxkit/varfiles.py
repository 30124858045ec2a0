"""Variables read from files: a mapping that knows where each was set (:class:`Variables`), and
the vars files of inventories and playbooks (:func:`load_vars_file`). Below the engine and the
inventory, which both read them."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from fxkit.errors import FxkitError
from fxkit.yamlfile import key_origins, read_yaml, type_name


class Variables(dict[str, Any]):
    """Variables that know where each was set: ``origins`` maps a name to ``path:line`` (or
    to how it was set, ``-e #2 on the command line``)."""

    def __init__(
        self, values: Mapping[str, Any] | None = None, origins: Mapping[str, str] | None = None
    ) -> None:
        super().__init__(values or {})
        self.origins = dict(origins or {})

    def merge(self, *others: Variables) -> None:
        """``update`` with each of ``others`` in turn, their origins too (later wins)."""
        for other in others:
            if other:
                self.update(other)
                for key in other:  # a key set again where nobody knows drops its old place
                    self.origins.pop(key, None)
                self.origins.update(other.origins)


def load_vars_file(path: Path, error: type[FxkitError] = FxkitError) -> Variables:
    """A YAML (or JSON) file holding one mapping of variables, each set at ``path:line``;
    empty files hold none.

    Mistakes are raised as ``error`` with the file and line.
    """
    value = read_yaml(
        path,
        error,
        what="variables file",
        hint="check that the file exists and is readable (vars_files paths start at the playbook)",
        lines="top",
    )
    if value is None:
        return Variables()
    return Variables(require_mapping(value, f"{path}:1", error), key_origins(path, value))


def require_mapping(value: Any, where: str, error: type[FxkitError] = FxkitError) -> dict[str, Any]:
    """``value`` when it is a mapping; else ``error`` at ``where``."""
    if not isinstance(value, dict):
        raise error(
            f"variables must be a mapping of names to values, not {type_name(value)}",
            where=where,
            hint="write key: value pairs",
        )
    return value


def truthy(value: Any) -> bool:
    """An inventory boolean: YAML gives bool, INI gives strings like 'yes' or 'True'."""
    if isinstance(value, str):
        return value.strip().lower() in ("1", "true", "yes", "on")
    return bool(value)
