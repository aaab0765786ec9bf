"""Special tokens: ``{{output}}``, ``{{input:N}}``, ``{{input:TASK}}``, ``{{workflow_id}}``,
``{{host:TASK}}``.

Tokens look like Jinja expressions but are not template variables: rendering passes them
through untouched (a value set for one is ignored) and they are resolved only when a task
runs, by the task runner calling :func:`substitute_tokens`. Inner spaces are allowed
(``{{ host:master }}``).

Source: OSMO docs, "Templates and special tokens".
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from trainyard.spec.fields import name_key

__all__ = [
    "Token",
    "TOKEN_PATTERN",
    "REFERENCE_TOKEN_PATTERN",
    "find_tokens",
    "substitute_tokens",
    "token_values",
]

TOKEN_PATTERN = re.compile(r"\{\{\s*(output|workflow_id|input:[^\s{}:]+|host:[^\s{}:]+)\s*\}\}")
"""Matches one special token; group 1 is its body (``output``, ``input:0``, ``host:master``)."""

REFERENCE_TOKEN_PATTERN = re.compile(r"\{\{\s*((?:input|host):[^\s{}:]+)\s*\}\}")
"""Matches the tokens that refer to other parts of the spec (``input:``, ``host:``)."""


@dataclass(frozen=True)
class Token:
    """One special token found in a text.

    Attributes:
        body: the token without braces and spaces, e.g. ``host:master``.
        kind: ``output``, ``workflow_id``, ``input`` or ``host``.
        arg: what follows the colon (``"0"``, ``"master"``), ``""`` for output/workflow_id.
        start: offset of the opening ``{{`` in the text.
        text: the token as written, e.g. ``{{ host:master }}``.
    """

    body: str
    kind: str
    arg: str
    start: int
    text: str


def find_tokens(text: str) -> Iterator[Token]:
    """Every special token in ``text``, in order of appearance."""
    for match in TOKEN_PATTERN.finditer(text):
        body = match.group(1)
        kind, _, arg = body.partition(":")
        yield Token(body=body, kind=kind, arg=arg, start=match.start(), text=match.group(0))


def _lookup_key(body: str) -> str:
    kind, sep, arg = body.partition(":")
    return f"{kind}:{name_key(arg)}" if sep and not arg.isdigit() else body


def substitute_tokens(text: str, values: Mapping[str, str]) -> str:
    """Replace the special tokens of ``text`` whose value is known.

    Args:
        text: a command, argument, environment value or file contents.
        values: token body to value, e.g. ``{"output": "/run/out", "input:0": "/run/in/0",
            "host:master": "10.0.0.5", "workflow_id": "wf-12"}``. Task names in ``host:`` and
            ``input:`` keys match as names do (case-insensitive, ``-`` equals ``_``).

    Returns:
        ``text`` with every known token replaced; a token with no value (for instance
        ``{{workflow_id}}`` when none is given) stays as written. Idempotent once all
        tokens are known.
    """
    if "{{" not in text:
        return text
    table = {_lookup_key(k): v for k, v in values.items()}

    def replace(match: re.Match[str]) -> str:
        return table.get(_lookup_key(match.group(1)), match.group(0))

    return TOKEN_PATTERN.sub(replace, text)


def token_values(
    input_tasks: list[str | None],
    *,
    input_dirs: list[str],
    output_dir: str | None = None,
    workflow_id: str | None = None,
    hosts: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """Build the mapping :func:`substitute_tokens` takes, for one task.

    Args:
        input_tasks: for each of the task's inputs in order, the upstream task name for a
            ``task:`` input, else ``None``.
        input_dirs: the folder each input was downloaded to, same order.
        output_dir: the task's output folder (``{{output}}``).
        workflow_id: the workflow's id (``{{workflow_id}}``).
        hosts: task name to host name for the tasks of the group (``{{host:TASK}}``).

    Returns:
        Token body to value; ``input:TASK`` is present for each ``task:`` input.
    """
    values: dict[str, str] = {f"input:{i}": d for i, d in enumerate(input_dirs)}
    values.update({f"input:{t}": d for t, d in zip(input_tasks, input_dirs, strict=True) if t})
    values.update({f"host:{name}": host for name, host in (hosts or {}).items()})
    if output_dir is not None:
        values["output"] = output_dir
    if workflow_id is not None:
        values["workflow_id"] = workflow_id
    return values
