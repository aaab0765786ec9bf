"""Parse rendered spec YAML, and map field paths back to lines of that text.

Composed once into PyYAML nodes with libyaml (``CSafeLoader``) where available; plain values
are built from the nodes by a small constructor, and the nodes are kept so a problem's field
path finds its line without parsing again. Guards: nesting deeper than ``MAX_DEPTH`` is refused
before libyaml sees it (its recursive composer can overflow the C stack), and aliases may not
expand past one value per character of text (no "billion laughs"). A key repeated in one
mapping is accepted as OSMO (PyYAML) accepts it: the last value wins; each repeat is kept as a
``RepeatedKey`` (both lines, whether the values differ) for the caller to warn about.
"""

from __future__ import annotations

import gc
import operator
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from itertools import accumulate
from typing import Any

import yaml

from trainyard.errors import SpecError, SpecProblem

__all__ = ["Loc", "MAX_DEPTH", "ParsedYaml", "RepeatedKey", "parse_yaml", "LineIndex", "gc_paused"]

Loc = tuple[str | int, ...]
MAX_DEPTH = 1000
_BASE_LOADER: type = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_STR = "tag:yaml.org,2002:str"
_FLOW_STEP = {ord("["): 1, ord("{"): 1, ord("]"): -1, ord("}"): -1}
_NOT_FLOW = bytes(b for b in range(256) if b not in _FLOW_STEP)
_SAFE = yaml.constructor.SafeConstructor()  # stateless use only: its scalar constructors


class _Loader(_BASE_LOADER):  # type: ignore[misc]  # a base chosen at run time (C or Python)
    """The safe loader, resolving tags faster: plain-scalar tags are cached per document
    (specs repeat the same keys and values thousands of times), collections get their
    default tag at once, and the unused path resolvers are skipped."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self.resolve = _fast_resolver(super().resolve)
        self.descend_resolver = self.ascend_resolver = _ignore


def _ignore(*args: Any) -> None:
    return None


def _fast_resolver(base: Any) -> Any:
    tags: dict[str, str] = {}
    scalar = yaml.ScalarNode
    collection: dict[type, str] = {
        yaml.SequenceNode: "tag:yaml.org,2002:seq",
        yaml.MappingNode: "tag:yaml.org,2002:map",
    }

    def resolve(kind: type, value: Any, implicit: Any) -> str:
        if kind is not scalar:
            return collection[kind]
        if not implicit[0]:
            return _STR
        tag = tags.get(value)
        if tag is None:
            tag = tags[value] = base(kind, value, implicit)
        return tag

    return resolve


class _Refused(Exception):
    def __init__(self, message: str, node: yaml.Node | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.line = node.start_mark.line + 1 if node is not None else None


@contextmanager
def gc_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector: building many small objects at once otherwise
    triggers full collections over them again and again (quadratic time on Python 3.11)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


@dataclass(frozen=True)
class RepeatedKey:
    """A key given more than once in one mapping; the value of its last occurrence is used.

    Attributes:
        loc: field path of the key (``("workflow", "tasks", 0, "files", 0, "path")``).
        key: the key as written.
        first_line, last_line: 1-based lines of the first and the last occurrence.
        same_value: whether every occurrence has the same value.
        used: the value used (the last one).
    """

    loc: Loc
    key: Any
    first_line: int
    last_line: int
    same_value: bool
    used: Any


@dataclass(frozen=True)
class ParsedYaml:
    """Parsed text: plain ``data``, the composed ``root`` node (for lines) and the keys
    given twice in one mapping (``repeated``, in text order)."""

    data: Any
    root: yaml.Node | None
    repeated: tuple[RepeatedKey, ...] = ()


def parse_yaml(text: str, *, file: str | None = None) -> ParsedYaml:
    """Parse rendered spec text into plain Python values, keeping the nodes.

    A key given twice in one mapping is not refused: the last value wins (as in PyYAML,
    which OSMO uses) and the repeat is listed in ``ParsedYaml.repeated``.

    Raises:
        SpecError: not YAML, nested too deeply, or aliases that expand too much; one
            problem with its line.
    """
    builder = _Builder(budget=len(text) + 16)
    try:
        _check_depth(text)
        root = yaml.compose(text, Loader=_Loader)
        data = builder.build(root) if root is not None else None
    except _Refused as exc:
        raise SpecError([SpecProblem("", exc.message, exc.line, file)]) from None
    except yaml.YAMLError as exc:
        raise SpecError([SpecProblem("", _yaml_message(exc), _yaml_line(exc), file)]) from None
    return ParsedYaml(data, root, _repeated_keys(root, builder.repeats))


def _check_depth(text: str) -> None:
    if text.startswith(" " * MAX_DEPTH) or ("\n" + " " * MAX_DEPTH) in text:
        raise _Refused(f"the YAML is indented more than {MAX_DEPTH} levels deep; flatten it")
    if text.count("[") + text.count("{") < MAX_DEPTH:
        return
    # depth with closers clipped at 0 = max over i of (prefix[i] - min(prefix[..i], 0))
    brackets = text.encode("utf-8", "surrogatepass").translate(None, _NOT_FLOW)
    prefix = list(accumulate(map(_FLOW_STEP.__getitem__, brackets)))
    lowest = accumulate(prefix, min, initial=0)
    if max(map(operator.sub, prefix, lowest), default=0) > MAX_DEPTH:
        raise _Refused(f"the YAML nests brackets more than {MAX_DEPTH} levels deep; flatten it")


def _yaml_line(exc: yaml.YAMLError) -> int | None:
    mark = getattr(exc, "problem_mark", None)
    return mark.line + 1 if mark is not None else None


def _yaml_message(exc: yaml.YAMLError) -> str:
    reason = str(getattr(exc, "problem", None) or exc).strip()
    context = getattr(exc, "context", None)
    detail = f"{reason} ({context})" if context else reason
    return " ".join(f"not valid YAML: {detail}; check indentation and quoting".split())


class _Builder:
    """Plain values from composed nodes, counting every value built against a budget."""

    def __init__(self, budget: int) -> None:
        self._budget = budget
        self.repeats: list[tuple[yaml.Node, yaml.Node, bool, Any]] = []
        """(first key node, last key node, same value, value used) per repeat."""

    def build(self, node: yaml.Node) -> Any:
        self._budget -= 1
        if self._budget < 0:
            raise _Refused("aliases expand the spec too much; repeat less through anchors", node)
        if isinstance(node, yaml.ScalarNode):
            return node.value if node.tag == _STR else _scalar(node)
        if isinstance(node, yaml.SequenceNode):
            return [self.build(item) for item in node.value]
        if not isinstance(node, yaml.MappingNode):
            raise TypeError(f"a YAML node of an unknown kind: {node!r}")
        return self._mapping(node)

    def _mapping(self, node: yaml.MappingNode) -> Any:
        if (
            any(k.tag == "tag:yaml.org,2002:merge" for k, _ in node.value)
            or node.tag != "tag:yaml.org,2002:map"
        ):
            return yaml.constructor.SafeConstructor().construct_document(node)
        result: dict[Any, Any] = {}
        for key_node, value_node in node.value:
            key = self.build(key_node)
            if not isinstance(key, (str, int, float, bool)) and key is not None:
                raise _Refused("a mapping key must be a plain value; quote it", key_node)
            value = self.build(value_node)
            if key in result:
                first = _first_key_node(node, key)
                self.repeats.append((first, key_node, _same(result[key], value), value))
            result[key] = value
        return result


def _first_key_node(node: yaml.MappingNode, key: Any) -> yaml.Node:
    """The first key node of ``node`` that means ``key`` (looked up only for a repeat)."""
    for key_node, _value in node.value:
        if isinstance(key_node, yaml.ScalarNode):
            plain = key_node.value if key_node.tag == _STR else _scalar(key_node)
            if plain == key:
                return key_node
    raise AssertionError("a repeated key has a first occurrence")


def _same(a: Any, b: Any) -> bool:
    """Equal values of the same types (``1`` and ``true`` differ, as they do in YAML)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(v, b[k]) for k, v in a.items())
    if isinstance(a, list):
        return len(a) == len(b) and all(map(_same, a, b))
    return bool(a == b)


def _repeated_keys(
    root: yaml.Node | None,
    repeats: list[tuple[yaml.Node, yaml.Node, bool, Any]],
) -> tuple[RepeatedKey, ...]:
    """The repeats with their field paths, once each (an aliased mapping is built again
    at every alias), in text order. Paths are looked up only when there are repeats."""
    if not repeats or root is None:
        return ()
    paths = _key_paths(root, {id(last) for _first, last, _same, _used in repeats})
    found: dict[tuple[int, int], tuple[int, RepeatedKey]] = {}
    for first, last, same, used in repeats:
        lines = (first.start_mark.line + 1, last.start_mark.line + 1)
        repeat = RepeatedKey(paths.get(id(last), ()), last.value, *lines, same, used)
        found.setdefault((id(first), id(last)), (last.start_mark.index, repeat))
    return tuple(repeat for _index, repeat in sorted(found.values(), key=lambda f: f[0]))


def _key_paths(root: yaml.Node, wanted: set[int]) -> dict[int, Loc]:
    """Field path of each key node whose ``id`` is in ``wanted`` (the first in text order,
    for a node reached again through an alias)."""
    paths: dict[int, Loc] = {}
    seen: set[int] = set()
    stack: list[tuple[yaml.Node, Loc]] = [(root, ())]
    while stack:
        node, loc = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(node, yaml.SequenceNode):
            stack.extend(
                (item, (*loc, index)) for index, item in reversed(list(enumerate(node.value)))
            )
        elif isinstance(node, yaml.MappingNode):
            for key, value in reversed(node.value):
                segment = (*loc, _segment(key))
                if id(key) in wanted:
                    paths[id(key)] = segment
                stack.append((value, segment))
    return paths


def _segment(key: yaml.Node) -> str | int:
    if isinstance(key, yaml.ScalarNode):
        return str(key.value)
    return "?"


def _scalar(node: yaml.ScalarNode) -> Any:
    construct = _SAFE.yaml_constructors.get(node.tag)
    if construct is None:
        return yaml.constructor.SafeConstructor().construct_document(node)
    return construct(_SAFE, node)


class LineIndex:
    """Finds the line of a field path in the composed nodes of the rendered text."""

    def __init__(self, root: yaml.Node | None) -> None:
        self._root = root

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
            line, node = found
            if index == len(loc) - 1 and offset is not None:
                return _offset_line(node, offset) or line
        return line


def _child(node: yaml.Node | None, segment: str | int) -> tuple[int, yaml.Node] | None:
    if isinstance(node, yaml.MappingNode):
        found = None  # the last occurrence: a repeated key's last value is the one used
        for key, value in node.value:
            if isinstance(key, yaml.ScalarNode) and key.value == str(segment):
                found = key.start_mark.line + 1, value
        return found
    if isinstance(node, yaml.SequenceNode) and isinstance(segment, int):
        if 0 <= segment < len(node.value):
            item = node.value[segment]
            return item.start_mark.line + 1, item
    return None


def _offset_line(node: yaml.Node, offset: int) -> int | None:
    if not isinstance(node, yaml.ScalarNode) or node.style != "|":
        return None
    return int(node.start_mark.line) + 2 + str(node.value).count("\n", 0, offset)
