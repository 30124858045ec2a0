"""Reading YAML files with line numbers, so every mistake in one can name its file and line.

:func:`read_yaml` returns mappings as :class:`Marked` and lists as :class:`MarkedList`, which
remember their lines (or, with ``lines=False``, plain dicts and lists: quicker; with
``lines="top"``, plain ones under a top mapping that remembers its keys' lines, for vars files);
:func:`key_origins` names where each key of a mapping was set (``path:line``);
:func:`line_at` finds the line of a location such as ``["roles", 2]``; :func:`plain` turns the
result back into plain dicts and lists, :func:`type_name` names a value's type in messages.
Every problem (a missing file, a file that is not UTF-8, a syntax error, aliases that expand
past :data:`MAX_ALIAS_VALUES`) is raised as the :class:`~fxkit.errors.FxkitError` subclass the
caller names, at file:line.

Files are parsed by libyaml (PyYAML's C parser) where PyYAML has it, with the cycle collector
paused; its nodes keep their lines like the Python parser's (docs/BENCHMARKS.md, "Reading YAML").
:func:`read_text` reads any UTF-8 file with the same errors.
"""

from __future__ import annotations

import contextlib
import gc
import json
import reprlib
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Literal

import yaml

from fxkit.errors import FxkitError

#: Values that aliases (``*name``) may add beyond those written in a file. Past that, the file
#: is refused as an alias bomb ("billion laughs"): a few lines that expand to billions of values.
MAX_ALIAS_VALUES = 1_000_000

#: How deep lists and mappings of a JSON file may nest (a model config or a result nests 6).
MAX_JSON_DEPTH = 64

_Base: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # without libyaml: pure Python
_TEXT = "tag:yaml.org,2002:str"


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


class _AliasBomb(yaml.MarkedYAMLError):
    """Aliases that expand past :data:`MAX_ALIAS_VALUES` values, or into themselves."""


class _Unreadable(yaml.constructor.ConstructorError):
    """A number or date Python refuses to convert."""


class _PlainLoader(_Base):
    """Plain dicts and lists (PyYAML's safe constructors)."""


class _MarkingLoader(_Base):
    """:class:`Marked` mappings and :class:`MarkedList` lists."""

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


class _TopMarkingLoader(_PlainLoader):
    """Plain values under a :class:`Marked` top mapping that knows the lines of its text keys
    (a vars file's variables)."""

    def construct_document(self, node: yaml.Node) -> Any:
        data = super().construct_document(node)
        if not isinstance(data, dict):
            return data
        top = Marked(_line(node))
        top.update(data)
        # node.value is flattened by now (merge keys in place), so the last line of a key wins
        top.key_lines = {k.value: k.start_mark.line + 1 for k, _ in node.value if k.tag == _TEXT}
        return top


def _checked(construct: Any, what: str) -> Any:
    """``construct`` (a scalar constructor) raising a marked error for a value Python refuses
    (an integer of more than 4300 digits, the date 2001-13-01) instead of a bare ValueError."""

    def checked(loader: yaml.SafeLoader, node: yaml.ScalarNode) -> Any:
        try:
            return construct(loader, node)
        except ValueError as exc:
            reason = str(exc).split("; use")[0]  # not Python's advice to raise its digit limit
            problem = f"{short(node.value)} is not {what} fxkit can read: {reason}"
            raise _Unreadable(problem=problem, problem_mark=node.start_mark) from None

    return checked


for _loader in (_PlainLoader, _MarkingLoader):
    _loader.add_constructor("tag:yaml.org,2002:int", _checked(_Base.construct_yaml_int, "a number"))
    _loader.add_constructor(
        "tag:yaml.org,2002:timestamp", _checked(_Base.construct_yaml_timestamp, "a date")
    )

_MarkingLoader.add_constructor(
    yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _MarkingLoader.construct_marked
)
_MarkingLoader.add_constructor(
    yaml.resolver.BaseResolver.DEFAULT_SEQUENCE_TAG, _MarkingLoader.construct_marked_list
)


_LOADERS: dict[bool | str, Any] = {
    True: _MarkingLoader,
    "top": _TopMarkingLoader,
    False: _PlainLoader,
}


def read_yaml(
    path: Path,
    error: type[FxkitError] = FxkitError,
    *,
    what: str = "file",
    hint: str | None = None,
    lines: bool | Literal["top"] = True,
) -> Any:
    """Parse ``path`` (``None`` when empty); ``lines=False`` gives plain dicts and lists,
    ``lines="top"`` plain ones under a :class:`Marked` top mapping (quick, and a vars file's
    variables keep their lines).

    A file that cannot be read (``hint`` says what to do), is not UTF-8 or is not valid YAML
    raises ``error`` naming file:line.
    """
    text = read_text(path, error, what, hint)
    loader = _LOADERS[lines](text)
    try:
        with _cyclic_gc_paused():
            node = loader.get_single_node()
            if node is None:
                return None
            _refuse_alias_bombs(node, text)
            return loader.construct_document(node)
    except yaml.MarkedYAMLError as exc:
        raise _yaml_error(exc, path, error) from None
    except yaml.YAMLError as exc:
        raise error(f"invalid YAML: {exc}", where=str(path), hint="fix the YAML") from None
    except RecursionError:
        raise error(
            "invalid YAML: values nested too deeply",
            where=str(path),
            hint="fxkit reads values nested at most a few hundred levels deep",
        ) from None
    finally:
        loader.dispose()


@contextlib.contextmanager
def _cyclic_gc_paused() -> Iterator[None]:
    """Python's cycle collector off while a file loads: it would walk every object made so
    far, again and again (half the time of a 20 MB file). What a load makes holds no cycles
    (an alias inside itself is refused), so reference counting frees it all the same."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def read_text(
    path: Path, error: type[FxkitError] = FxkitError, what: str = "file", hint: str | None = None
) -> str:
    """The text of a UTF-8 file; one that cannot be read, or is not UTF-8, raises ``error``
    naming file:line (and the column of the first bad byte)."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise error(f"cannot read {what}: {exc.strerror}", where=str(path), hint=hint) from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        before = data[data.rfind(b"\n", 0, exc.start) + 1 : exc.start]
        column = len(before.decode("utf-8", errors="replace")) + 1
        raise error(
            f"cannot read {what}: not UTF-8: byte 0x{data[exc.start]:02x} at line {line}, "
            f"column {column} ({exc.reason})",
            where=f"{path}:{line}",
            hint="save the file as UTF-8 (e.g. iconv -f latin1 -t utf-8 FILE)",
        ) from None


def read_json(
    path: Path, error: type[FxkitError] = FxkitError, what: str = "file", hint: str | None = None
) -> Any:
    """Parse the JSON file at ``path``. One that cannot be read, is not JSON, nests deeper than
    :data:`MAX_JSON_DEPTH` or holds a number of more than 4300 digits raises ``error``."""
    text = read_text(path, error, what, hint)
    try:
        data = json.loads(text)
        deep = _too_deep(data)
    except json.JSONDecodeError as exc:
        raise error(f"{what} is not JSON: {exc}", where=f"{path}:{exc.lineno}", hint=hint) from None
    except ValueError:  # Python's limit on the digits of an integer
        raise error(
            f"{what} holds a number of more than 4300 digits", where=str(path), hint=hint
        ) from None
    except RecursionError:
        deep = True
    if deep:
        raise error(
            f"{what} is nested too deeply (more than {MAX_JSON_DEPTH} levels)",
            where=str(path),
            hint=hint,
        )
    return data


def _too_deep(data: Any) -> bool:
    """Whether lists and mappings in ``data`` nest deeper than :data:`MAX_JSON_DEPTH`."""
    stack = [(data, 0)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, dict | list):
            if depth == MAX_JSON_DEPTH:
                return True
            items = value.values() if isinstance(value, dict) else value
            stack.extend((item, depth + 1) for item in items)
    return False


def _yaml_error(exc: yaml.MarkedYAMLError, path: Path, error: type[FxkitError]) -> FxkitError:
    mark = exc.problem_mark or exc.context_mark
    if isinstance(exc, _AliasBomb):
        hint = (
            f"aliases may add at most {MAX_ALIAS_VALUES:,} values to a file and never contain "
            "themselves: write the values out"
        )
    elif isinstance(exc, _Unreadable):
        hint = "write a plausible value, or quote it if it is a text"
    elif isinstance(exc, yaml.constructor.ConstructorError):
        hint = "fxkit reads plain YAML: no custom tags (such as !vault), plain mapping keys"
    else:
        hint = (
            "a YAML syntax error: check the indentation and quoting on that line and the one above"
        )
    return error(
        f"invalid YAML: {exc.problem or exc.context}",
        where=f"{path}:{mark.line + 1}" if mark else str(path),
        hint=hint,
    )


def _refuse_alias_bombs(root: yaml.Node, text: str) -> None:
    """Raise :class:`_AliasBomb` when aliases add more than :data:`MAX_ALIAS_VALUES` values
    to the document, or an alias is inside the value it names (it would never end)."""
    if "*" not in text:  # no alias at all
        return
    written, expanded = _count_values(root)
    if expanded is None or expanded - written > MAX_ALIAS_VALUES:
        mark, problem = _offending_alias(text)
        raise _AliasBomb(problem=problem, problem_mark=mark)


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.MappingNode):
        return [child for pair in node.value for child in pair]
    return node.value


def _count_values(root: yaml.Node) -> tuple[int, int | None]:
    """Values as written in a document and once its aliases are expanded (``None`` for an
    alias inside the value it names). Linear in the nodes: each is sized once."""
    sizes: dict[int, int] = {}  # collection node -> its size, expanded
    open_: set[int] = set()  # collections being sized: the current one and its parents
    written = 0
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, sized_children = stack.pop()
        key = id(node)
        if isinstance(node, yaml.ScalarNode):
            written += node is root
        elif sized_children:
            open_.remove(key)
            children = _children(node)
            sizes[key] = 1 + sum(sizes.get(id(child), 1) for child in children)
            written += 1 + sum(isinstance(child, yaml.ScalarNode) for child in children)
        elif key in open_:
            return written, None
        elif key not in sizes:
            open_.add(key)
            stack.append((node, True))
            stack.extend((child, False) for child in _children(node))
    return written, sizes.get(id(root), 1)


def _offending_alias(text: str) -> tuple[Any, str]:
    """The mark of the alias at which the document grows past :data:`MAX_ALIAS_VALUES` added
    values (or that is inside the value it names), and what is wrong with it: replays the
    parser's events, sizing each anchored value."""
    anchors: dict[str, int] = {}
    stack: list[list[Any]] = [[None, 0]]  # [anchor, size] of each open collection
    added = 0
    for event in yaml.parse(text, _Base):
        if isinstance(event, yaml.CollectionStartEvent):
            stack.append([event.anchor, 1])
            continue
        if isinstance(event, yaml.CollectionEndEvent):
            anchor, size = stack.pop()
        elif isinstance(event, yaml.AliasEvent):
            if any(anchor == event.anchor for anchor, _ in stack):
                return event.start_mark, f"alias *{event.anchor} is inside the value it names"
            anchor, size = None, anchors.get(event.anchor or "", 0)
            added += size
            if added > MAX_ALIAS_VALUES:
                return event.start_mark, (
                    f"aliases expand to more than {MAX_ALIAS_VALUES:,} values here "
                    f"(*{event.anchor} is {size:,} values)"
                )
        elif isinstance(event, yaml.ScalarEvent):
            anchor, size = event.anchor, 1
        else:
            continue
        if anchor:
            anchors[anchor] = size
        stack[-1][1] += size
    raise AssertionError("_count_values and _offending_alias disagree")  # pragma: no cover


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


def key_origins(path: Path, mapping: Any) -> dict[str, str]:
    """``path:line`` of each key of a mapping from :func:`read_yaml` (none unless it is a
    :class:`Marked`)."""
    if not isinstance(mapping, Marked):
        return {}
    at = f"{path}:"  # formatting the path once: a vars file may set thousands of variables
    return {key: at + str(line) for key, line in mapping.key_lines.items()}


def type_name(value: Any) -> str:
    """The name of a YAML value's type for messages: ``dict``, ``list``, ``str``, ``int``..."""
    for base in (dict, list):
        if isinstance(value, base):
            return base.__name__
    return type(value).__name__


_SHORT = reprlib.Repr()
_SHORT.maxlevel, _SHORT.maxstring, _SHORT.maxlong, _SHORT.maxother = 3, 60, 30, 60


def short(value: Any) -> str:
    """``repr(value)`` cut short for a message: long numbers, texts and lists, and nesting."""
    return _SHORT.repr(value)


def plain(value: Any) -> Any:
    """``value`` with every :class:`Marked` and :class:`MarkedList` made a plain dict or list."""
    if isinstance(value, dict):
        return {key: plain(item) for key, item in value.items()}
    if isinstance(value, list):
        return [plain(item) for item in value]
    return value
