"""From spec text to a validated ``SpecDocument``: render, parse, check, report.

    text ──render──> YAML text ──parse──> dict ──models──> SpecDocument
         (sandbox,                  (libyaml)      (field rules)    │
          limits)                                                   ├─ cross checks (checks.py)
                                                                    ├─ localpath files
                                                                    └─ pool fit, mounts (poolfit.py)

Template problems stop at the first (nothing else can be known). After that, every problem
is collected and raised together in one ``SpecError``, each with its field path, the line in
the rendered text and the file. When some fields are not well formed, the cross checks still
run on a lenient view of the rest (``partial.py``: the broken parts repaired with neutral
stand-ins whose own problems are dropped), so that one bad field hides no other problem.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from pydantic_core import ErrorDetails

from trainyard.errors import NotFoundError, SpecError, SpecProblem
from trainyard.pools import Pool, default_local_pool
from trainyard.spec import poolfit
from trainyard.spec.checks import NO_GAPS, Gaps, check_workflow
from trainyard.spec.fields import check_env_name
from trainyard.spec.localfiles import LocalFiles, read_local_files
from trainyard.spec.models import SpecDocument, WorkflowSpec
from trainyard.spec.partial import lenient_view
from trainyard.spec.problems import Issue, Layout, format_path, issues_from_validation, to_problems
from trainyard.spec.size import check_spec_size, text_bytes
from trainyard.spec.template import DEFAULT_LIMITS, RenderLimits, render
from trainyard.spec.yamlsource import LineIndex, RepeatedKey, gc_paused, parse_yaml

__all__ = [
    "PoolChoice",
    "load",
    "render_source",
    "parse",
    "reparse",
    "validate",
    "check_pool",
    "json_schema",
]

PoolChoice = Pool | Callable[[str | None], Pool] | None
"""A pool, or a function from the spec's ``workflow.pool`` to a pool; ``None`` is the
default rehearsal pool ``local`` (``trainyard.pools.default_local_pool()``)."""


def load(
    source: str | os.PathLike[str],
    *,
    set_values: Mapping[str, Any] | None = None,
    set_strings: Mapping[str, str] | None = None,
    set_env: Mapping[str, str] | None = None,
    labels: Mapping[str, str] | None = None,
    pool: PoolChoice = None,
    spec_path: str | os.PathLike[str] | None = None,
    files: Mapping[str, str] | None = None,
    limits: RenderLimits = DEFAULT_LIMITS,
    user: str | None = None,
) -> SpecDocument:
    """Render, parse and validate a spec.

    Args:
        source: a ``Path`` (or other path-like) to read, or the spec text itself (a ``str``
            is always text, never a file name).
        set_values: ``--set`` values, typed (see ``parse_set_values``).
        set_strings: ``--set-string`` values; win over ``set_values``.
        set_env: environment added to every task (wins over the spec's).
        labels: workflow labels that override the spec's.
        pool: the pool to check resources and mounts against (see ``PoolChoice``).
        spec_path: where the spec lives, for ``localpath`` and messages, when ``source``
            is text.
        files: ``localpath`` (relative) to contents; when given, the disk is not read.
        limits: bounds of the template rendering.
        user: who submits: ``file://`` URLs are checked against this user's data roots
            (``trainyard.dataroots``); None: the home owner's (all of ``storage``).

    Returns:
        The validated document; ``localpath`` files are read into ``contents``.

    Raises:
        SpecError: every problem found (see module doc); a spec file that cannot be read.
        NotFoundError: ``pool`` is a lookup function and the pool does not exist.
    """
    path = _path_of(source, spec_path)
    rendered = render_source(
        source, set_values=set_values, set_strings=set_strings, spec_path=spec_path, limits=limits
    )
    return parse(
        rendered, spec_path=path, files=files, set_env=set_env, labels=labels, pool=pool, user=user
    )


def render_source(
    source: str | os.PathLike[str],
    *,
    set_values: Mapping[str, Any] | None = None,
    set_strings: Mapping[str, str] | None = None,
    spec_path: str | os.PathLike[str] | None = None,
    limits: RenderLimits = DEFAULT_LIMITS,
) -> str:
    """Read (for a path) and render a spec; the rendered YAML text, tokens kept.

    Args: as ``load``.

    Raises:
        SpecError: the file cannot be read, or the template fails (see ``render``).
    """
    path = _path_of(source, spec_path)
    text = source if isinstance(source, str) else _read_file(path)
    return render(
        text, values=set_values, set_strings=set_strings, limits=limits, file=_display(path)
    )


def validate(source: str | os.PathLike[str], **options: Any) -> list[SpecProblem]:
    """Every problem of a spec, or ``[]`` when it is valid. Takes ``load``'s arguments.

    Raises:
        NotFoundError: as ``load``. Spec problems are returned, not raised.
    """
    try:
        load(source, **options)
    except SpecError as exc:
        return exc.problems
    return []


def parse(
    rendered: str,
    *,
    spec_path: str | os.PathLike[str] | None = None,
    files: Mapping[str, str] | None = None,
    set_env: Mapping[str, str] | None = None,
    labels: Mapping[str, str] | None = None,
    pool: PoolChoice = None,
    user: str | None = None,
) -> SpecDocument:
    """Parse and validate rendered spec text (no template syntax left, tokens kept).

    Args: as ``load``.

    Returns:
        The validated document; ``doc.warnings`` lists what is accepted but suspect: a key
        given twice in one mapping (the last value is used, as OSMO's PyYAML loader does).

    Raises:
        SpecError: every problem found (its ``warnings`` as above); a text over
            ``MAX_SPEC_BYTES`` (one problem, nothing else checked).
    """
    return _parse(
        rendered,
        spec_path=spec_path,
        files=files,
        set_env=set_env,
        labels=labels,
        pool=pool,
        pool_checks=True,
        user=user,
    )


def reparse(
    rendered: str,
    *,
    spec_path: str | os.PathLike[str] | None = None,
    files: Mapping[str, str] | None = None,
    set_env: Mapping[str, str] | None = None,
    labels: Mapping[str, str] | None = None,
) -> SpecDocument:
    """The document of a spec that was validated before (a stored workflow's rendered text,
    with the arguments it was parsed with): ``parse`` without the pool checks, since the
    pool's nodes may have changed since the workflow was accepted.

    Raises:
        SpecError: the text no longer validates (every problem).
    """
    return _parse(
        rendered,
        spec_path=spec_path,
        files=files,
        set_env=set_env,
        labels=labels,
        pool=None,
        pool_checks=False,
    )


def _parse(
    rendered: str,
    *,
    spec_path: str | os.PathLike[str] | None,
    files: Mapping[str, str] | None,
    set_env: Mapping[str, str] | None,
    labels: Mapping[str, str] | None,
    pool: PoolChoice,
    pool_checks: bool,
    user: str | None = None,
) -> SpecDocument:
    path = Path(spec_path) if spec_path is not None else None
    file = _display(path)
    check_spec_size(text_bytes(rendered), what="the rendered spec", file=file)
    with gc_paused():
        parsed = parse_yaml(rendered, file=file)
        data = _with_labels(parsed.data, labels)
        layout = _layout_of(data)
        local = LocalFiles(path.parent if path else None, files)
        doc, issues, errors = _validate_model(data, layout)
        if doc is not None:
            chosen = _resolve_pool(pool, doc) if pool_checks else None
            issues += _check_document(doc, layout, set_env, local, chosen, user=user)
        elif errors:
            issues += _check_lenient(data, errors, layout, set_env, local, pool, user)
    warnings = [repeated_key_warning(r, file) for r in parsed.repeated]
    if any(i.warning for i in issues):
        warnings += to_problems([i for i in issues if i.warning], LineIndex(parsed.root), file)
        issues = [i for i in issues if not i.warning]
    if issues:
        raise SpecError(to_problems(issues, LineIndex(parsed.root), file), warnings)
    assert doc is not None
    doc.warnings.extend(warnings)
    return doc


def repeated_key_warning(repeat: RepeatedKey, file: str | None) -> SpecProblem:
    """The warning for a key given twice in one mapping, at its last line (both lines
    named). OSMO loads specs with PyYAML, which keeps the last value silently."""
    lines = f"lines {repeat.first_line} and {repeat.last_line}"
    if repeat.same_value:
        message = (
            f"key {repeat.key!r} is given twice in one mapping ({lines}) with the same "
            "value; it is used once, as OSMO does; remove one"
        )
    else:
        message = (
            f"key {repeat.key!r} is given twice in one mapping ({lines}) with different "
            f"values; the value of line {repeat.last_line} ({_shown(repeat.used)}) is used, "
            "as OSMO keeps the last; remove the one you do not mean"
        )
    return SpecProblem(format_path(repeat.loc), message, repeat.last_line, file)


def _shown(value: Any) -> str:
    text = " ".join(repr(value).split())
    return text if len(text) <= 60 else text[:57] + "..."


def check_pool(workflow: WorkflowSpec, pool: Pool) -> list[SpecProblem]:
    """Resource-fit and mount problems of an already validated workflow on ``pool``.

    For re-checking a stored workflow against another pool; paths are in groups form and
    carry no line. ``[]`` when it fits.
    """
    return to_problems(poolfit.check_pool(workflow, pool), None, None)


def json_schema() -> dict[str, Any]:
    """A JSON Schema of the spec language with the YAML keys, for editors.

    Quantities, durations and exit codes accept their text forms; ``workflow`` takes
    ``tasks`` or ``groups``.
    """
    schema = SpecDocument.model_json_schema(by_alias=True, mode="validation")
    workflow = schema["$defs"]["WorkflowSpec"]
    workflow["properties"]["tasks"] = {
        "type": "array",
        "items": {"$ref": "#/$defs/TaskSpec"},
        "title": "Tasks",
        "description": "Tasks, each its own group; give tasks or groups, not both.",
    }
    workflow["required"] = [r for r in workflow.get("required", []) if r != "groups"]
    return {
        **schema,
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "trainyard / OSMO workflow spec (version 2)",
    }


def _path_of(
    source: str | os.PathLike[str], spec_path: str | os.PathLike[str] | None
) -> Path | None:
    if not isinstance(source, str):
        return Path(source)
    return Path(spec_path) if spec_path is not None else None


def _read_file(path: Path | None) -> str:
    """The spec file's text; one over ``MAX_SPEC_BYTES`` is refused before it is read."""
    assert path is not None
    try:
        check_spec_size(path.stat().st_size, file=str(path))
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) else "not UTF-8 text"
        message = f"cannot read the spec: {reason}; check the path"
        raise SpecError([SpecProblem("", message, None, str(path))]) from None


def _display(path: Path | None) -> str | None:
    return str(path) if path is not None else None


def _with_labels(data: Any, labels: Mapping[str, str] | None) -> Any:
    if not labels or not isinstance(data, dict) or not isinstance(data.get("workflow"), dict):
        return data
    workflow = data["workflow"]
    current = workflow.get("labels")
    merged = {**(current if isinstance(current, dict) else {}), **labels}
    return {**data, "workflow": {**workflow, "labels": merged}}


def _layout_of(data: Any) -> Layout:
    workflow = data.get("workflow") if isinstance(data, dict) else None
    return Layout(
        tasks_form=isinstance(workflow, dict) and "tasks" in workflow and "groups" not in workflow
    )


def _validate_model(
    data: Any,
    layout: Layout,
) -> tuple[SpecDocument | None, list[Issue], list[ErrorDetails]]:
    """The document, or its field problems and the pydantic errors they came from."""
    if not isinstance(data, dict):
        return None, [Issue((), "the spec is not a YAML mapping; it needs a workflow: section")], []
    try:
        return SpecDocument.model_validate(data, by_alias=True, by_name=False), [], []
    except ValidationError as exc:
        return None, issues_from_validation(exc, layout), exc.errors(include_url=False)


def _check_lenient(
    data: Any,
    errors: list[ErrorDetails],
    layout: Layout,
    set_env: Mapping[str, str] | None,
    local: LocalFiles,
    pool: PoolChoice,
    user: str | None = None,
) -> list[Issue]:
    """The cross-check problems of the well-formed parts of a spec with field problems
    (``partial.py``); none when the spec cannot be repaired. An unknown pool skips the pool
    checks: the field problems are reported, not ``NotFoundError``."""
    view = lenient_view(data, errors, layout)
    if view is None:
        return []
    try:
        resolved: Pool | None = _resolve_pool(pool, view.doc)
    except NotFoundError:
        resolved = None
    return view.keep(
        _check_document(view.doc, layout, set_env, local, resolved, view.gaps, user=user)
    )


def _check_document(
    doc: SpecDocument,
    layout: Layout,
    set_env: Mapping[str, str] | None,
    local: LocalFiles,
    pool: Pool | None,
    gaps: Gaps = NO_GAPS,
    *,
    user: str | None = None,
) -> list[Issue]:
    """Every cross-part problem of ``doc`` (``pool`` None: no pool checks; ``user``: whose
    data roots ``file://`` URLs are checked against)."""
    issues = _apply_env(doc, set_env)
    issues += check_workflow(doc.workflow, layout, gaps)
    issues += read_local_files(doc.workflow, layout, local)
    if pool is not None:
        issues += poolfit.check_pool(doc.workflow, pool, layout, user)
    return issues


def _apply_env(doc: SpecDocument, set_env: Mapping[str, str] | None) -> list[Issue]:
    issues = []
    for name in set_env or {}:
        try:
            check_env_name(name)
        except ValueError as exc:
            issues.append(Issue(("--set-env",), str(exc)))
    if not issues:
        for task in doc.workflow.all_tasks():
            task.environment = {**task.environment, **(set_env or {})}
    return issues


def _resolve_pool(pool: PoolChoice, doc: SpecDocument) -> Pool:
    if pool is None:
        return default_local_pool()
    if isinstance(pool, Pool):
        return pool
    return pool(doc.workflow.pool)
