"""``NAME=VALUE`` pairs from the command line: ``--set``, ``--set-string``, ``--set-env``,
``--label``.

``--set`` values are YAML-typed (``1`` is an int, ``1.5`` a float, ``true`` a bool, anything
else a string); ``--set-string`` values stay strings. Later pairs win over earlier ones.

Source: OSMO docs, "Templates and special tokens" and the ``osmo workflow submit`` CLI
reference (``--set``, ``--set-string``, ``--set-env``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from trainyard.errors import SpecError, SpecProblem
from trainyard.spec.fields import check_env_name, check_label_key

__all__ = ["split_pair", "parse_set_values", "parse_set_strings", "parse_env", "parse_labels"]

_SCALARS = (bool, int, float, str)


def split_pair(pair: str, flag: str) -> tuple[str, str]:
    """Split ``NAME=VALUE`` at the first ``=``.

    Raises:
        SpecError: no ``=`` or an empty name; the problem's path is the flag.
    """
    name, sep, value = pair.partition("=")
    if not sep or not name.strip():
        raise _flag_error(flag, f"expected NAME=VALUE, got {pair!r}; write {flag} name=value")
    return name.strip(), value


def _typed(text: str) -> Any:
    if text == "":
        return ""
    import yaml  # on first use: the CLI's start needs no YAML for --label

    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError:
        return text
    return value if type(value) in _SCALARS else text


def _variable_name(name: str, flag: str) -> str:
    if not name.isidentifier():
        raise _flag_error(
            flag,
            f"{name!r} is not a template variable name; use letters, "
            "digits and '_', not starting with a digit",
        )
    return name


def _parse(
    pairs: Iterable[str], flag: str, key: Callable[[str], str], value: Callable[[str], Any]
) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for pair in pairs:
        name, text = split_pair(pair, flag)
        result[key(name)] = value(text)
    return result


def parse_set_values(pairs: Iterable[str]) -> dict[str, Any]:
    """``--set`` pairs to template values, YAML-typed (int, float, bool, else str).

    Raises:
        SpecError: a pair without ``=`` or a name that is not a variable name.
    """
    return _parse(pairs, "--set", lambda n: _variable_name(n, "--set"), _typed)


def parse_set_strings(pairs: Iterable[str]) -> dict[str, str]:
    """``--set-string`` pairs to template values, kept as strings.

    Raises:
        SpecError: a pair without ``=`` or a name that is not a variable name.
    """
    return _parse(pairs, "--set-string", lambda n: _variable_name(n, "--set-string"), str)


def parse_env(pairs: Iterable[str]) -> dict[str, str]:
    """``--set-env`` pairs to environment variables added to every task.

    Raises:
        SpecError: a pair without ``=`` or an invalid variable name.
    """
    return _parse(pairs, "--set-env", lambda n: _checked(check_env_name, n, "--set-env"), str)


def parse_labels(pairs: Iterable[str]) -> dict[str, str]:
    """``--label`` pairs to workflow labels (override the spec's; values checked later).

    Raises:
        SpecError: a pair without ``=`` or an invalid label key.
    """
    return _parse(pairs, "--label", lambda n: _checked(check_label_key, n, "--label"), str)


def _checked(check: Callable[[str], str], name: str, flag: str) -> str:
    try:
        return check(name)
    except ValueError as exc:
        raise _flag_error(flag, str(exc)) from None


def _flag_error(flag: str, message: str) -> SpecError:
    return SpecError([SpecProblem(path=flag, message=message, file="command line")])
