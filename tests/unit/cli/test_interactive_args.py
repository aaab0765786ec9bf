"""The argument rules of ``workflow exec|port-forward|rsync`` (fast, no server)."""

from __future__ import annotations

import pytest
import typer

from trainyard.cli.main import expand_multi_value_flags
from trainyard.cli.rsync_copy import split_task_path
from trainyard.cli.workflow_interactive import parse_port


@pytest.mark.parametrize(("text", "ports"), [("8888", (8888, 8888)), ("18888:8888", (18888, 8888))])
def test_port_is_local_and_remote(text: str, ports: tuple[int, int]) -> None:
    assert parse_port(text) == ports


@pytest.mark.parametrize("text", ["", "0", "70000", "a:1", "1:2:3", "1:", ":1"])
def test_bad_port_is_refused_with_the_form(text: str) -> None:
    with pytest.raises(typer.BadParameter, match="LOCAL\\[:REMOTE\\]"):
        parse_port(text)


def test_task_side_is_named_by_the_task_prefix() -> None:
    assert split_task_path("train", "./data", "train:/tmp/data") == ("./data", "/tmp/data", True)
    assert split_task_path("train", "train:/tmp/out/", "out") == ("out", "/tmp/out", False)


@pytest.mark.parametrize(
    ("src", "dst"),
    [
        ("a", "b"),  # neither side is the task's
        ("train:/a", "train:/b"),  # both
        ("train:relative", "b"),  # not absolute
        ("train:/tmp/../etc", "b"),  # '..'
        ("train:/", "b"),  # the whole root
        ("other:/a", "b"),  # another task's name
    ],
)
def test_task_paths_that_escape_or_are_ambiguous_are_refused(src: str, dst: str) -> None:
    with pytest.raises(typer.BadParameter):
        split_task_path("train", src, dst)


def test_nothing_after_double_dash_is_expanded() -> None:
    argv = ["workflow", "exec", "w-1", "t", "--", "env", "--set", "a=1", "b=2"]
    assert expand_multi_value_flags(argv) == argv
    assert expand_multi_value_flags(["--set", "a=1", "b=2", "--", "x=1"]) == [
        "--set",
        "a=1",
        "--set",
        "b=2",
        "--",
        "x=1",
    ]
