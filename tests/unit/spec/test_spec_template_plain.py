"""Plain templates (only ``{{ name }}`` tags of given values) are rendered without Jinja and
without the child (``template._render_plain``, issue 15), to exactly the text Jinja's sandbox
makes; any other template still takes the bounded child."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from trainyard.errors import SpecError
from trainyard.spec import render, template
from trainyard.spec.template import _environment, _render_plain

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "torchrun_multinode" / "train.yaml"

NAMES = [
    "a",
    "b",
    "n_gpus",
    "x1",
    "_u",
    "true",
    "None",
    "self",
    "loop",
    "if",
    "range",
    "dict",
    "missing",
]
_names = st.sampled_from(NAMES)
_scalars = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8)
_values = st.recursive(
    _scalars | st.dates(),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3)
    ),
    max_leaves=5,
)
_pieces = st.one_of(
    st.text(alphabet="ab {}%#-\n\r\t:|'\"\x00é", max_size=6),
    _names.map(lambda n: "{{ %s }}" % n),
    _names.map(lambda n: "{{%s}}" % n),
    _names.map(lambda n: "{{\t%s  }}" % n),
    _names.map(lambda n: "{{- %s -}}" % n),
    _names.map(lambda n: "{{ %s|upper }}" % n),
    _names.map(lambda n: "{{ %s.x }}" % n),
    st.sampled_from(
        [
            "{% if true %}x{% endif %}",
            "{# c #}",
            "{{{ a }}",
            "{{ a }}}",
            "{{\na }}",
            "{%raw%}{{ a }}{%endraw%}",
            "{{ 'a' }}",
            "{{a}}{{b}}",
        ]
    ),
)


def _jinja(text: str, context: dict[str, Any]) -> str | None:
    """What the child renders (its environment, in this process); None when it refuses."""
    try:
        return _environment().from_string(text).render(context)
    except Exception:  # noqa: BLE001 - any refusal: the plain path must not answer either
        return None


_contexts = st.fixed_dictionaries(
    {"a": _values, "b": _values, "n_gpus": _values}, optional={name: _values for name in NAMES[3:]}
)
_plain_pieces = st.one_of(
    st.text(alphabet="ab {}%#-\n\t:|'\"é", max_size=6),
    st.sampled_from(["a", "b", "n_gpus"]).map(lambda n: "{{ %s }}" % n),
)


@settings(max_examples=300, deadline=None)
@given(pieces=st.lists(_pieces, max_size=8), context=_contexts)
@example(pieces=["x: {{ a }}\n"], context={"a": 1})
@example(pieces=["{{ true }}"], context={"true": 1})
@example(pieces=["{{{ a }}"], context={"a": 1})
@example(pieces=["a\r\n{{ a }}"], context={"a": 1})
def test_a_plain_rendering_is_jinjas(pieces: list[str], context: dict[str, Any]) -> None:
    text = "".join(pieces)
    plain = _render_plain(text, context, 10**6)
    if plain is not None:
        assert plain == _jinja(text, context)


@settings(max_examples=300, deadline=None)
@given(
    pieces=st.lists(_plain_pieces, max_size=8),
    context=st.fixed_dictionaries({"a": _scalars, "b": _scalars, "n_gpus": _scalars}),
)
def test_plain_tags_between_any_text_render_as_jinja_renders_them(
    pieces: list[str], context: dict[str, Any]
) -> None:
    text = "".join(pieces)
    assert _render_plain(text, context, 10**6) in (_jinja(text, context), None)


def test_usual_specs_are_plain_and_take_no_child(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_child(*_args: object) -> str:
        raise AssertionError("rendered in a child")

    monkeypatch.setattr(template, "_render_in_child", no_child)
    text = EXAMPLE.read_text()
    out = render(text, values={"n_gpus_per_node": 1})
    assert "--nproc_per_node 1 --node_rank 0" in out and "{{output}}/models" in out
    assert "--master_addr {{host:master}} --master_port 29400" in out


@pytest.mark.parametrize(
    "text",
    [
        "{{ a|upper }}",
        "{% if a %}x{% endif %}",
        "{{ missing }}",
        "{{ true }}",
        "a\r\n{{ a }}",
        "{{ a.b }}",
        "{# c #}{{ a }}",
    ],
)
def test_other_templates_take_the_child(monkeypatch: pytest.MonkeyPatch, text: str) -> None:
    taken: list[str] = []
    real = template._render_in_child

    def child(protected: str, *args: Any) -> str:
        taken.append(protected)
        return real(protected, *args)

    monkeypatch.setattr(template, "_render_in_child", child)
    try:
        render(text, values={"a": "v"})
    except SpecError:
        pass  # {{ missing }}: the child's error, with its line
    assert taken == [text]


def test_output_over_the_limit_is_left_to_the_child_and_refused() -> None:
    assert _render_plain("{{ a }}{{ a }}", {"a": "x" * 10}, 15) is None
    with pytest.raises(SpecError, match="over the limit"):
        render(
            "{{ a }}{{ a }}", values={"a": "x" * 10}, limits=template.RenderLimits(output_bytes=15)
        )


def test_a_list_value_is_left_to_the_child_and_its_memory_bound() -> None:
    """A spec's default-values may repeat one long string through YAML aliases (each alias
    one node of the parser's budget): written out it would take 200 MB. Only the child, whose
    memory is bounded, writes such a value; the caller never holds it."""
    text = (
        "workflow:\n  name: {{ b }}\ndefault-values:\n  s: &s "
        + "x" * 100_000
        + "\n  b: ["
        + ", ".join(["*s"] * 2000)
        + "]\n"
    )
    assert _render_plain("{{ b }}", {"b": ["x" * 100_000] * 2000}, 10**12) is None
    # The time bound is raised so that the memory bound is what ends it on a busy machine
    # too (CI, under load, once ran past 0.55 s of CPU first).
    limits = dataclasses.replace(template.DEFAULT_LIMITS, time_s=20.0)
    with pytest.raises(SpecError, match="memory limit|over the limit"):
        render(text, limits=limits)


def test_a_value_that_is_not_utf8_is_left_to_the_child() -> None:
    assert _render_plain("{{ a }}", {"a": "\udcff"}, 100) is None
