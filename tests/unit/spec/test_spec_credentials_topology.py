"""``credentials`` (task) and ``topology`` (resource spec) in OSMO's shapes.

Sources: OSMO docs, "Secrets" (``credentials: {NAME: {VAR: key}}`` or ``{NAME: /path}``),
"Resources" and "Topology-Aware Scheduling" (``topology: [{key, group, requirementType}]``,
one set of keys for every task of a workflow).
"""

from __future__ import annotations

import pytest
from spec_support import only_problem, problems, workflow

from trainyard import spec
from trainyard.spec.models import SpecDocument, TopologyRequirement


def _with_credentials(body: str) -> str:
    return workflow(
        f"""
        tasks:
        - name: t
          command: [x]
          credentials:
        {body}
    """.replace("\n        ", "\n")
    )


def test_osmo_credentials_load_and_dump_again() -> None:
    text = _with_credentials("""
            omni_cred:
              OMNI_USER: omni_user
              OMNI_PASS: omni_pass
            aws_keys: /root/.osmo
    """)
    doc = spec.load(text)
    task = doc.workflow.groups[0].tasks[0]
    assert task.credentials == {
        "omni_cred": {"OMNI_USER": "omni_user", "OMNI_PASS": "omni_pass"},
        "aws_keys": "/root/.osmo",
    }
    again = SpecDocument.model_validate(doc.model_dump(by_alias=True))
    assert again == doc


@pytest.mark.parametrize(
    ("body", "path", "reason"),
    [
        (
            "    c: [a, b]",
            "credentials.c",
            "used as a path such as /root/.creds or as a mapping VARIABLE: key, got a list",
        ),
        ("    c: null", "credentials.c", "got null"),
        (
            "    c: relative/dir",
            "credentials.c",
            "credential path 'relative/dir' must be an absolute folder",
        ),
        (
            "    c: /trainyard/creds",
            "credentials.c",
            "is inside /trainyard, which the task runner reserves",
        ),
        ("    c: {}", "credentials.c", "the credential maps no environment variable"),
        ("    c: {1BAD: key}", "credentials.c", "invalid environment variable name '1BAD'"),
        (
            "    c: {GOOD: ''}",
            "credentials.c",
            "GOOD must name a key of the credential as a non-empty string",
        ),
        ("    c: {GOOD: {nested: x}}", "credentials.c", "GOOD must name a key of the credential"),
        (
            "    'bad name': /root/c",
            "credentials['bad name']",
            "invalid credential name 'bad name'",
        ),
        (
            "    a: {USER: u}\n    b: {USER: v}",
            "credentials",
            "USER is set by both credentials 'a' and 'b'",
        ),
    ],
)
def test_bad_credentials_are_refused(body: str, path: str, reason: str) -> None:
    problem = only_problem(_with_credentials(body))
    assert problem.path == f"workflow.tasks[0].{path}"
    assert reason in problem.message
    assert problem.line is not None


def _with_topology(*entries: str, other: str = "other: {gpu: 1}") -> str:
    """Two resource specs (``default`` with ``entries`` as its topology, and ``other``) and
    a group whose tasks use one each."""
    topology = "".join(f"\n      - {e}" for e in entries)
    return (
        "workflow:\n  name: wf\n  resources:\n    default:\n      gpu: 1\n"
        f"      topology:{topology}\n    {other}\n"
        "  groups:\n  - name: g\n    tasks:\n    - {name: a, lead: true, command: [x]}\n"
        "    - {name: b, command: [x], resource: other}\n"
    )


def test_osmo_topology_loads_with_its_defaults() -> None:
    doc = spec.load(
        _with_topology("key: gpu-clique", "{key: zone, group: wf, requirementType: preferred}")
    )
    clique, zone = doc.workflow.resources["default"].topology or []
    assert (clique.key, clique.group, clique.requirement_type) == (
        "gpu-clique",
        "default",
        TopologyRequirement.REQUIRED,
    )
    assert (zone.key, zone.group, zone.requirement_type) == (
        "zone",
        "wf",
        TopologyRequirement.PREFERRED,
    )
    dumped = doc.model_dump(by_alias=True, mode="json")["workflow"]["resources"]["default"][
        "topology"
    ]
    assert dumped[1] == {"key": "zone", "group": "wf", "requirementType": "preferred"}
    assert SpecDocument.model_validate(doc.model_dump(by_alias=True)) == doc


@pytest.mark.parametrize(
    ("entry", "path", "reason"),
    [
        ("{group: g}", "topology[0].key", "required field 'key' is missing"),
        ("{key: ''}", "topology[0].key", "must not be empty"),
        (
            "{key: rack, requirementType: soft}",
            "topology[0].requirementType",
            "got 'soft'; expected one of 'required' or 'preferred'",
        ),
        (
            "{key: rack, colour: red}",
            "topology[0].colour",
            "unknown field 'colour'; valid fields here: key, group, requirementType",
        ),
        ("rack", "topology[0]", "expected a mapping"),
    ],
)
def test_bad_topology_entries_are_refused(entry: str, path: str, reason: str) -> None:
    problem = only_problem(_with_topology(entry))
    assert problem.path == f"workflow.resources.default.{path}"
    assert reason in problem.message


def test_a_topology_key_given_twice_is_refused() -> None:
    problem = only_problem(_with_topology("{key: rack, group: a}", "{key: rack, group: b}"))
    assert problem.path == "workflow.resources.default.topology"
    assert "topology key 'rack' is given 2 times" in problem.message


def test_tasks_with_topology_must_use_the_same_keys() -> None:
    mixed = _with_topology("key: zone", "key: rack", other="other: {topology: [{key: zone}]}")
    problem = only_problem(mixed)
    assert problem.path == "workflow.resources.other.topology"
    assert "topology keys {zone} differ from {rack, zone} of resource 'default'" in problem.message
    same = _with_topology("key: zone", other="other: {topology: [{key: zone, group: mine}]}")
    assert spec.validate(same) == []


def test_a_resource_no_task_uses_is_not_compared() -> None:
    text = _with_topology(
        "key: zone", other="other: {gpu: 1}\n    spare: {topology: [{key: rack}]}"
    )
    assert spec.validate(text) == []
    assert problems(_with_topology("key: zone", other="other: {topology: [{key: rack}]}"))
