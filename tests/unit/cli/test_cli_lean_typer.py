"""``cli.lean_typer``: the plain conversion of ``str``, ``bool``, ``list[str]`` and choice
values gives what typer's own (pydantic) conversion gives, for every parameter of every
command, and leaves what it does not take (errors included) to typer's own (issue 15)."""

from __future__ import annotations

from collections.abc import Iterator
from enum import Enum
from typing import Any

import pytest
import typer
from typer._click import Context
from typer.core import _TyperParameter

from trainyard.cli.lean_typer import plain_converter, use_plain_conversion
from trainyard.cli.main import build_app, main

STRINGS = ["abc", "", "a b=c", "ünï", "-", "{{x}}", "1"]


def _commands(command: Any) -> Iterator[Any]:
    yield command
    for sub in getattr(command, "commands", {}).values():
        yield from _commands(sub)


def _samples(annotation: Any) -> list[Any]:
    if annotation is str:
        return [*STRINGS, 1, b"bytes"]
    if annotation is bool:
        return [True, False, "true", "no"]
    if isinstance(annotation, type) and issubclass(annotation, Enum):
        members = list(annotation)
        return [
            *members,
            *[m.value for m in members],
            *[str(m.value).upper() for m in members],
            "nope",
            "",
        ]
    return [STRINGS, (), ("a",), "not-a-list", ("a", 1)]


def _outcome(param: Any, value: Any, ctx: Context) -> tuple[str, Any]:
    try:
        return "value", param.get_runtime_param().coerce(value, param=param, ctx=ctx)
    except Exception as exc:  # noqa: BLE001 - the error is compared too
        return type(exc).__name__, str(exc)


def _plain_params() -> Iterator[tuple[str, Any, Any]]:
    ours = typer.main.get_command(build_app())
    assert use_plain_conversion(ours) > 0
    theirs = typer.main.get_command(build_app())
    for mine, own in zip(_commands(ours), _commands(theirs), strict=True):
        for param, typers in zip(mine.params, own.params, strict=True):
            if isinstance(param, _TyperParameter) and param._runtime_param is not None:
                yield f"{mine.name} {param.name}", param, typers


PLAIN = list(_plain_params())


def test_most_parameters_get_the_plain_conversion() -> None:
    kinds = {repr(p.type_descriptor.annotation) for _n, p, _t in PLAIN}
    assert {"<class 'str'>", "<class 'bool'>", "list[str]"} <= kinds
    assert len(PLAIN) > 100


@pytest.mark.parametrize(("name", "param", "typers"), PLAIN, ids=[n for n, _p, _t in PLAIN])
def test_plain_conversion_gives_what_typers_own_gives(name: str, param: Any, typers: Any) -> None:
    ctx = Context(typer.main.get_command(build_app(("workflow",))))
    for value in [None, *_samples(param.type_descriptor.annotation)]:
        assert _outcome(param, value, ctx) == _outcome(typers, value, ctx), (name, value)


def test_numbers_and_paths_keep_typers_own_conversion() -> None:
    from pathlib import Path

    from typer.models import OptionInfo

    assert plain_converter(int, OptionInfo()) is None
    assert plain_converter(Path, OptionInfo()) is None
    assert plain_converter(str, OptionInfo(parser=str.upper)) is None
    assert plain_converter(list[int], OptionInfo()) is None


def test_an_unknown_choice_gets_typers_own_message(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["workflow", "list", "--format", "XML"]) == 2
    err = capsys.readouterr().err.replace("│", " ")  # rich's box around usage errors
    assert "Value error, 'XML' is not one of 'text', 'json', 'table'" in " ".join(err.split())


def test_help_is_converted_plainly_too() -> None:
    command = typer.main.get_command(build_app(("workflow",)))
    use_plain_conversion(command)
    submit = command.commands["workflow"].commands["submit"]
    option = submit.get_help_option(Context(submit))
    assert option is not None and option._runtime_param is not None
    assert type(option._runtime_param).__name__ == "_PlainRuntimeParam"
