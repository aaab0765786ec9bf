"""``trainyard server start|status|stop``, the auto-start, a server that does not answer,
``--help`` everywhere, ``version`` and shell completion. Each server test has its own home
(with a space and a quote in its path), apart from the session's server."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
import typer
from cli_e2e_support import processes_of, run_cli, run_main, wait_gone

from trainyard import __version__
from trainyard.cli.main import app

RUNNING = re.compile(r"trainyard server running at (http://127\.0\.0\.1:\d+) \(pid (\d+)\)")


@pytest.fixture
def own_home(tmp_path: Path) -> Iterator[Path]:
    """A home of its own; whatever server it still has is stopped afterwards."""
    home = tmp_path / "my home's server"
    home.mkdir()
    yield home
    run_cli(home, "server", "stop")
    assert not wait_gone(processes_of(home), timeout_s=30)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_server_start_status_stop(own_home: Path) -> None:
    down = run_cli(own_home, "server", "status")
    assert down.code == 7 and "no trainyard server is running" in down.err
    down_json = run_cli(own_home, "server", "status", "-t", "json")
    assert down_json.code == 7 and "no trainyard server is running" in down_json.err
    assert json.loads(down_json.out) == {"running": False, "url": None, "pid": None}

    started = run_cli(own_home, "server", "start")
    assert started.code == 0, started.err
    url, pid = RUNNING.search(started.out).groups()
    assert psutil.pid_exists(int(pid)) and (own_home / "server.json").exists()
    assert f"token in {own_home / 'token'}" in started.out
    status = run_cli(own_home, "server", "status")
    assert (status.code, RUNNING.search(status.out).groups()) == (0, (url, pid))
    assert run_cli(own_home, "server", "status", "-t", "json").json() == {
        "running": True,
        "url": url,
        "pid": int(pid),
    }
    again = run_cli(own_home, "server", "start")
    assert again.code == 0 and f"already running at {url}" in again.out
    version = run_cli(own_home, "version")
    assert version.out.splitlines() == [
        f"trainyard {__version__}",
        f"server {__version__} at {url}",
    ]

    stopped = run_cli(own_home, "server", "stop")
    assert (stopped.code, stopped.out.strip()) == (0, "trainyard server stopped")
    assert not psutil.pid_exists(int(pid))  # stop waits until it is gone
    assert not (own_home / "server.json").exists()
    twice = run_cli(own_home, "server", "stop")
    assert (twice.code, twice.out.strip()) == (0, "no trainyard server was running")


def test_the_cli_starts_a_server_again_after_one_was_killed(own_home: Path) -> None:
    first = run_cli(own_home, "workflow", "list", "-t", "json")  # auto-start
    assert (first.code, first.out.strip()) == (0, "[]"), first.err
    _url, pid = RUNNING.search(run_cli(own_home, "server", "status").out).groups()
    server = psutil.Process(int(pid))
    os.kill(int(pid), signal.SIGKILL)
    assert not wait_gone([server], timeout_s=10)
    second = run_cli(own_home, "workflow", "list", "-t", "json")  # server.json is stale now
    assert second.code == 0, second.err
    _new_url, new_pid = RUNNING.search(run_cli(own_home, "server", "status").out).groups()
    assert new_pid != pid


def test_a_server_url_that_answers_nothing_is_a_clear_error(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    got = run_cli(tmp_path, "workflow", "list", TRAINYARD_SERVER_URL=url)
    assert got.code == 7 and got.out == ""
    assert len(got.err.splitlines()) == 1
    assert got.err.startswith(f"error: cannot reach the trainyard server at {url}")
    assert "TRAINYARD_SERVER_URL" in got.err
    assert not (tmp_path / "server.json").exists()  # no local server was started instead
    version = run_cli(tmp_path, "version", TRAINYARD_SERVER_URL=url)
    assert (version.code, version.out) == (0, f"trainyard {__version__}\n")


def _command_paths(command: object, path: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    yield path
    for name, sub in getattr(command, "commands", {}).items():  # typer vendors its own click
        yield from _command_paths(sub, (*path, name))


COMMANDS = list(_command_paths(typer.main.get_command(app)))


def test_every_command_is_reached() -> None:
    names = {" ".join(p) for p in COMMANDS}
    assert {
        "workflow submit",
        "workflow logs",
        "workflow restart",
        "app submit",
        "pool list",
        "resource list",
        "server add-user",
        "version",
    } <= names


@pytest.mark.parametrize("path", COMMANDS, ids=[" ".join(p) or "trainyard" for p in COMMANDS])
def test_help_on_every_command(path: tuple[str, ...]) -> None:
    got = run_main(*path, "--help")
    assert got.code == 0, got.err
    assert "Usage: trainyard" in got.out and " ".join(path) in got.out


def test_show_completion_prints_a_bash_script(tmp_path: Path) -> None:
    got = run_cli(
        tmp_path, "--show-completion", "bash", _TYPER_COMPLETE_TEST_DISABLE_SHELL_DETECTION="1"
    )
    assert got.code == 0, got.err
    assert "_trainyard_completion()" in got.out
    assert "complete -o default -F _trainyard_completion trainyard" in got.out


def test_install_completion_writes_the_script_for_the_shell(tmp_path: Path) -> None:
    got = run_cli(
        tmp_path,
        "--install-completion",
        "bash",
        HOME=str(tmp_path),
        _TYPER_COMPLETE_TEST_DISABLE_SHELL_DETECTION="1",
    )
    assert got.code == 0, got.err
    assert "_trainyard_completion" in (tmp_path / ".bash_completions" / "trainyard.sh").read_text()
    assert ".bash_completions/trainyard.sh" in (tmp_path / ".bashrc").read_text()


@pytest.mark.parametrize(
    ("words", "cword", "expected"),
    [
        ("trainyard wor", 1, {"workflow"}),
        ("trainyard workflow su", 2, {"submit"}),
        ("trainyard server s", 2, {"start", "status", "stop"}),
        ("trainyard workflow submit spec.yaml --wa", 4, {"--wait"}),
    ],
)
def test_completion_answers_through_the_environment(
    tmp_path: Path, words: str, cword: int, expected: set[str]
) -> None:
    got = run_cli(
        tmp_path, _TRAINYARD_COMPLETE="complete_bash", COMP_WORDS=words, COMP_CWORD=str(cword)
    )
    assert got.code == 0, got.err
    assert set(got.out.split()) == expected
