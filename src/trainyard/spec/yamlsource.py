"""Parse rendered spec YAML, and map field paths back to lines of that text.

Parsing uses libyaml (``CSafeLoader``) where PyYAML has it. Lines are looked up only when
there is a problem to report: the text is composed again into PyYAML nodes, whose marks
give the line of each key and value.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from functools import cached_property
from typing import Any

import yaml

from trainyard.errors import SpecError, SpecProblem

__all__ = ["Loc", "DuplicateKey", "parse_yaml", "LineIndex"]

Loc = tuple[str | int, ...]
_BASE_LOADER: type = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class DuplicateKey(Exception):
    """A key given twice in one YAML mapping (PyYAML would silently keep the last)."""

    def __init__(self, key: object, line: int) -> None:
        super().__init__(key)
        self.key, self.line = key, line


class _SpecLoader(_BASE_LOADER):  # type: ignore[misc, valid-type]
    """Safe loader that refuses duplicate keys instead of keeping the last one."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Hashable] = set()
        for key_node, _ in node.value:
            key = key_node.value if isinstance(key_node, yaml.ScalarNode) else None
            if key is None or key == "<<":
                continue
            if key in seen:
                raise DuplicateKey(key, key_node.start_mark.line + 1)
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def parse_yaml(text: str, *, file: str | None = None) -> Any:
    """Parse rendered spec text.

    Raises:
        SpecError: not YAML, or a key repeated in one mapping; with the line.
    """
    try:
        return yaml.load(text, Loader=_SpecLoader)
    except DuplicateKey as exc:
        message = f"key {exc.key!r} is given twice in one mapping; keep one"
        raise SpecError([SpecProblem("", message, exc.line, file)]) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = mark.line + 1 if mark is not None else None
        reason = str(getattr(exc, "problem", None) or exc).strip()
        context = getattr(exc, "context", None)
        detail = f"{reason} ({context})" if context else reason
        message = f"not valid YAML: {detail}; check indentation and quoting"
        raise SpecError([SpecProblem("", message, line, file)]) from None


class LineIndex:
    """Finds the line of a field path in rendered YAML text (composed lazily, once)."""

    def __init__(self, text: str) -> None:
        self._text = text

    @cached_property
    def _root(self) -> yaml.Node | None:
        try:
            return yaml.compose(self._text, Loader=_BASE_LOADER)
        except yaml.YAMLError:
            return None

    def line_of(self, loc: Sequence[str | int], offset: int | None = None) -> int | None:
        """The 1-based line of the deepest node along ``loc`` that exists.

        Args:
            loc: field path segments, e.g. ``("workflow", "tasks", 0, "command")``.
            offset: a character offset inside the scalar at ``loc``; for a literal block
                scalar (``|``) the line of that character is returned.
        """
        node, line = self._root, None
        for index, segment in enumerate(loc):
            found = _child(node, segment)
            if found is None:
                return line
            node, line = found[1], found[0]
            if index == len(loc) - 1 and offset is not None:
                return _offset_line(node, offset) or line
        return line


def _child(node: yaml.Node | None, segment: str | int) -> tuple[int, yaml.Node] | None:
    if isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            if isinstance(key, yaml.ScalarNode) and key.value == str(segment):
                return key.start_mark.line + 1, value
    if isinstance(node, yaml.SequenceNode) and isinstance(segment, int):
        if 0 <= segment < len(node.value):
            item = node.value[segment]
            return item.start_mark.line + 1, item
    return None


def _offset_line(node: yaml.Node, offset: int) -> int | None:
    if not isinstance(node, yaml.ScalarNode) or node.style != "|":
        return None
    return node.start_mark.line + 2 + node.value.count("\n", 0, offset)
