"""Template rendering: values and their precedence, tokens kept, sandbox, time and memory
bounds, template errors with their line."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import time

import pytest
from spec_support import dedent

from trainyard.errors import SpecError
from trainyard.spec import DEFAULT_LIMITS, RenderLimits, extract_default_values, render


def render_error(text: str, **options: object) -> str:
    with pytest.raises(SpecError) as caught:
        render(text, **options)  # type: ignore[arg-type]
    [problem] = caught.value.problems
    return str(problem)


SPEC = dedent("""
    workflow:
      name: {{ name }}
      x: {{ count }}
    default-values:
      name: from-defaults
      count: 1
""")


def test_default_values_fill_the_template() -> None:
    assert "name: from-defaults\n  x: 1\n" in render(SPEC)


def test_set_values_win_over_default_values() -> None:
    assert "name: cli\n  x: 7\n" in render(SPEC, values={"name": "cli", "count": 7})


def test_set_strings_win_over_set_values() -> None:
    out = render(SPEC, values={"name": "typed"}, set_strings={"name": "stringy"})
    assert "name: stringy" in out


def test_rendered_text_keeps_the_default_values_section_and_trailing_newline() -> None:
    out = render(SPEC)
    assert out.endswith("count: 1\n")
    assert "default-values:\n  name: from-defaults" in out


@pytest.mark.parametrize(
    "token",
    [
        "{{output}}",
        "{{ output }}",
        "{{input:0}}",
        "{{ input:12 }}",
        "{{input:task-a}}",
        "{{workflow_id}}",
        "{{ workflow_id }}",
        "{{host:master}}",
        "{{ host:worker_1 }}",
        "{{  host:x  }}",
    ],
)
def test_special_tokens_pass_through_untouched(token: str) -> None:
    text = f"a: \"{token}/x {{{{ v }}}} {token}\"\n"
    assert render(text, values={"v": "V"}) == f"a: \"{token}/x V {token}\"\n"


def test_a_value_given_for_a_token_name_is_ignored() -> None:
    text = "a: {{output}} {{workflow_id}}\n"
    assert render(text, values={"output": "X", "workflow_id": "Y"}) == text


def test_tokens_inside_loops_conditions_and_raw_blocks_survive() -> None:
    text = dedent("""
        {% for i in range(2) %}- {{host:master}} {{ i }}
        {% endfor %}{% if true %}{{output}}{% endif %}
        {% raw %}{{output}} {{ not_a_var }}{% endraw %}
    """)
    assert (
        render(text)
        == "- {{host:master}} 0\n- {{host:master}} 1\n{{output}}\n{{output}} {{ not_a_var }}\n"
    )


def test_host_tokens_assembled_by_the_template_come_out_whole() -> None:
    text = "{% for i in range(1, 3) %}{% raw %}{{host:worker_{% endraw %}{{i}}{% raw %}}}{% endraw %} {% endfor %}"
    assert render(text) == "{{host:worker_1}} {{host:worker_2}} "


def test_unset_variable_is_named_with_its_line_and_how_to_set_it() -> None:
    message = render_error("a: 1\nb: {{ storage_url }}/x\n", file="spec.yaml")
    assert message == (
        "spec.yaml:2: template variable 'storage_url' is not set; set it with "
        "--set storage_url=VALUE or add it under default-values"
    )


def test_undefined_attribute_is_reported() -> None:
    message = render_error("a: {{ cfg.missing }}\n", values={"cfg": {"x": 1}})
    assert "template uses an undefined value" in message and "missing" in message


def test_syntax_error_has_its_line() -> None:
    message = render_error("a: 1\nb: 2\n{% for x in %}\n", file="f.yaml")
    assert message.startswith("f.yaml:3: template syntax error:")
    assert message.endswith("; fix the Jinja syntax")


@pytest.mark.parametrize(
    "expr",
    ["''.__class__", "().__class__.__bases__", "cycler.__init__.__globals__", "self.__init__"],
)
def test_sandbox_refuses_python_internals(expr: str) -> None:
    message = render_error(f"a: {{{{ {expr} }}}}\n")
    assert "breaks the sandbox" in message or "undefined value" in message


def test_python_errors_in_templates_become_template_errors() -> None:
    assert "ZeroDivisionError" in render_error("a: {{ 1 / 0 }}\n")


def test_a_cpu_bomb_is_stopped_at_the_time_limit_and_the_caller_goes_on() -> None:
    bomb = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"
    start = time.monotonic()
    message = render_error(bomb, limits=RenderLimits(time_s=0.3))
    assert time.monotonic() - start < 5
    assert "ran past its time limit of 0.3 s" in message
    assert render("a: {{ 1 + 1 }}\n") == "a: 2\n"


@pytest.mark.parametrize(
    "bomb",
    [
        "{{ 'a' * 1000000000 }}",
        "{% set ns = namespace(x='ab') %}{% for i in range(60) %}{% set ns.x = ns.x + ns.x %}{% endfor %}{{ ns.x|length }}",
        "{{ range(100000)|list * 2000 }}",
    ],
)
def test_a_memory_bomb_is_stopped_at_the_memory_limit(bomb: str) -> None:
    message = render_error(bomb, limits=RenderLimits(time_s=5, memory_bytes=64 * 2**20))
    assert "ran past its memory limit of 64 MiB" in message


def test_rendering_runs_in_a_child_that_cannot_touch_the_caller() -> None:
    pid = os.getpid()
    text = "{% set ns = namespace(x='') %}{% for i in range(3) %}{% set ns.x = ns.x ~ i %}{% endfor %}{{ ns.x }}"
    assert render(text) == "012"
    assert os.getpid() == pid
    with pytest.raises(SpecError):
        render("{{ 'a' * 1000000000 }}")
    assert render("ok") == "ok"


def test_output_larger_than_a_pipe_buffer_comes_back_whole() -> None:
    out = render("{% for i in range(100000) %}{{ i }},{% endfor %}", limits=RenderLimits(time_s=10))
    assert out.count(",") == 100000 and out.startswith("0,1,2,") and out.endswith(",99999,")


def test_deeply_nested_conditions_render() -> None:
    depth = 60
    text = "{% if true %}" * depth + "deep {{ v }}" + "{% endif %}" * depth
    assert render(text, values={"v": "ü"}) == "deep ü"


def test_too_many_nested_loops_are_refused_clearly() -> None:
    text = "{% for a in range(1) %}" * 30 + "x" + "{% endfor %}" * 30
    assert "nested too deeply" in render_error(text)


def test_unicode_and_huge_values_render_intact() -> None:
    big = "x" * 2_000_000
    out = render(
        "a: '{{ v }}'\nb: {{ w }}\n",
        values={"v": "naïve 🚂 ✓", "w": big},
        limits=RenderLimits(time_s=10),
    )
    assert out == f"a: 'naïve 🚂 ✓'\nb: {big}\n"


def test_defaults_limits_are_osmos() -> None:
    assert DEFAULT_LIMITS == RenderLimits(time_s=0.5, memory_bytes=100 * 2**20)


def test_default_values_are_read_from_the_unrendered_text() -> None:
    text = dedent("""
        workflow:
          tasks:
          {% for i in range(n) %}
          - name: t{{ i }}
          {% endfor %}
        default-values:
          n: 2  # comment
          s: "{{output}}"
        # trailing comment
    """)
    assert extract_default_values(text) == {"n": 2, "s": "{{output}}"}
    assert extract_default_values("workflow: {}\n") == {}
    assert extract_default_values("default-values:\n") == {}


def test_default_values_section_ends_at_the_next_top_level_key() -> None:
    text = "default-values:\n  a: 1\nworkflow:\n  {% if a %}x{% endif %}\n"
    assert extract_default_values(text) == {"a": 1}


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        (
            "a: 1\ndefault-values:\n  x: {% if y %}1{% endif %}\n",
            "default-values must be plain YAML",
        ),
        ("default-values: [1, 2]\n", "must be a mapping"),
    ],
)
def test_bad_default_values_are_refused_with_their_line(text: str, reason: str) -> None:
    message = render_error(text, file="s.yaml")
    assert reason in message
    assert message.startswith("s.yaml:")
    assert "default-values:" in message


def test_text_without_template_syntax_is_returned_as_is() -> None:
    text = "workflow:\r\n  name: w # {{output}} {{ host:a }} { not jinja }\r\n"
    assert render(text) is text


def test_a_long_template_gets_time_and_memory_for_its_length() -> None:
    limits = RenderLimits(time_s=0.5, memory_bytes=100 * 2**20)
    grown = limits.for_template(8 * 2**20, 1000)
    assert (grown.time_s, grown.memory_bytes) == (
        5.0,
        100 * 2**20 + 16 * 8 * 2**20 + 1000 * 16 * 1024,
    )
    assert grown.for_template(2**20, 10) == grown
    # ~11 KiB per tag to compile: 8000 tags need ~85 MiB, far above a 10 MiB base bound.
    # (A filter, so that Jinja renders it: plain ``{{ image }}`` tags need no Jinja.)
    lines = "".join(f"- name: t{i}\n  image: {{{{ image|string }}}}\n" for i in range(8000))
    small = RenderLimits(time_s=30, memory_bytes=10 * 2**20)
    assert render(lines, values={"image": "ubuntu"}, limits=small).count("image: ubuntu\n") == 8000


def test_without_the_allowance_a_long_template_hits_the_memory_bound() -> None:
    # In a fresh process: free heap the caller already holds counts as room for the child.
    code = textwrap.dedent("""
        from trainyard.errors import SpecError
        from trainyard.spec import RenderLimits, render
        lines = "".join(f"- name: t{i}\\n  image: {{{{ image|string }}}}\\n" for i in range(8000))
        try:
            render(lines, values={"image": "u"}, limits=RenderLimits(
                time_s=30, memory_bytes=10 * 2**20, memory_per_byte=0, memory_per_tag=0))
        except SpecError as exc:
            print(exc)
    """)
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120
    )
    assert "ran past its memory limit of 10 MiB" in result.stdout, result.stderr


def test_multi_line_jinja_messages_become_one_line() -> None:
    message = render_error("{% for x in y %}\nabc\n")
    assert (
        "\n" not in message
        and "Jinja was looking for the following tags: 'endfor' or 'else'" in message
    )
    assert ".;" not in message


def test_rendering_works_from_several_threads_at_once() -> None:
    results: list[str] = []

    def work(i: int) -> None:
        results.append(render("a: {{ v }}\n", values={"v": i}))
        try:
            render(
                "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
                limits=RenderLimits(time_s=0.2),
            )
        except SpecError as exc:
            results.append(str(exc))

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert sorted(r for r in results if r.startswith("a:")) == [f"a: {i}\n" for i in range(4)]
    assert sum("time limit" in r for r in results) == 4
