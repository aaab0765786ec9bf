"""typer's conversion of command-line values, without pydantic for the simple ones (issue 15).

typer 0.29 converts every parameter's value through a pydantic ``TypeAdapter`` that it builds
on first use (``typer._coercion.build_runtime_param``), a plain ``str`` option included, so
any command imports pydantic: about 40 ms of ``workflow submit``'s start on this machine,
for values that are already strings. ``use_plain_conversion`` gives the parameters whose
type is ``str``, ``bool``, ``list[str]`` or an ``Enum`` (a choice) a conversion that gives
what typer's adapter gives, with typer's own choice matching
(``typer._param_types.coerce_cli_choice``).
Any value it does not take as it is (not a string, an unknown choice) goes to typer's own
conversion, so every error message is typer's. Other types (numbers, paths, files, custom
parsers) keep typer's conversion.

This reaches into typer's private parts (``_TyperParameter._runtime_param``,
``typer._coercion.RuntimeParam``). A typer without them (before 0.25, which converted
with click's types and imported no pydantic, or a later one that changed them) is left as
it is: ``use_plain_conversion`` then does nothing, and conversion stays typer's own.
``tests/unit/cli/test_cli_lean_typer.py`` checks, for every parameter of every command, that
both conversions give the same value.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from enum import Enum
from typing import Any, get_args, get_origin

__all__ = ["use_plain_conversion", "plain_converter"]

try:  # typer's private conversion layer (0.25 and later)
    from typer._coercion import RuntimeParam, build_runtime_param
    from typer._param_types import coerce_cli_choice
    from typer.core import _TyperParameter
except ImportError:  # pragma: no cover - another typer: its own conversion stays
    RuntimeParam = None  # type: ignore[assignment,misc]

Converter = Callable[[Any, Any], Any]
"""``(value, click context) -> converted value``; raises ``ValueError`` or ``TypeError`` for
a value it leaves to typer."""


def _as_str(value: Any, _ctx: Any) -> str:
    if type(value) is not str:
        raise TypeError("not a plain string")
    return value


def _as_bool(value: Any, _ctx: Any) -> bool:
    if type(value) is not bool:
        raise TypeError("not a bool")
    return value


def _as_str_list(value: Any, _ctx: Any) -> list[str]:
    if not isinstance(value, (list, tuple)):
        raise TypeError("not a list")
    return [_as_str(item, _ctx) for item in value]


def _choice(annotation: type[Enum], case_sensitive: bool) -> Converter:
    choices = tuple(annotation)

    def convert(value: Any, ctx: Any) -> Any:
        return coerce_cli_choice(value, choices=choices, case_sensitive=case_sensitive, ctx=ctx)

    return convert


def plain_converter(annotation: Any, parameter_info: Any) -> Converter | None:
    """The plain conversion for a parameter of this type, or None (typer's own is kept):
    ``str``, ``bool`` (a flag: typer converts no ``bool`` value, nor a missing one),
    ``list[str]`` and ``Enum`` subclasses, without a custom parser."""
    if getattr(parameter_info, "parser", None) is not None:
        return None
    if annotation is str:
        return _as_str
    if annotation is bool:
        return _as_bool
    if get_origin(annotation) is list and get_args(annotation) == (str,):
        return _as_str_list
    if isinstance(annotation, type) and issubclass(annotation, Enum):
        return _choice(annotation, bool(parameter_info.case_sensitive))
    return None


if RuntimeParam is not None:

    @dataclass(frozen=True)
    class _PlainRuntimeParam(RuntimeParam):  # type: ignore[misc,valid-type]
        """typer's runtime conversion of one parameter, by ``convert``; typer's own for a
        value ``convert`` leaves (built then, pydantic with it)."""

        convert: Converter

        def _coerce_value(self, value: Any, param: Any, ctx: Any) -> Any:
            try:
                return self.convert(value, ctx)
            except (TypeError, ValueError):
                typers_own = build_runtime_param(param.type_descriptor)
                return typers_own._coerce_value(value, param=param, ctx=ctx)


def _commands(command: Any) -> Iterator[Any]:
    yield command
    for sub in getattr(command, "commands", {}).values():
        yield from _commands(sub)


def _give_plain(param: Any) -> bool:
    """Give ``param`` its type's plain conversion, if typer has not converted with it yet
    and the type has one; whether it got it."""
    if not isinstance(param, _TyperParameter) or param._runtime_param is not None:
        return False
    descriptor = param.type_descriptor
    if descriptor.file_annotation is not None:
        return False
    convert = plain_converter(descriptor.annotation, descriptor.parameter_info)
    if convert is None:
        return False
    param._runtime_param = _PlainRuntimeParam(
        parameter_info=descriptor.parameter_info, annotation=descriptor.annotation, convert=convert
    )
    return True


def _plain_help_option(command: Any) -> None:
    """click makes a command's ``--help`` option when it first parses (it needs the
    context): give it the plain conversion then."""
    made = command.get_help_option

    def get_help_option(ctx: Any) -> Any:
        option = made(ctx)
        _give_plain(option)
        return option

    command.get_help_option = get_help_option


def use_plain_conversion(command: Any) -> int:
    """Give every parameter of ``command`` and its subcommands (a click command that
    ``typer.main.get_command`` built; ``--help`` included, when click makes it) that typer
    has not converted yet the plain conversion of its type, where it has one. Returns how
    many parameters got it now (0 with a typer that has no pydantic conversion)."""
    if RuntimeParam is None:  # pragma: no cover - another typer
        return 0
    done = 0
    for each in _commands(command):
        done += sum(_give_plain(param) for param in getattr(each, "params", ()))
        if hasattr(each, "get_help_option"):
            _plain_help_option(each)
    return done
