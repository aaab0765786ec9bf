"""Building the server request for a spec file: the text, its ``localpath`` files inlined.

The CLI renders the spec locally only to find which ``localpath`` files it names; it reads
them under the spec's folder with the spec layer's rules (no escape by ``..`` or symlink), and
the server renders and validates the spec again, as OSMO does. A spec whose text lacks the
word ``localpath`` is sent without that render; a template that builds the word is refused by
the server (``spec.localfiles``: a file not sent), with nothing stored. The body is a plain
dataclass (``SpecBody``); the server's ``server.schema.SpecRequest`` stays the contract and
``tests/unit/cli/test_cli_request_body.py`` checks that it reads every body built here.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from trainyard import spec as specapi
from trainyard.errors import SpecError, SpecProblem
from trainyard.spec.localfiles import LocalFiles

__all__ = ["SpecBody", "spec_request", "localpaths", "may_name_localpath", "files_under"]

LOCALPATH_WORD = "localpath"
"""The key of a file injected from the spec's folder; a spec text without it is not rendered
by the CLI (``may_name_localpath``)."""


@dataclass(frozen=True)
class SpecBody:
    """A spec as the CLI sends it (the JSON of the server's ``SpecRequest``): the text, its
    ``localpath`` files inlined (path as written: text), and the command line's values."""

    spec_text: str
    spec_name: str = "spec.yaml"
    files: dict[str, str] = field(default_factory=dict)
    set: list[str] = field(default_factory=list)
    set_string: list[str] = field(default_factory=list)
    set_env: list[str] = field(default_factory=list)
    pool: str | None = None
    labels: dict[str, str] = field(default_factory=dict)
    default_pool: str | None = None
    priority: str | None = None
    app: str | None = None
    """Set by the server for ``app submit``; a CLI body leaves it None."""

    def to_json(self) -> dict[str, Any]:
        """The request body: every field, by its name (``None`` for no pool)."""
        return asdict(self)


def _tasks(workflow: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield from workflow.get("tasks") or []
    for group in workflow.get("groups") or []:
        yield from (group or {}).get("tasks") or []


def localpaths(rendered: str) -> list[str]:
    """Every ``files[].localpath`` of a rendered spec, in order, without repeats."""
    import yaml  # only for a spec that may name localpath files

    loader: type = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml, as the server's
    try:
        data = yaml.load(rendered, Loader=loader) or {}
    except yaml.YAMLError:
        return []  # the server reports the syntax error with its line
    workflow = data.get("workflow") if isinstance(data, dict) else None
    found: list[str] = []
    for task in _tasks(workflow if isinstance(workflow, dict) else {}):
        for item in (task or {}).get("files") or []:
            path = item.get("localpath") if isinstance(item, dict) else None
            if isinstance(path, str) and path not in found:
                found.append(path)
    return found


def may_name_localpath(text: str) -> bool:
    """Whether a spec's text (as written, before rendering) may name ``localpath`` files.

    False only when the word ``localpath`` does not occur in it at all: then the CLI sends
    it without rendering it. A template that builds the word is not found here; the server
    refuses it (its render names a file the request did not send). YAML escapes in a quoted
    key (``"local\\x70ath"``) are the same case.
    """
    return LOCALPATH_WORD in text


def _files_of(
    path: Path, text: str, *, set_values: list[str], set_strings: list[str]
) -> dict[str, str]:
    """The ``localpath`` files the rendered spec names, read under its folder.

    Raises:
        SpecError: the template fails, or a ``localpath`` breaks a rule (one problem each).
    """
    if not may_name_localpath(text):
        return {}
    rendered = specapi.render(
        text,
        values=specapi.parse_set_values(set_values),
        set_strings=specapi.parse_set_strings(set_strings),
        file=str(path),
    )
    local = LocalFiles(path.resolve().parent)
    files, problems = {}, []
    for rel in localpaths(rendered):
        try:
            files[rel] = local.read(rel)
        except ValueError as exc:
            problems.append(SpecProblem("files.localpath", str(exc), file=str(path)))
    if problems:
        raise SpecError(problems)
    return files


def files_under(
    folder: Path, text: str, *, set_values: list[str], set_strings: list[str]
) -> dict[str, str]:
    """The ``localpath`` files that spec ``text`` names, read under ``folder`` (OSMO's
    ``app submit --local-path``: where an app's local files are fetched from).

    Raises:
        SpecError: as ``spec_request``'s files.
    """
    return _files_of(folder / "spec.yaml", text, set_values=set_values, set_strings=set_strings)


def spec_request(
    path: Path,
    *,
    set_values: list[str],
    set_strings: list[str],
    set_env: list[str],
    pool: str | None = None,
    labels: dict[str, str] | None = None,
) -> SpecBody:
    """The request for the spec at ``path`` with its ``localpath`` files.

    A spec whose text does not contain ``localpath`` is not rendered here
    (``may_name_localpath``): its template errors and its rendered size are the server's
    to refuse, in the submit's answer, before anything is stored.

    Raises:
        SpecError: the spec cannot be read, or (one that names ``localpath``) cannot be
            rendered or a ``localpath`` breaks a rule, or the spec (as written, rendered, or
            with its files) is over ``MAX_SPEC_BYTES``: refused here, before anything is sent.
    """
    try:
        specapi.check_spec_size(path.stat().st_size, file=str(path))
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) else "not UTF-8 text"
        message = f"cannot read the spec: {reason}; check the path"
        raise SpecError([SpecProblem("", message, file=str(path))]) from exc
    files = _files_of(path, text, set_values=set_values, set_strings=set_strings)
    specapi.check_source_size(text, files, file=str(path))
    return SpecBody(
        spec_text=text,
        spec_name=str(path),
        files=files,
        set=set_values,
        set_string=set_strings,
        set_env=set_env,
        pool=pool,
        labels=labels or {},
    )
