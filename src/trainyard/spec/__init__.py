"""The workflow language: OSMO workflow specs from text to a validated ``SpecDocument``.

Typical use::

    from trainyard import spec

    doc = spec.load(Path("train.yaml"), set_values=spec.parse_set_values(["n_nodes=4"]))
    for group in doc.workflow.groups: ...

    text = spec.render(Path("train.yaml").read_text(), values={"n_nodes": 4})  # tokens kept
    spec.substitute_tokens(text, {"output": "/run/out"})                      # at run time

Every refusal is a ``trainyard.errors.SpecError`` listing each ``SpecProblem`` (field path,
rendered line, file). See ../shared/DESIGN.md ("spec/").
"""

from __future__ import annotations

from trainyard.spec.api import (
    PoolChoice,
    check_pool,
    json_schema,
    load,
    parse,
    render_source,
    validate,
)
from trainyard.spec.fields import format_exit_codes, name_key, parse_exit_codes, split_mount
from trainyard.spec.models import (
    DEFAULT_RESOURCE,
    CheckpointSpec,
    DatasetRef,
    ExitAction,
    FileSpec,
    GroupSpec,
    ResourceSpec,
    SpecDocument,
    TaskInput,
    TaskOutput,
    TaskSpec,
    Timeout,
    WorkflowSpec,
)
from trainyard.spec.poolfit import allowed_mounts
from trainyard.spec.template import DEFAULT_LIMITS, RenderLimits, extract_default_values, render
from trainyard.spec.tokens import Token, find_tokens, substitute_tokens, token_values
from trainyard.spec.values import parse_env, parse_labels, parse_set_strings, parse_set_values

__all__ = [
    # pipeline
    "load",
    "render_source",
    "parse",
    "validate",
    "render",
    "json_schema",
    "PoolChoice",
    "RenderLimits",
    "DEFAULT_LIMITS",
    "extract_default_values",
    "check_pool",
    "allowed_mounts",
    # command-line values
    "parse_set_values",
    "parse_set_strings",
    "parse_env",
    "parse_labels",
    # special tokens
    "Token",
    "find_tokens",
    "substitute_tokens",
    "token_values",
    # single fields
    "parse_exit_codes",
    "format_exit_codes",
    "split_mount",
    "name_key",
    # models
    "SpecDocument",
    "WorkflowSpec",
    "GroupSpec",
    "TaskSpec",
    "ResourceSpec",
    "Timeout",
    "TaskInput",
    "TaskOutput",
    "DatasetRef",
    "FileSpec",
    "CheckpointSpec",
    "ExitAction",
    "DEFAULT_RESOURCE",
]
