"""Reading YAML with line numbers, so every mistake can name its file and line."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from fxkit.errors import InventoryError


class Marked(dict):
    """A YAML mapping that remembers the line of each key (``line_of``), 1-based."""

    def __init__(self, line: int) -> None:
        super().__init__()
        self.line = line
        self.key_lines: dict[Any, int] = {}

    def line_of(self, key: Any) -> int:
        return self.key_lines.get(key, self.line)


class _MarkingLoader(yaml.SafeLoader):
    def construct_marked(self, node: yaml.MappingNode) -> Marked:
        self.flatten_mapping(node)
        mapping = Marked(node.start_mark.line + 1)
        for key_node, value_node in node.value:
            key = self.construct_object(key_node, deep=True)
            try:
                hash(key)
            except TypeError:
                raise InventoryError(
                    "a mapping key must be a plain value, not a list or mapping",
                    where=f"{key_node.start_mark.name}:{key_node.start_mark.line + 1}",
                ) from None
            mapping[key] = self.construct_object(value_node, deep=True)
            mapping.key_lines[key] = key_node.start_mark.line + 1
        return mapping


_MarkingLoader.add_constructor(
    yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _MarkingLoader.construct_marked
)


def read_yaml(path: Path) -> Any:
    """Parse ``path``; mappings come back as :class:`Marked`. Syntax errors name file:line."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise InventoryError(f"cannot read: {exc.strerror}", where=str(path)) from None
    loader = _MarkingLoader(text)
    loader.name = str(path)
    try:
        return loader.get_single_data()
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = f":{mark.line + 1}" if mark else ""
        raise InventoryError(
            f"YAML syntax error: {exc.problem or exc.context}",
            where=f"{path}{line}",
            hint="check the indentation and quoting on that line and the one above it",
        ) from None
    except yaml.YAMLError as exc:
        raise InventoryError(f"YAML error: {exc}", where=str(path)) from None
    finally:
        loader.dispose()


def plain(value: Any) -> Any:
    """``value`` with every :class:`Marked` turned back into a plain dict (for host variables)."""
    if isinstance(value, dict):
        return {key: plain(item) for key, item in value.items()}
    if isinstance(value, list):
        return [plain(item) for item in value]
    return value
