"""``runner.hostenv``: the task's variables cross to the task as data; the sandbox's own
programs start by absolute path with the runner's environment only."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from trainyard.runner.hostenv import EnvRefused, bwrap_options_end, host_start

HOST = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"}
TASK = {"PATH": "/task/out:/usr/bin", "LD_PRELOAD": "/task/out/x.so", "SECRET": "a b\tc=d"}


def _read_args(fd: int) -> list[str]:
    data = b""
    while chunk := os.pread(fd, 65536, len(data)):
        data += chunk
    return data.decode().split("\0")[:-1]


def test_bwrap_gets_the_variables_through_an_args_descriptor(tmp_path: Path) -> None:
    prefix = ["nsenter", "--net=/run/x", "--", "bwrap", "--bind", "/r", "/", "--"]
    start = host_start(prefix, ["sh", "-c", "env"], TASK, TASK, HOST, None, False, tmp_path)
    try:
        assert start.env == HOST
        assert start.argv[0] == "/usr/bin/nsenter"
        at = start.argv.index("--args")
        assert start.argv[at + 1] == str(start.pass_fds[0])
        assert start.argv[at + 2 :] == ["--", "sh", "-c", "env"]
        args = _read_args(start.pass_fds[0])
        assert args[0] == "--clearenv"
        pairs = {args[i + 1]: args[i + 2] for i in range(1, len(args), 3)}
        assert pairs == TASK and args[1::3] == ["--setenv"] * 3
        assert "a b\tc=d" not in " ".join(start.argv)  # no value on a command line
    finally:
        start.close()


def test_a_program_missing_from_the_hosts_path_is_not_looked_for_in_the_tasks(
    tmp_path: Path,
) -> None:
    fake = tmp_path / "bwrap"
    fake.write_text("#!/bin/sh\n")
    fake.chmod(0o755)
    task = {"PATH": str(tmp_path)}
    with pytest.raises(FileNotFoundError):
        host_start(
            ["bwrap", "--"], ["true"], task, task, {"PATH": "/nonexistent"}, None, False, tmp_path
        )


def test_an_env_file_refuses_a_line_break_that_would_forge_another_variable(tmp_path: Path) -> None:
    bad = {"A": "x\nLD_PRELOAD=/tmp/evil.so"}
    with pytest.raises(EnvRefused, match="A holds a line break"):
        host_start(
            ["podman", "run", "IMG"], ["true"], bad, bad, HOST, "--env-file", False, tmp_path
        )


def test_apptainer_reads_shell_quoted_values(tmp_path: Path) -> None:
    start = host_start(
        ["sh", "exec", "IMG"], ["true"], TASK, TASK, HOST, "--env-file", True, tmp_path
    )
    text = (tmp_path / "task.env").read_text()
    assert "SECRET='a b\tc=d'\n" in text and "PATH=" not in text
    assert start.argv[1:] == ["exec", "--env-file", str(tmp_path / "task.env"), "IMG", "true"]


def test_without_a_sandbox_the_command_gets_the_task_environment(tmp_path: Path) -> None:
    start = host_start([], ["true"], TASK, TASK, HOST, None, False, tmp_path)
    assert start.env == TASK and start.argv == ["true"] and start.pass_fds == ()


def test_bwrap_options_end() -> None:
    assert bwrap_options_end(["/usr/bin/bwrap", "--ro-bind", "/", "/", "--"]) == 4
    assert bwrap_options_end(["nsenter", "--", "bwrap", "--"]) == 3
    assert bwrap_options_end(["podman", "run", "IMG"]) is None
