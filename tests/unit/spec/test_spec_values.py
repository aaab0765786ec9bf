"""NAME=VALUE pairs from the command line."""

from __future__ import annotations

import pytest

from trainyard.errors import SpecError
from trainyard.spec import parse_env, parse_labels, parse_set_strings, parse_set_values


@pytest.mark.parametrize(
    ("pair", "value"),
    [
        ("n=4", 4),
        ("lr=0.5", 0.5),
        ("flag=true", True),
        ("flag=False", False),
        ("name=abc", "abc"),
        ("v=22.04", 22.04),
        ("e=", ""),
        ("date=2024-01-01", "2024-01-01"),
        ("l=[1, 2]", "[1, 2]"),
        ("m={a: 1}", "{a: 1}"),
        ("n=null", "null"),
        ("s=a=b", "a=b"),
        ("q='x'", "x"),
        ("msg=Custom message!", "Custom message!"),
        ("u=ünï", "ünï"),
        ("b=: bad", ": bad"),
    ],
)
def test_set_values_are_yaml_typed_scalars(pair: str, value: object) -> None:
    assert parse_set_values([pair]) == {pair.split("=")[0]: value}


def test_later_pairs_win() -> None:
    assert parse_set_values(["a=1", "a=2"]) == {"a": 2}


def test_set_strings_stay_strings() -> None:
    assert parse_set_strings(["n=4", "f=true", "e="]) == {"n": "4", "f": "true", "e": ""}


@pytest.mark.parametrize(
    ("parse", "pair", "reason"),
    [
        (parse_set_values, "novalue", "expected NAME=VALUE, got 'novalue'; write --set name=value"),
        (parse_set_values, "=1", "expected NAME=VALUE"),
        (parse_set_values, "a-b=1", "not a template variable name"),
        (parse_set_strings, "1a=x", "not a template variable name"),
        (parse_env, "A-B=1", "invalid environment variable name"),
        (parse_env, "noequals", "write --set-env name=value"),
        (parse_labels, "Bad Key=x", "invalid label key"),
    ],
)
def test_malformed_pairs_name_the_flag(parse: object, pair: str, reason: str) -> None:
    with pytest.raises(SpecError) as caught:
        parse([pair])  # type: ignore[operator]
    [problem] = caught.value.problems
    assert reason in problem.message
    assert problem.path.startswith("--")
    assert str(problem).startswith("command line: --")


def test_env_and_labels_keep_strings() -> None:
    assert parse_env(["PORT=29400", "EMPTY="]) == {"PORT": "29400", "EMPTY": ""}
    assert parse_labels(["team=ml", "example.com/x=1"]) == {"team": "ml", "example.com/x": "1"}
