"""Special tokens: finding them and substituting them at run time."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from trainyard.spec import find_tokens, substitute_tokens, token_values


def test_find_tokens_reports_kind_argument_position_and_text() -> None:
    text = "cp {{input:0}}/a {{ output }}/b; ping {{host:Master}} {{workflow_id}} {{input:prep}}"
    found = list(find_tokens(text))
    assert [(t.kind, t.arg) for t in found] == [
        ("input", "0"),
        ("output", ""),
        ("host", "Master"),
        ("workflow_id", ""),
        ("input", "prep"),
    ]
    assert found[1].text == "{{ output }}"
    assert text[found[2].start :].startswith("{{host:Master}}")


def test_things_that_are_not_tokens_are_not_found() -> None:
    text = "{{ name }} {{input:}} {{host:}} {{ output | upper }} {output} {{input:a b}} $(VAR) ${X}"
    assert list(find_tokens(text)) == []


def test_substitution_replaces_known_tokens_and_keeps_unknown_ones() -> None:
    text = "{{output}}/x {{ input:0 }} {{workflow_id}} {{host:server}} {{input:1}}"
    values = {"output": "/o", "input:0": "/i0", "host:server": "10.0.0.2"}
    assert substitute_tokens(text, values) == "/o/x /i0 {{workflow_id}} 10.0.0.2 {{input:1}}"


def test_workflow_id_stays_a_token_until_it_is_known() -> None:
    assert substitute_tokens("id={{workflow_id}}", {}) == "id={{workflow_id}}"
    assert substitute_tokens("id={{ workflow_id }}", {"workflow_id": "wf-1"}) == "id=wf-1"


def test_task_names_in_tokens_match_like_names_do() -> None:
    values = {"host:worker_1": "h1", "input:Prep-Data": "/in/prep"}
    assert substitute_tokens("{{host:Worker-1}} {{input:prep_data}}", values) == "h1 /in/prep"


def test_text_without_tokens_is_returned_as_is() -> None:
    text = "echo {{ not_a_token }}"
    assert substitute_tokens(text, {"output": "/o"}) is text


@given(
    st.text(alphabet=st.characters(blacklist_characters="{}"), max_size=40),
    st.text(min_size=1, max_size=20),
)
def test_substitution_is_idempotent_once_values_are_plain(prefix: str, value: str) -> None:
    value = value.replace("{", "(").replace("}", ")")
    once = substitute_tokens(prefix + "{{output}}" + prefix, {"output": value})
    assert once == prefix + value + prefix
    assert substitute_tokens(once, {"output": value}) == once


def test_token_values_maps_indexes_task_names_hosts_and_ids() -> None:
    values = token_values(
        ["prep", None],
        input_dirs=["/in/0", "/in/1"],
        output_dir="/out",
        workflow_id="wf-7",
        hosts={"master": "10.0.0.1"},
    )
    assert values == {
        "input:0": "/in/0",
        "input:1": "/in/1",
        "input:prep": "/in/0",
        "output": "/out",
        "workflow_id": "wf-7",
        "host:master": "10.0.0.1",
    }
    text = "{{input:prep}} {{input:1}} {{output}} {{workflow_id}} {{host:master}}"
    assert substitute_tokens(text, values) == "/in/0 /in/1 /out wf-7 10.0.0.1"


def test_token_values_leave_out_what_is_not_given() -> None:
    assert token_values([], input_dirs=[]) == {}
