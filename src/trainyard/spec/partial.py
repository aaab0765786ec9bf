"""A lenient view of a spec whose fields are not all well formed, for the cross checks.

So that ``validate`` prints every error (a bad ``exec_timeout`` must not hide an unknown
``{{host:nobody}}``), this module repairs a copy of the parsed YAML until the models accept it,
with neutral values or stand-ins where the errors were, and says what it could not keep
(:class:`LenientView`). The checks then run on the repaired document; their problems at or
under a stand-in are dropped and :class:`~trainyard.spec.checks.Gaps` turns off those that
depend on what was removed. A spec whose ``workflow`` section is missing or not a mapping,
that gives both ``tasks`` and ``groups``, or whose ``tasks``/``groups`` is not a non-empty
list gets no view. The repair rules: docs/reference.md, "Validation: the lenient view".
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError
from pydantic_core import ErrorDetails

from trainyard.spec.checks import Gaps
from trainyard.spec.models import SpecDocument, tasks_to_groups
from trainyard.spec.problems import Issue, Layout, model_at
from trainyard.spec.yamlsource import Loc

__all__ = ["LenientView", "lenient_view", "MAX_ROUNDS"]

MAX_ROUNDS = 4
"""Repair-and-validate rounds before giving up (each round reaches one level deeper into
model rules: a repaired task can reveal its group's lead rule, then nothing more)."""


@dataclass(frozen=True)
class LenientView:
    """A repaired document and what the repairs stand for.

    Attributes:
        doc: the repaired document (never stored or run: for the cross checks only).
        gaps: what the checks must not rely on (paths in the spec's own form).
        stand_ins: paths (the spec's own form) of the values put in place of broken ones.
    """

    doc: SpecDocument
    gaps: Gaps
    stand_ins: frozenset[Loc]

    def keep(self, issues: Iterable[Issue]) -> list[Issue]:
        """``issues`` without those at or under a stand-in (they describe the repair)."""
        return [i for i in issues if not any(i.loc[: len(s)] == s for s in self.stand_ins)]


def lenient_view(data: Any, errors: list[ErrorDetails], layout: Layout) -> LenientView | None:
    """Repair ``data`` (the parsed spec, left unchanged) until ``SpecDocument`` accepts it.

    Args:
        data: the parsed YAML whose validation failed.
        errors: that validation's errors (``ValidationError.errors()``).
        layout: how the spec was written (for the paths in the view).

    Returns:
        The view, or ``None`` when the errors cannot be repaired within ``MAX_ROUNDS``
        (see the module doc).
    """
    root = _groups_form(data)
    if root is None:
        return None
    repair = _Repair(root)
    for _ in range(MAX_ROUNDS):
        if not all(repair.fix(loc) for loc in _locs(errors)):
            return None
        try:
            doc = SpecDocument.model_validate(repair.root, by_alias=True, by_name=False)
        except ValidationError as exc:
            errors = exc.errors(include_url=False)
            continue
        return repair.view(doc, layout)
    return None


def _groups_form(data: Any) -> dict[str, Any] | None:
    """A shallow copy of ``data`` with ``workflow.tasks`` made groups (as the model does)."""
    if not isinstance(data, dict) or not isinstance(data.get("workflow"), dict):
        return None
    try:
        return {**data, "workflow": dict(tasks_to_groups(data["workflow"]))}
    except ValueError:
        return None


def _locs(errors: list[ErrorDetails]) -> Iterable[Loc]:
    for error in errors:
        yield tuple(s for s in error["loc"] if s != "[key]")


@dataclass
class _Repair:
    """The document being repaired (copied on write: the parsed spec is never changed)."""

    root: dict[str, Any]
    stand_ins: set[Loc] = field(default_factory=set)
    inputs_of: set[Loc] = field(default_factory=set)  # task paths, groups form
    no_resources: bool = False
    unnamed_in: set[int] = field(default_factory=set)  # group indices
    names: list[tuple[Loc, str]] = field(default_factory=list)  # name path -> text after
    _owned: set[int] = field(default_factory=set)

    def fix(self, loc: Loc) -> bool:
        """Repair the error at ``loc``, or at the nearest part holding it that can be.
        False when nothing up to the document itself can be repaired."""
        loc = self._reachable(loc)
        while loc:
            if self._fix_at(loc[:-1], loc[-1]):
                return True
            loc = loc[:-1]
        return False

    def view(self, doc: SpecDocument, layout: Layout) -> LenientView:
        """The view of the validated ``doc``, names put back."""
        for loc, text in self.names:
            _set_at(doc, loc, text)
        inputs_of = frozenset(layout.source_loc(t) for t in self.inputs_of)
        gaps = Gaps(inputs_of, self.no_resources, frozenset(self.unnamed_in))
        stand_ins = frozenset(layout.source_loc(s) for s in self.stand_ins)
        return LenientView(doc, gaps, stand_ins)

    # ------------------------------------------------------------------ walking

    def _reachable(self, loc: Loc) -> Loc:
        """``loc`` cut after its last step that exists (or, for a missing key, the key)."""
        node: Any = self.root
        for i, step in enumerate(loc):
            if isinstance(node, dict) and step in node:
                node = node[step]
            elif isinstance(node, list) and isinstance(step, int) and 0 <= step < len(node):
                node = node[step]
            else:
                return loc[: i + 1] if isinstance(node, dict | list) else loc[:i]
        return loc

    def _container(self, loc: Loc) -> Any:
        """The list or mapping at ``loc``, copied (with every container above it) if it is
        still the parsed spec's own."""
        node: Any = self.root
        for step in loc:
            child = node[step]
            if isinstance(child, dict | list) and id(child) not in self._owned:
                child = child.copy()
                node[step] = child
                self._owned.add(id(child))
            node = child
        return node

    # ------------------------------------------------------------------ repairs

    def _fix_at(self, parent_loc: Loc, key: str | int) -> bool:
        parent = self._container(parent_loc)
        if isinstance(parent, dict):
            return self._fix_key(parent, parent_loc, key)
        if isinstance(parent, list) and isinstance(key, int):
            return self._fix_item(parent, parent_loc, key)
        return False

    def _fix_key(self, parent: dict[Any, Any], parent_loc: Loc, key: str | int) -> bool:
        model = model_at(parent_loc)
        spec = model.model_fields.get(_attribute(model, key)) if model is not None else None
        if model is None and parent_loc == ("workflow", "resources"):
            parent[key] = {}  # an empty request: references to it still resolve
            self.stand_ins.add((*parent_loc, key))
            return True
        if spec is None or not spec.is_required():
            parent.pop(key, None)
            self._note_removed(parent_loc, key)
            return True
        return self._stand_in_field(parent, (*parent_loc, key))

    def _note_removed(self, parent_loc: Loc, key: str | int) -> None:
        if key == "inputs":
            self.inputs_of.add(parent_loc)
        elif key == "resources" and parent_loc == ("workflow",):
            self.no_resources = True

    def _stand_in_field(self, parent: dict[Any, Any], loc: Loc) -> bool:
        key = loc[-1]
        if key == "name":
            parent["name"] = self._name(loc, parent.get("name"))
            return True
        if key == "command":
            parent["command"] = ["true"]
            self.stand_ins.add(loc)
            return True
        return False

    def _fix_item(self, parent: list[Any], parent_loc: Loc, index: int) -> bool:
        make = _ITEMS.get(parent_loc[-1]) if parent_loc else None
        if make is None:
            return False
        loc = (*parent_loc, index)
        parent[index] = make(self, parent[index], loc)
        if parent_loc[-1] == "inputs":
            self.inputs_of.add(parent_loc[:-1])
        return True

    def _name(self, loc: Loc, raw: Any) -> str:
        """A valid stand-in name for validation. The name written (``raw``, when text) is
        put back afterwards, so that references to it resolve; other values become
        ``<invalid name N>``, a stand-in whose problems are dropped."""
        number = len(self.names) + 1
        if not isinstance(raw, str):
            raw = f"<invalid name {number}>"
            self.stand_ins.add(loc)
            if loc[:2] == ("workflow", "groups") and isinstance(loc[2], int):
                self.unnamed_in.add(loc[2])
        self.names.append((loc, raw))
        return f"stand-in-{number}"

    # ------------------------------------------------------------------ stand-ins

    def _group(self, raw: Any, loc: Loc) -> dict[str, Any]:
        tasks = raw.get("tasks") if isinstance(raw, dict) else None
        if isinstance(tasks, list) and tasks:  # its fields are fine: its lead is not
            return {
                **raw,
                "tasks": [
                    {**t, "lead": i == 0} if isinstance(t, dict) else t for i, t in enumerate(tasks)
                ],
            }
        self.stand_ins.add(loc)
        return {
            "name": self._name((*loc, "name"), None),
            "tasks": [self._task(None, (*loc, "tasks", 0))],
        }

    def _task(self, raw: Any, loc: Loc) -> dict[str, Any]:
        self.stand_ins.add(loc)
        return {"name": self._name((*loc, "name"), None), "command": ["true"]}

    def _input(self, raw: Any, loc: Loc) -> dict[str, Any]:
        task = raw.get("task") if isinstance(raw, dict) else None
        if isinstance(task, str):
            return {"task": task}
        self.stand_ins.add(loc)
        return {"url": "file:///"}


def _stand_in(value: Callable[[], Any]) -> Callable[[_Repair, Any, Loc], Any]:
    """A maker of stand-ins that are ``value()`` whatever was written."""

    def make(repair: _Repair, raw: Any, loc: Loc) -> Any:
        repair.stand_ins.add(loc)
        return value()

    return make


_ITEMS: dict[str | int, Callable[[_Repair, Any, Loc], Any]] = {
    "groups": _Repair._group,
    "tasks": _Repair._task,
    "inputs": _Repair._input,
    "outputs": _stand_in(lambda: {"url": "file:///"}),
    "files": _stand_in(lambda: {"path": "/stand-in", "contents": ""}),
    "checkpoint": _stand_in(lambda: {"path": "/", "url": "file:///", "frequency": 1}),
    "volumeMounts": _stand_in(lambda: "/"),
    "command": _stand_in(lambda: "-"),
    "args": _stand_in(lambda: "-"),
}
"""List name -> how to make a stand-in for one of its items (``nodesExcluded`` and
``topology`` have none: the whole field goes, which asks for less)."""


def _attribute(model: Any, key: str | int) -> str:
    """The attribute name of the field whose YAML key is ``key`` (``""`` if none)."""
    for name, spec in model.model_fields.items():
        if key in (name, spec.alias):
            return str(name)
    return ""


def _set_at(doc: Any, loc: Loc, value: str) -> None:
    """Set the attribute at ``loc`` (groups form) of the validated ``doc``; nothing if a
    later repair took that place away."""
    node = doc
    try:
        for step in loc[:-1]:
            node = node[step] if isinstance(step, int) else getattr(node, step)
    except (IndexError, AttributeError):
        return
    setattr(node, str(loc[-1]), value)
