"""Collecting spec problems: field paths, pydantic errors in plain words, lines.

Checks report :class:`Issue` (a path as segments, a message); :func:`to_problems` turns
them into ``SpecProblem`` with the dotted path, the line in the rendered text and the file,
deduplicated and in spec order.

Paths are in the spec's own terms: a spec written with top-level ``tasks`` reports
``workflow.tasks[2].command`` although the model holds that task in ``groups[2]``.
"""

from __future__ import annotations

import re
import types
import typing
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails

from trainyard.errors import SpecProblem
from trainyard.spec.models import SpecDocument
from trainyard.spec.yamlsource import LineIndex, Loc

__all__ = [
    "Issue",
    "Layout",
    "one_line",
    "format_path",
    "issues_from_validation",
    "to_problems",
    "model_at",
]

_PLAIN_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]*$")


@dataclass(frozen=True)
class Issue:
    """One problem before it gets its line.

    Attributes:
        loc: field path segments (``("workflow", "tasks", 0, "command")``).
        message: what is wrong; what to do.
        offset: character offset inside the scalar at ``loc`` (finer line), if known.
        warning: accepted (OSMO accepts it), reported as a warning; ``validate --strict``
            refuses it.
    """

    loc: Loc
    message: str
    offset: int | None = None
    warning: bool = False


@dataclass(frozen=True)
class Layout:
    """How the spec was written: ``tasks_form`` when it has top-level ``tasks``."""

    tasks_form: bool = False

    def group_loc(self, group_index: int) -> Loc:
        """Path of a group (a task in tasks form)."""
        return ("workflow", "tasks" if self.tasks_form else "groups", group_index)

    def task_loc(self, group_index: int, task_index: int) -> Loc:
        """Path of a task of a group."""
        if self.tasks_form:
            return ("workflow", "tasks", group_index)
        return ("workflow", "groups", group_index, "tasks", task_index)

    def source_loc(self, loc: Loc) -> Loc:
        """Translate a model path (groups) to the spec's own path (tasks form)."""
        if not self.tasks_form or loc[:2] != ("workflow", "groups"):
            return loc
        if len(loc) == 2:
            return ("workflow", "tasks")
        rest = loc[3:]
        if rest[:2] == ("tasks", 0):
            rest = rest[2:]
        elif rest[:1] == ("tasks",):
            rest = rest[1:]
        return ("workflow", "tasks", loc[2], *rest)


def one_line(text: str) -> str:
    """``text`` with every run of white space (new lines included) made one space."""
    return " ".join(text.split())


def format_path(loc: Iterable[str | int]) -> str:
    """``("workflow", "groups", 0, "name")`` -> ``workflow.groups[0].name``."""
    text = ""
    for segment in loc:
        if isinstance(segment, int):
            text += f"[{segment}]"
        elif _PLAIN_KEY.match(segment):
            text += f".{segment}" if text else segment
        else:
            text += f"[{segment!r}]"
    return text


def issues_from_validation(exc: ValidationError, layout: Layout) -> list[Issue]:
    """Plain-word issues for each error of a ``SpecDocument`` validation."""
    issues = []
    for error in exc.errors(include_url=False):
        loc = tuple(s for s in error["loc"] if s != "[key]")
        issues.append(Issue(layout.source_loc(loc), _message(error, loc)))
    return issues


def _message(error: ErrorDetails, loc: Loc) -> str:
    kind, given = error["type"], error.get("input")
    if kind == "value_error":
        return str(error.get("ctx", {}).get("error", error["msg"]))
    if kind == "missing":
        return f"required field {loc[-1]!r} is missing; add it"
    if kind == "extra_forbidden":
        valid = ", ".join(_fields_at(loc[:-1]))
        return f"unknown field {loc[-1]!r}; valid fields here: {valid}"
    if kind == "enum":
        return f"got {given!r}; expected one of {error.get('ctx', {}).get('expected', '')}"
    if kind in _TYPE_ERRORS:
        expected, fix = _TYPE_ERRORS[kind]
        return f"expected {expected}, got {_describe(given)}; {fix}"
    return f"{error['msg']}, got {_describe(given)}; fix the value"


# pydantic error type -> (what was expected, what to do)
_TYPE_ERRORS = {
    "string_type": ("a string", "quote the value"),
    "list_type": ("a list", "write it as a YAML list ([a, b] or one '- item' per line)"),
    "dict_type": ("a mapping", "write it as key: value lines"),
    "model_type": ("a mapping", "write it as key: value lines"),
    "model_attributes_type": ("a mapping", "write it as key: value lines"),
    "bool_type": ("true or false", "write true or false"),
    "bool_parsing": ("true or false", "write true or false"),
    "int_type": ("a whole number", "write a whole number"),
    "int_parsing": ("a whole number", "write a whole number"),
    "int_from_float": ("a whole number", "write a whole number"),
    "float_type": ("a number", "write a number"),
    "float_parsing": ("a number", "write a number"),
}


def _describe(value: Any) -> str:
    if isinstance(value, (dict, list)):
        return f"a {'mapping' if isinstance(value, dict) else 'list'}"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _fields_at(loc: Loc) -> list[str]:
    """The YAML keys allowed where ``loc`` points (for 'unknown field' messages)."""
    model = _model_at(SpecDocument, loc)
    if model is None:
        return []
    keys = [f.alias or name for name, f in model.model_fields.items()]
    return keys + (["tasks"] if model.__name__ == "WorkflowSpec" else [])


def model_at(loc: Loc) -> type[BaseModel] | None:
    """The model class of the object at ``loc`` (groups form) in a ``SpecDocument``, or
    ``None`` where ``loc`` is a plain list, mapping or value (``environment``, ``resources``)."""
    return _model_at(SpecDocument, loc)


def _model_at(model: type[BaseModel], loc: Loc) -> type[BaseModel] | None:
    current: Any = model
    for segment in loc:
        current = _step(current, segment)
        if current is None:
            return None
    return _as_model(current)


def _step(current: Any, segment: str | int) -> Any:
    model = _as_model(current)
    if model is not None and isinstance(segment, str):
        if model.__name__ == "WorkflowSpec" and segment == "tasks":
            segment = "groups"
        for name, field in model.model_fields.items():
            if segment in (name, field.alias):
                return field.annotation
        return None
    args = [a for a in typing.get_args(_strip(current)) if a is not type(None)]
    return args[-1] if args else None


def _strip(annotation: Any) -> Any:
    """Remove ``Annotated[...]`` and ``| None`` around a type."""
    while True:
        origin = typing.get_origin(annotation)
        if origin is typing.Annotated:
            annotation = typing.get_args(annotation)[0]
            continue
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        if origin in (typing.Union, types.UnionType) and len(args) == 1:
            annotation = args[0]
            continue
        return annotation


def _as_model(annotation: Any) -> type[BaseModel] | None:
    annotation = _strip(annotation)
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    return None


def to_problems(
    issues: Iterable[Issue], lines: LineIndex | None, file: str | None
) -> list[SpecProblem]:
    """``SpecProblem`` for each distinct issue, with its line, ordered by line."""
    seen: set[tuple[Loc, str]] = set()
    problems: list[SpecProblem] = []
    for issue in issues:
        if (issue.loc, issue.message) in seen:
            continue
        seen.add((issue.loc, issue.message))
        line = lines.line_of(issue.loc, issue.offset) if lines else None
        problems.append(SpecProblem(format_path(issue.loc), one_line(issue.message), line, file))
    return sorted(problems, key=lambda p: (p.line is None, p.line or 0))
