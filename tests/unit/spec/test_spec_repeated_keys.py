"""A key given twice in one mapping: accepted as OSMO accepts it (PyYAML keeps the last
value), reported as a warning naming both lines and, when the values differ, the one used.

Issue 14: OSMO's cookbook GitHub-integration example repeats ``path`` in a ``files:`` entry.
"""

from __future__ import annotations

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st
from spec_support import dedent

from trainyard import spec
from trainyard.errors import SpecError
from trainyard.spec.yamlsource import parse_yaml

COOKBOOK = dedent("""
    workflow:
      name: github-integration
      tasks:
      - name: clone
        image: ubuntu:24.04
        command: [bash, /tmp/entry.sh]
        files:
        - path: /tmp/entry.sh
          contents: |-
            set -e
            echo cloning
          path: /tmp/entry.sh
""")


def test_the_cookbook_snippet_with_the_same_value_twice_runs_as_in_osmo() -> None:
    doc = spec.load(COOKBOOK, spec_path="gh.yaml")
    files = doc.workflow.groups[0].tasks[0].files
    assert [(f.path, f.contents) for f in files] == [("/tmp/entry.sh", "set -e\necho cloning")]
    (warning,) = doc.warnings
    assert (warning.path, warning.line, warning.file) == (
        "workflow.tasks[0].files[0].path",
        12,
        "gh.yaml",
    )
    assert (
        "key 'path' is given twice in one mapping (lines 8 and 12) with the same value"
        in warning.message
    )
    assert str(warning.warning_text()).startswith(
        "gh.yaml:12: warning: workflow.tasks[0].files[0].path: "
    )


def test_different_values_the_last_is_used_and_the_warning_names_it() -> None:
    text = COOKBOOK.replace("      path: /tmp/entry.sh\n", "      path: /tmp/other.sh\n")
    assert text.count("/tmp/other.sh") == 1
    doc = spec.load(text)
    assert doc.workflow.groups[0].tasks[0].files[0].path == "/tmp/other.sh"
    (warning,) = doc.warnings
    assert warning.line == 12
    assert "(lines 8 and 12) with different values" in warning.message
    assert "the value of line 12 ('/tmp/other.sh') is used" in warning.message


@pytest.mark.parametrize(
    "text",
    [
        COOKBOOK,
        COOKBOOK.replace("      path: /tmp/entry.sh\n", "      path: /tmp/other.sh\n"),
        "a: 1\nb: {x: [1, 2], x: [3]}\na: 2\nc: &k {y: 1, y: 2}\nd: *k\n",
        "a: {b: 1, b: 1, b: 2}\n",
    ],
)
def test_the_data_is_what_pyyaml_builds(text: str) -> None:
    """The last value wins exactly as in OSMO's loader (PyYAML's safe_load)."""
    assert parse_yaml(text).data == yaml.safe_load(text)


def test_three_times_and_nested_repeats_are_each_reported_once_in_line_order() -> None:
    text = "a: {b: 1, b: 1, b: 2}\nc: &k {y: 1, y: 2}\nd: *k\ne: *k\n"
    repeated = parse_yaml(text).repeated
    assert [(r.loc, r.first_line, r.last_line, r.same_value) for r in repeated] == [
        (("a", "b"), 1, 1, True),
        (("a", "b"), 1, 1, False),
        (("c", "y"), 2, 2, False),
    ]


def test_a_value_problem_under_a_repeated_key_points_at_the_used_line() -> None:
    text = dedent("""
        workflow:
          name: w
          tasks:
          - name: t
            command: [x]
            resource: default
            resource: missing
    """)
    with pytest.raises(SpecError) as caught:
        spec.load(text)
    lines = {p.path: p.line for p in caught.value.problems}
    assert lines == {"workflow.tasks[0].resource": 7}
    assert [w.line for w in caught.value.warnings] == [7]


def test_validate_returns_no_problem_for_a_repeated_key() -> None:
    assert spec.validate(COOKBOOK) == []


def test_keys_equal_across_types_collide_as_in_pyyaml() -> None:
    text = "a: {1: x, true: y, 1.0: z}\n"
    parsed = parse_yaml(text)
    assert parsed.data == yaml.safe_load(text) == {"a": {1: "z"}}
    assert [(r.key, r.same_value, r.used) for r in parsed.repeated] == [
        ("true", False, "y"),
        ("1.0", False, "z"),
    ]


_KEYS = st.sampled_from(["a", "b", "path", "1", "true"])
_VALUES = st.one_of(st.integers(-3, 3), st.sampled_from(["x", "'y'", "[1, 2]", "{k: 1, k: 2}"]))


@given(st.lists(st.tuples(_KEYS, _VALUES), min_size=1, max_size=8))
def test_any_repeats_build_what_pyyaml_builds_and_each_is_reported(
    pairs: list[tuple[str, object]],
) -> None:
    text = "".join(f"{key}: {value}\n" for key, value in pairs)
    parsed = parse_yaml(text)
    assert parsed.data == yaml.safe_load(text)
    top = [r for r in parsed.repeated if len(r.loc) == 1]
    assert len(top) == len(pairs) - len(yaml.safe_load(text))
    assert all(r.first_line < r.last_line for r in top)
