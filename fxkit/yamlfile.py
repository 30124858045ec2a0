"""Reading YAML files with line numbers, so every mistake in one can name its file and line.

:func:`read_yaml` returns mappings as :class:`Marked` and lists as :class:`MarkedList`, which
remember their lines; :func:`line_at` finds the line of a location such as ``["roles", 2]``;
:func:`plain` turns the result back into plain dicts and lists,
:func:`type_name` names a value's type in messages. Every problem (a missing file,
a syntax error) is raised as the :class:`~fxkit.errors.FxkitError` subclass the caller names.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from fxkit.errors import FxkitError


class Marked(dict):
    """A YAML mapping that remembers its line and the line of each key (1-based)."""

    def __init__(self, line: int) -> None:
        super().__init__()
        self.line = line
        self.key_lines: dict[Any, int] = {}
        self.value_lines: dict[Any, int] = {}

    def line_of(self, key: Any) -> int:
        return self.key_lines.get(key, self.line)


class MarkedList(list):
    """A YAML list that remembers its line and the line of each item (1-based)."""

    def __init__(self, line: int) -> None:
        super().__init__()
        self.line = line
        self.item_lines: list[int] = []


def _line(node: yaml.Node) -> int:
    return node.start_mark.line + 1


class _MarkingLoader(yaml.SafeLoader):
    def construct_marked(self, node: yaml.MappingNode) -> Marked:
        self.flatten_mapping(node)
        mapping = Marked(_line(node))
        for key_node, value_node in node.value:
            key = self.construct_object(key_node, deep=True)
            try:
                hash(key)
            except TypeError:
                raise yaml.constructor.ConstructorError(
                    problem="a mapping key must be a plain value, not a list or mapping",
                    problem_mark=key_node.start_mark,
                ) from None
            mapping[key] = self.construct_object(value_node, deep=True)
            mapping.key_lines[key] = _line(key_node)
            mapping.value_lines[key] = _line(value_node)
        return mapping

    def construct_marked_list(self, node: yaml.SequenceNode) -> MarkedList:
        items = MarkedList(_line(node))
        items.extend(self.construct_object(child, deep=True) for child in node.value)
        items.item_lines = [_line(child) for child in node.value]
        return items


_MarkingLoader.add_constructor(
    yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _MarkingLoader.construct_marked
)
_MarkingLoader.add_constructor(
    yaml.resolver.BaseResolver.DEFAULT_SEQUENCE_TAG, _MarkingLoader.construct_marked_list
)


def read_yaml(
    path: Path,
    error: type[FxkitError] = FxkitError,
    *,
    what: str = "file",
    hint: str | None = None,
) -> Any:
    """Parse ``path`` (``None`` when empty). A file that cannot be read (``hint`` says what to
    do) or is not valid YAML raises ``error`` naming file:line."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) else exc
        raise error(f"cannot read {what}: {reason}", where=str(path), hint=hint) from None
    loader = _MarkingLoader(text)
    loader.name = str(path)
    try:
        return loader.get_single_data()
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        syntax = not isinstance(exc, yaml.constructor.ConstructorError)
        raise error(
            f"invalid YAML: {exc.problem or exc.context}",
            where=f"{path}:{mark.line + 1}" if mark else str(path),
            hint="a YAML syntax error: check the indentation and quoting on that line and the "
            "one above it"
            if syntax
            else "fxkit reads plain YAML: no custom tags (such as !vault), plain mapping keys",
        ) from None
    except yaml.YAMLError as exc:
        raise error(f"invalid YAML: {exc}", where=str(path), hint="fix the YAML") from None
    finally:
        loader.dispose()


def line_at(data: Any, location: Sequence[Any]) -> tuple[int | None, list[int | str]]:
    """The line of the deepest value along ``location`` in data from :func:`read_yaml` (the
    key's line when the location ends at a key), and the parts of the location followed.

    Parts that are not in the YAML (e.g. Pydantic's union member names) are skipped.
    """
    line = getattr(data, "line", None)
    followed: list[int | str] = []
    for depth, part in enumerate(location):
        if isinstance(data, Marked) and part in data and isinstance(part, str):
            last = depth == len(location) - 1
            line = data.key_lines[part] if last else data.value_lines[part]
            data = data[part]
        elif isinstance(data, MarkedList) and isinstance(part, int) and 0 <= part < len(data):
            line = data.item_lines[part]
            data = data[part]
        else:
            continue
        followed.append(part)
    return line, followed


def type_name(value: Any) -> str:
    """The name of a YAML value's type for messages: ``dict``, ``list``, ``str``, ``int``..."""
    for base in (dict, list):
        if isinstance(value, base):
            return base.__name__
    return type(value).__name__


def plain(value: Any) -> Any:
    """``value`` with every :class:`Marked` and :class:`MarkedList` made a plain dict or list."""
    if isinstance(value, dict):
        return {key: plain(item) for key, item in value.items()}
    if isinstance(value, list):
        return [plain(item) for item in value]
    return value
