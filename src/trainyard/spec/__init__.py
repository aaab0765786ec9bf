"""The workflow language: OSMO workflow specs from text to a validated ``SpecDocument``::

    doc = spec.load(Path("train.yaml"), set_values=spec.parse_set_values(["n_nodes=4"]))
    text = spec.render(Path("train.yaml").read_text(), values={"n_nodes": 4})  # tokens kept
    spec.substitute_tokens(text, {"output": "/run/out"})                      # at run time

Every refusal is a ``trainyard.errors.SpecError`` listing each ``SpecProblem`` (field path,
rendered line, file). See ../shared/DESIGN.md ("spec/"). Names are imported on first use, so
``trainyard.spec.tokens`` (which the task runner imports) does not pull in Jinja and pydantic.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from trainyard.spec.api import (
        PoolChoice,
        check_pool,
        json_schema,
        load,
        parse,
        render_source,
        reparse,
        validate,
    )
    from trainyard.spec.fields import (
        format_exit_codes,
        name_key,
        parse_exit_codes,
        split_mount,
        split_task_ref,
    )
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
        TopologyRequirement,
        TopologySpec,
        WorkflowSpec,
    )
    from trainyard.spec.poolfit import allowed_mounts
    from trainyard.spec.size import MAX_SPEC_BYTES, check_source_size, check_spec_size, text_bytes
    from trainyard.spec.template import DEFAULT_LIMITS, RenderLimits, extract_default_values, render
    from trainyard.spec.tokens import Token, find_tokens, substitute_tokens, token_values
    from trainyard.spec.values import parse_env, parse_labels, parse_set_strings, parse_set_values

_HOMES = {
    "trainyard.spec.api": (
        "PoolChoice",
        "check_pool",
        "json_schema",
        "load",
        "parse",
        "render_source",
        "reparse",
        "validate",
    ),
    "trainyard.spec.fields": (
        "format_exit_codes",
        "name_key",
        "parse_exit_codes",
        "split_mount",
        "split_task_ref",
    ),
    "trainyard.spec.models": (
        "DEFAULT_RESOURCE",
        "CheckpointSpec",
        "DatasetRef",
        "ExitAction",
        "FileSpec",
        "GroupSpec",
        "ResourceSpec",
        "SpecDocument",
        "TaskInput",
        "TaskOutput",
        "TaskSpec",
        "Timeout",
        "WorkflowSpec",
        "TopologySpec",
        "TopologyRequirement",
    ),
    "trainyard.spec.poolfit": ("allowed_mounts",),
    "trainyard.spec.size": ("MAX_SPEC_BYTES", "check_source_size", "check_spec_size", "text_bytes"),
    "trainyard.spec.template": (
        "DEFAULT_LIMITS",
        "RenderLimits",
        "extract_default_values",
        "render",
    ),
    "trainyard.spec.tokens": ("Token", "find_tokens", "substitute_tokens", "token_values"),
    "trainyard.spec.values": ("parse_env", "parse_labels", "parse_set_strings", "parse_set_values"),
}
_MODULE_OF = {name: module for module, names in _HOMES.items() for name in names}


def __getattr__(name: str) -> Any:
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module 'trainyard.spec' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


__all__ = [
    # pipeline
    "load",
    "render_source",
    "parse",
    "reparse",
    "validate",
    "render",
    "json_schema",
    "PoolChoice",
    "RenderLimits",
    "DEFAULT_LIMITS",
    "extract_default_values",
    "check_pool",
    "allowed_mounts",
    "MAX_SPEC_BYTES",
    "check_spec_size",
    "check_source_size",
    "text_bytes",
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
    "split_task_ref",
    "name_key",
    # models
    "SpecDocument",
    "WorkflowSpec",
    "GroupSpec",
    "TaskSpec",
    "ResourceSpec",
    "TopologySpec",
    "TopologyRequirement",
    "Timeout",
    "TaskInput",
    "TaskOutput",
    "DatasetRef",
    "FileSpec",
    "CheckpointSpec",
    "ExitAction",
    "DEFAULT_RESOURCE",
]
