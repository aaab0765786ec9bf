"""Only the command group a command line names is imported and built, and of it only the
command it names (``cli.main.groups_for``, ``command_for``, issue 15); help, shell completion
and an unknown group or command still see every one."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import typer

from trainyard.cli import workflow
from trainyard.cli.main import SUBAPPS, app, build_app, command_for, groups_for, main


@pytest.mark.parametrize(
    ("argv", "groups"),
    [
        (["workflow", "submit", "x.yaml"], ("workflow",)),
        (["dataset", "list"], ("dataset",)),
        (["data"], ("data",)),
        ([], SUBAPPS),
        (["--help"], SUBAPPS),
        (["--show-completion", "bash"], SUBAPPS),
        (["version"], SUBAPPS),
        (["no-such-group", "workflow"], SUBAPPS),
        (["Workflow"], SUBAPPS),
    ],
)
def test_groups_for_a_command_line(argv: list[str], groups: tuple[str, ...]) -> None:
    assert groups_for(argv) == groups


@pytest.mark.parametrize(
    ("argv", "command"),
    [
        (["workflow", "submit", "x.yaml"], "submit"),
        (["server", "add-user", "bob"], "add-user"),
        (["workflow"], None),
        (["workflow", "--help"], None),
        (["version", "x"], None),
        ([], None),
    ],
)
def test_command_for_a_command_line(argv: list[str], command: str | None) -> None:
    assert command_for(argv) == command


def _commands_of(built: typer.Typer, group: str) -> list[str]:
    click_group = typer.main.get_command(built)
    return sorted(click_group.commands[group].commands)  # type: ignore[attr-defined]


def test_a_named_command_is_the_only_one_built_and_the_group_is_left_whole() -> None:
    before = list(workflow.app.registered_commands)
    assert _commands_of(build_app(("workflow",), "submit"), "workflow") == ["submit"]
    assert _commands_of(build_app(("server",), "add-user"), "server") == ["add-user"]
    assert _commands_of(build_app(("workflow",), "list"), "workflow") == ["list"]
    assert workflow.app.registered_commands == before
    every = _commands_of(build_app(("workflow",), "no-such-command"), "workflow")
    assert {"submit", "query", "list", "logs", "exec"} <= set(every)


def test_a_named_command_runs_and_shows_its_help(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["workflow", "submit", "--help"]) == 0
    assert "Usage: trainyard workflow submit [OPTIONS]" in " ".join(capsys.readouterr().out.split())
    assert main(["workflow", "no-such-command"]) == 2
    assert "No such command 'no-such-command'" in capsys.readouterr().err


def test_a_built_app_has_version_and_the_groups_asked_for() -> None:
    names = [g.name for g in build_app(("pool", "workflow")).registered_groups]
    assert names == ["workflow", "pool"]  # in SUBAPPS order
    assert [g.name for g in app.registered_groups] == list(SUBAPPS)


def test_help_lists_every_group(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    assert all(f" {name} " in out for name in (*SUBAPPS, "version")), out


def test_an_unknown_command_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["no-such-group"]) == 2
    assert "No such command 'no-such-group'" in capsys.readouterr().err


def test_a_group_named_alone_shows_its_commands(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["workflow", "--help"]) == 0
    out = capsys.readouterr().out
    assert all(f" {name} " in out for name in ("submit", "query", "logs", "validate", "exec"))


def _complete(words: str) -> list[str]:
    env = {
        **os.environ,
        "_TRAINYARD_COMPLETE": "complete_bash",
        "COMP_WORDS": words,
        "COMP_CWORD": str(len(words.split()) - 1),
    }
    done = subprocess.run(
        [sys.executable, "-m", "trainyard.cli.main"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.split()


def test_shell_completion_completes_groups_and_their_commands() -> None:
    assert _complete("trainyard wor") == ["workflow"]
    assert _complete("trainyard da") == ["dashboard", "dataset", "data"]
    assert _complete("trainyard workflow su") == ["submit"]
