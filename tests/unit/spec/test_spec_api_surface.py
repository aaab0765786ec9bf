"""The public surface of ``trainyard.spec``: a checked ``__all__``, documented contracts,
and the JSON Schema for editors."""

from __future__ import annotations

import importlib
import inspect
import json
import subprocess
import sys

import pytest

import trainyard.spec as spec_pkg
from trainyard import spec


def test_all_names_exist_and_nothing_public_is_left_out() -> None:
    assert len(spec.__all__) == len(set(spec.__all__))
    assert set(spec_pkg._MODULE_OF) == set(spec.__all__)
    for name in spec.__all__:
        assert getattr(spec_pkg, name) is getattr(
            importlib.import_module(spec_pkg._MODULE_OF[name]), name
        )
    assert set(spec.__all__) <= set(dir(spec_pkg))
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        spec_pkg.nope  # noqa: B018


def test_the_runner_can_import_tokens_without_jinja_or_pydantic() -> None:
    code = (
        "import sys, trainyard.spec.tokens; "
        "print(sorted(m for m in ('jinja2', 'pydantic', 'yaml') if m in sys.modules))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "[]"


def test_public_functions_document_their_contract() -> None:
    for name in spec.__all__:
        value = getattr(spec, name)
        if inspect.isfunction(value) or inspect.isclass(value):
            assert inspect.getdoc(value), f"{name} has no docstring"
    for name in (
        "load",
        "parse",
        "render",
        "render_source",
        "validate",
        "parse_set_values",
        "parse_exit_codes",
    ):
        doc = inspect.getdoc(getattr(spec, name)) or ""
        assert "Raises:" in doc or "Returns:" in doc, name


def test_schema_has_the_yaml_keys_and_text_forms() -> None:
    schema = spec.json_schema()
    json.dumps(schema)
    defs = schema["$defs"]
    assert set(schema["properties"]) == {"version", "workflow", "default-values"}
    assert {"tasks", "groups", "resources", "labels", "timeout"} <= set(
        defs["WorkflowSpec"]["properties"]
    )
    assert "groups" not in defs["WorkflowSpec"].get("required", [])
    task = defs["TaskSpec"]["properties"]
    assert {"exitActions", "volumeMounts", "hostNetwork"} <= set(task)
    assert "exit_actions" not in task
    assert {"memory", "storage", "nodesExcluded"} <= set(defs["ResourceSpec"]["properties"])
    memory_types = {t.get("type") for t in defs["ResourceSpec"]["properties"]["memory"]["anyOf"]}
    assert "string" in memory_types
    assert defs["TaskSpec"]["additionalProperties"] is False


def test_schema_accepts_a_real_spec_shape() -> None:
    jsonschema = __import__("importlib").util.find_spec("jsonschema")
    if jsonschema is None:
        pytest.skip("jsonschema is not installed")
    import jsonschema as js  # type: ignore[import-untyped]

    doc = {
        "workflow": {
            "name": "w",
            "timeout": {"exec_timeout": "5m"},
            "resources": {"default": {"cpu": 1, "memory": "1Gi"}},
            "tasks": [{"name": "t", "command": ["echo"], "exitActions": {"COMPLETE": "0,1-3"}}],
        }
    }
    js.validate(doc, spec.json_schema())


def test_type_checkers_see_every_public_name() -> None:
    import ast

    tree = ast.parse(inspect.getsource(spec_pkg))
    block = next(
        n
        for n in tree.body
        if isinstance(n, ast.If) and getattr(n.test, "id", "") == "TYPE_CHECKING"
    )
    imported = {
        (node.module, a.name)
        for node in block.body
        if isinstance(node, ast.ImportFrom)
        for a in node.names
    }
    assert imported == {(spec_pkg._MODULE_OF[name], name) for name in spec.__all__}
