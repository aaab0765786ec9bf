"""Helpers for the spec tests: load a spec text and look at its problems."""

from __future__ import annotations

import textwrap
from typing import Any

from trainyard import spec
from trainyard.errors import SpecError, SpecProblem
from trainyard.pools import NodeSpec, Pool

OSMO_PLATFORMS = ("ovx-a40", "ovx-l40", "dgx-h100", "agx-orin-jp6")


def dedent(text: str) -> str:
    """``textwrap.dedent`` without the leading newline."""
    return textwrap.dedent(text).lstrip("\n")


def task_yaml(name: str = "t", **extra: str) -> str:
    """A minimal valid task as a YAML list item (4-space indented under ``tasks:``)."""
    lines = [f"  - name: {name}", "    command: [echo]"]
    lines += [f"    {key}: {value}" for key, value in extra.items()]
    return "\n".join(lines) + "\n"


def workflow(body: str, name: str = "wf") -> str:
    """A spec with ``workflow.name`` and the dedented ``body`` under ``workflow:``."""
    indented = textwrap.indent(dedent(body), "  ")
    return f"workflow:\n  name: {name}\n{indented}"


def problems(text: str, **options: Any) -> list[SpecProblem]:
    """The problems ``load`` raises for ``text`` (fails the test if it loads)."""
    try:
        spec.load(text, **options)
    except SpecError as exc:
        assert exc.problems, "a SpecError must carry problems"
        return exc.problems
    raise AssertionError("the spec loaded but was expected to be refused")


def strict_problems(text: str, **options: Any) -> list[SpecProblem]:
    """What ``validate --strict`` refuses ``text`` for: its problems and its warnings (such
    as a ``{{host:X}}`` naming no task, which OSMO accepts), by line. Fails the test if
    there are none."""
    try:
        doc = spec.load(text, **options)
    except SpecError as exc:
        found = [*exc.problems, *exc.warnings]
    else:
        found = list(doc.warnings)
    assert found, "the spec loaded without a warning but was expected to be refused"
    return sorted(found, key=lambda p: (p.line is None, p.line or 0))


def only_problem(text: str, **options: Any) -> SpecProblem:
    """The single problem of ``text``."""
    found = problems(text, **options)
    assert len(found) == 1, "\n".join(map(str, found))
    return found[0]


def osmo_pool(name: str = "osmo", per_platform: int = 2, **options: Any) -> Pool:
    """A pool like OSMO's test deployment: its four platforms, 8 GPUs, 64 CPUs, 512 GiB
    memory and 2 TiB storage per node."""
    nodes = [
        NodeSpec(name=f"{p}-{i}", platform=p) for p in OSMO_PLATFORMS for i in range(per_platform)
    ]
    return Pool(name=name, nodes=nodes, options=options)
