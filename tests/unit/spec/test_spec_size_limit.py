"""The spec size limit (``spec.MAX_SPEC_BYTES``, 4 MiB of text): as written, with its
``localpath`` files, rendered (a template's output is bounded too), read from a file."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainyard import spec
from trainyard.errors import SpecError
from trainyard.spec.size import MAX_SPEC_BYTES

HEAD = "workflow:\n  name: big\n  tasks:\n  - name: t\n    command: [echo]\n    args: ['"
TAIL = "']\n"


def sized(total_bytes: int) -> str:
    """A valid spec of exactly ``total_bytes`` bytes."""
    return HEAD + "x" * (total_bytes - len(HEAD) - len(TAIL)) + TAIL


def refusal(call, *args, **kwargs) -> str:  # noqa: ANN001
    with pytest.raises(SpecError) as caught:
        call(*args, **kwargs)
    (problem,) = caught.value.problems
    return str(problem)


def test_the_limit_is_4_mib() -> None:
    assert MAX_SPEC_BYTES == spec.MAX_SPEC_BYTES == 4 * 2**20


def test_a_spec_at_the_limit_loads_one_byte_more_is_refused_naming_size_and_limit(
    tmp_path: Path,
) -> None:
    assert spec.load(sized(MAX_SPEC_BYTES)).workflow.name == "big"
    message = refusal(spec.load, sized(MAX_SPEC_BYTES + 1))
    assert message == (
        "spec: the spec is 4.0 MiB (4,194,305 bytes), over the limit of 4.0 MiB "
        "(4,194,304 bytes) of spec text; make it smaller (large data belongs in a "
        "dataset or a URL input)"
    )


def test_a_file_over_the_limit_is_refused_before_it_is_read(tmp_path: Path) -> None:
    path = tmp_path / "big.yaml"
    with path.open("wb") as handle:  # sparse: 50 MiB that reading would fill with NULs
        handle.truncate(50 * 2**20)
    message = refusal(spec.load, path)
    assert message.startswith(f"{path}: the spec is 50.0 MiB (52,428,800 bytes), over the limit")


def test_bytes_not_characters_are_counted() -> None:
    text = sized(MAX_SPEC_BYTES - 1000).replace("xxx", "é", 600)  # é is 2 bytes in UTF-8
    assert spec.text_bytes(text) == MAX_SPEC_BYTES - 1000 - 600 * 3 + 600 * 2
    wide = sized(MAX_SPEC_BYTES).replace("x", "é", 10)
    assert len(wide) == MAX_SPEC_BYTES and "4,194,314 bytes" in refusal(spec.load, wide)


def test_a_small_template_may_not_render_past_the_limit() -> None:
    template = "workflow:\n  name: big\n  tasks:\n  - name: t\n    command: [echo]\n    args: ['{{ 'x' * n }}']\n"
    assert spec.render(template, values={"n": 1000}).count("x") == 1000
    message = refusal(spec.render, template, values={"n": 5 * 2**20})
    assert "the rendered spec is 5.0 MiB (5,242,958 bytes), over the limit of 4.0 MiB" in message
    assert "make the template build less text" in message


def test_the_rendered_text_is_checked_by_parse() -> None:
    assert "the rendered spec is 4.0 MiB" in refusal(spec.parse, sized(MAX_SPEC_BYTES + 1))


def test_the_spec_with_its_localpath_files_is_checked_together() -> None:
    spec.check_source_size("a" * 1000, {"f": "b" * (MAX_SPEC_BYTES - 1000)})
    message = refusal(
        spec.check_source_size, "a" * 1000, {"f": "b" * MAX_SPEC_BYTES}, file="s.yaml"
    )
    assert message.startswith(
        "s.yaml: the spec with its localpath files is 4.0 MiB (4,195,304 bytes)"
    )


def test_special_tokens_put_back_after_rendering_count_too() -> None:
    template = (
        "workflow:\n  name: big\n  tasks:\n  - name: t\n    command: [echo]\n"
        "    args: ['{% for i in range(n) %}{% for j in range(n) %}{{output}}{% endfor %}"
        "{% endfor %}']\n"
    )
    assert spec.render(template, values={"n": 3}).count("{{output}}") == 9
    message = refusal(spec.render, template, values={"n": 1024})  # 3 MiB before, 10 MiB after
    assert "the rendered spec is 10.0 MiB" in message and "over the limit of 4.0 MiB" in message
