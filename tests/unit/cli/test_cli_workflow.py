"""The ``trainyard`` command line: entry point, error printing, ``workflow`` commands."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import httpx
import pytest

from trainyard import __version__
from trainyard.cli.client import _raise_for
from trainyard.cli.main import EXIT_CODES, app, expand_multi_value_flags, main
from trainyard.cli.workflow_ops import looks_like_workflow_id
from trainyard.errors import (
    BadArgumentError,
    ConfigError,
    ForbiddenError,
    NotFoundError,
    RefusedError,
    ServerError,
    SpecError,
    TooBusyError,
    TrainyardError,
)

HELLO = "workflow:\n  name: {{ name }}\n  tasks:\n  - name: t\n    command: [echo, '{{ msg }}', '{{output}}']\ndefault-values:\n  name: hello\n  msg: hi\n"


@pytest.fixture(autouse=True)
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty TRAINYARD_HOME for every test (no pools.yaml: only the 'local' pool)."""
    home = tmp_path / "home"
    monkeypatch.setenv("TRAINYARD_HOME", str(home))
    monkeypatch.delenv("TRAINYARD_SERVER_URL", raising=False)
    monkeypatch.delenv("TRAINYARD_TOKEN", raising=False)
    return home


def write(path: Path, text: str) -> Path:
    path.write_text(textwrap.dedent(text).lstrip("\n"))
    return path


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    assert run(capsys, "version") == (0, f"trainyard {__version__}\n", "")


def test_validate_succeeds(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec_file = write(tmp_path / "hello.yaml", HELLO)
    assert run(capsys, "workflow", "validate", str(spec_file)) == (
        0,
        "Workflow validation succeeded.\n",
        "",
    )


def test_validate_prints_every_problem_once_to_stderr_and_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec_file = write(
        tmp_path / "bad spec.yaml",
        """
        workflow:
          name: w
          tasks:
          - name: t
            command: []
            volumeMounts: [/data]
          - name: T
            command: [x]
    """,
    )
    code, out, err = run(capsys, "workflow", "validate", str(spec_file))
    assert (code, out) == (2, "")
    lines = err.splitlines()  # a broken field does not hide the cross checks of the rest
    assert lines == [
        f"{spec_file}:5: workflow.tasks[0].command: command is empty; give the program to run as a list, such as [sh, -c]",
        *_cross_check_lines(spec_file),
    ]
    spec_file.write_text(spec_file.read_text().replace("command: []", "command: [x]"))
    code, out, err = run(capsys, "workflow", "validate", str(spec_file))
    assert code == 2
    assert err.splitlines() == _cross_check_lines(spec_file)


def _cross_check_lines(spec_file: Path) -> list[str]:
    return [
        f"{spec_file}:6: workflow.tasks[0].volumeMounts[0]: volume mount source '/data' is not allowed on pool "
        "'local' (allowed: none); an administrator can allow it by adding it to options.allowed_mounts of the "
        "pool in pools.yaml",
        f"{spec_file}:7: workflow.tasks[1].name: task name 'T' is already used by task 't' (names match "
        "case-insensitively and '-' equals '_'); rename one",
    ]


def test_several_pairs_may_follow_one_flag(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec_file = write(tmp_path / "hello.yaml", HELLO)
    code, out, err = run(
        capsys,
        "workflow",
        "spec",
        str(spec_file),
        "--set",
        "name=greetings",
        "msg=Custom message!",
        "--set-string",
        "n=1",
    )
    assert code == 0, err
    assert "name: greetings" in out and "[echo, 'Custom message!', '{{output}}']" in out


def test_set_string_wins_over_set(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec_file = write(tmp_path / "hello.yaml", HELLO)
    code, out, _ = run(
        capsys, "workflow", "spec", str(spec_file), "--set", "msg=typed", "--set-string", "msg=0010"
    )
    assert code == 0 and "'0010'" in out


def test_spec_prints_the_rendered_text_with_tokens(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec_file = write(tmp_path / "hello.yaml", HELLO)
    code, out, err = run(capsys, "workflow", "spec", str(spec_file))
    assert (code, err) == (0, "")
    assert out == HELLO.replace("{{ name }}", "hello").replace("{{ msg }}", "hi")


def test_spec_refuses_an_invalid_spec(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec_file = write(tmp_path / "hello.yaml", HELLO)
    code, out, err = run(capsys, "workflow", "spec", str(spec_file), "--set-env", "1BAD=x")
    assert (code, out) == (2, "")
    assert err.startswith("command line: --set-env: invalid environment variable name '1BAD'")


def test_an_unset_variable_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec_file = write(tmp_path / "s.yaml", "workflow:\n  name: {{ missing }}\n")
    code, _, err = run(capsys, "workflow", "validate", str(spec_file))
    assert code == 2
    assert err == (
        f"{spec_file}:2: template variable 'missing' is not set; set it with --set missing=VALUE "
        "or add it under default-values\n"
    )


def test_labels_from_the_command_line_are_checked(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec_file = write(tmp_path / "hello.yaml", HELLO)
    code, _, err = run(
        capsys, "workflow", "validate", str(spec_file), "--label", "team=", "tier=gold"
    )
    assert code == 2 and "workflow.labels.team: a label value must be non-empty" in err
    assert run(capsys, "workflow", "validate", str(spec_file), "--label", "team=ml")[0] == 0


def test_pools_come_from_the_pools_file(
    tmp_path: Path, home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    home.mkdir()
    write(
        home / "pools.yaml",
        """
        pools:
          gpu:
            node_count: 2
            node: {platform: dgx-h100, gpu: 8}
            options: {allowed_mounts: [/dev/shm]}
    """,
    )
    spec_file = write(
        tmp_path / "s.yaml",
        """
        workflow:
          name: w
          resources: {default: {gpu: 8, platform: dgx-h100}}
          tasks: [{name: t, command: [x], volumeMounts: [/dev/shm]}]
    """,
    )
    assert run(capsys, "workflow", "validate", str(spec_file), "--pool", "gpu")[0] == 0
    code, _, err = run(capsys, "workflow", "validate", str(spec_file))
    assert (
        code == 2 and "not offered by pool 'local'" in err and "not allowed on pool 'local'" in err
    )
    spec_file.write_text(spec_file.read_text().replace("name: w", "name: w\n  pool: gpu"))
    assert run(capsys, "workflow", "validate", str(spec_file))[0] == 0


def test_an_unknown_pool_is_not_found(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec_file = write(tmp_path / "hello.yaml", HELLO)
    code, out, err = run(capsys, "workflow", "validate", str(spec_file), "--pool", "nope")
    assert (code, out) == (3, "")
    assert err.startswith("error: unknown pool 'nope'; pools: local")


def test_a_missing_file_is_a_spec_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "workflow", "validate", str(tmp_path / "nope.yaml"))
    assert code == 2 and "cannot read the spec: No such file or directory" in err


def test_usage_errors_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert run(capsys, "workflow", "validate")[0] == 2
    assert run(capsys, "workflow", "nonsense")[0] == 2
    assert run(capsys, "--help")[0] == 0


def test_schema_is_json_with_yaml_keys(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "workflow", "schema")
    schema = json.loads(out)
    assert code == 0 and "exitActions" in schema["$defs"]["TaskSpec"]["properties"]


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["--set", "a=1", "b=2"], ["--set", "a=1", "--set", "b=2"]),
        (
            ["s.yaml", "--set", "a=1", "b=2", "--set-string", "c=3", "d=4", "--pool", "p"],
            [
                "s.yaml",
                "--set",
                "a=1",
                "--set",
                "b=2",
                "--set-string",
                "c=3",
                "--set-string",
                "d=4",
                "--pool",
                "p",
            ],
        ),
        (["--set", "a=1", "spec.yaml"], ["--set", "a=1", "spec.yaml"]),
        (["--set", "a=1", "spec.yaml", "b=2"], ["--set", "a=1", "spec.yaml", "b=2"]),
        (["--pool", "x=y"], ["--pool", "x=y"]),
        (
            ["--label", "t=", "--set-env", "A=1", "B=2"],
            ["--label", "t=", "--set-env", "A=1", "--set-env", "B=2"],
        ),
    ],
)
def test_multi_value_flags_are_expanded(argv: list[str], expected: list[str]) -> None:
    assert expand_multi_value_flags(argv) == expected


def test_the_app_has_the_workflow_group_and_version() -> None:
    names = {c.name or c.callback.__name__ for c in app.registered_commands if c.callback}
    names |= {g.name for g in app.registered_groups if g.name}
    assert {"version", "workflow"} <= names


def flat(text: str) -> str:
    """Text with rich's box drawing and line wrapping undone (usage errors come boxed)."""
    for char in "│╭╮╰╯─":
        text = text.replace(char, " ")
    return " ".join(text.split())


def test_validate_with_no_server_checks_here_and_starts_none(
    tmp_path: Path, home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec_file = write(tmp_path / "hello.yaml", HELLO)
    code, out, err = run(capsys, "workflow", "validate", str(spec_file), "-t", "json")
    assert (code, err) == (0, "")
    assert json.loads(out) == {
        "valid": True,
        "name": "hello",
        "pool": "local",
        "server": None,
        "warnings": [],
    }
    assert run(capsys, "workflow", "spec", str(spec_file))[0] == 0
    assert not (home / "server.json").exists()


def test_validate_json_lists_the_problems_and_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec_file = write(
        tmp_path / "s.yaml", "workflow:\n  name: w\n  tasks:\n  - name: t\n    command: []\n"
    )
    code, out, err = run(capsys, "workflow", "validate", str(spec_file), "-t", "json")
    assert code == 2
    data = json.loads(out)
    assert data["valid"] is False
    assert [(p["path"], p["line"], p["file"]) for p in data["problems"]] == [
        ("workflow.tasks[0].command", 5, str(spec_file))
    ]
    assert "command is empty" in err  # people still read the problem on stderr


def test_submit_of_a_missing_file_says_so_without_a_server(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run(capsys, "workflow", "submit", "typo.yaml")
    assert (code, out) == (2, "")
    assert err == (
        "typo.yaml: no such spec file; check the path (to submit a workflow again, "
        "give its id: NAME-N)\n"
    )
    assert not (home / "server.json").exists()


@pytest.mark.parametrize(
    ("text", "is_id"),
    [
        ("hello-osmo-3", True),
        ("a-1", True),
        ("nope-404", True),
        ("typo.yaml", False),
        ("dir/spec-1", False),
        ("hello", False),
        ("hello-", False),
        ("-1", False),
    ],
)
def test_what_looks_like_a_workflow_id(text: str, is_id: bool) -> None:
    assert looks_like_workflow_id(text) is is_id


def test_list_refuses_an_unknown_status_naming_the_valid_ones(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, err = run(capsys, "workflow", "list", "--status", "BOGUS")
    assert (code, out) == (2, "")
    assert (
        "unknown workflow status 'BOGUS'; statuses: PENDING, WAITING, RUNNING, COMPLETED, "
        "FAILED," in flat(err)
    )


@pytest.mark.parametrize("count", ["0", "-2"])
def test_list_refuses_a_count_below_1(capsys: pytest.CaptureFixture[str], count: str) -> None:
    code, out, err = run(capsys, "workflow", "list", "--count", count)
    assert (code, out) == (2, "")
    assert "--count" in flat(err)


def test_logs_refuses_zero_lines(capsys: pytest.CaptureFixture[str]) -> None:
    assert run(capsys, "workflow", "logs", "w-1", "-n", "0")[0] == 2


def test_the_main_help_has_the_exit_code_table(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "--help")
    assert code == 0 and "Exit codes:" in out
    for number, meaning in EXIT_CODES:
        assert f"{number} {meaning}" in flat(out)


def test_the_exit_code_table_matches_the_error_classes() -> None:
    table = dict(EXIT_CODES)
    for cls, word in (
        (SpecError, "spec"),
        (NotFoundError, "not found"),
        (RefusedError, "refused"),
        (ServerError, "server"),
        (ForbiddenError, "403"),
    ):
        assert word in table[cls.exit_code]


def _answer(status: int, body: object) -> httpx.Response:
    return httpx.Response(status, json=body, request=httpx.Request("GET", "http://x/api"))


@pytest.mark.parametrize(
    ("status", "body", "cls", "message"),
    [
        (
            409,
            {"kind": "RefusedError", "detail": [{"message": "workflow w-1 is RUNNING"}]},
            RefusedError,
            "workflow w-1 is RUNNING",
        ),
        (409, {"detail": [{"message": "busy"}]}, RefusedError, "busy"),
        (
            400,
            {"kind": "ConfigError", "detail": [{"message": "pool p: bad"}]},
            ConfigError,
            "pool p: bad",
        ),
        (400, {"detail": [{"message": "refused"}]}, BadArgumentError, "refused"),
        (
            400,
            {"kind": "BadArgumentError", "detail": [{"message": "expires at 'x'"}]},
            BadArgumentError,
            "expires at 'x'",
        ),
        (429, {"detail": [{"message": "too many"}]}, TooBusyError, "too many"),
        (
            404,
            {"kind": "NotFoundError", "detail": [{"message": "no w-1"}]},
            NotFoundError,
            "no w-1",
        ),
        (
            403,
            {"kind": "ForbiddenError", "detail": [{"message": "not yours"}]},
            ForbiddenError,
            "not yours",
        ),
        (
            422,
            {
                "detail": [
                    {
                        "type": "greater_than_equal",
                        "loc": ["query", "lines"],
                        "msg": "Input should be greater than or equal to 1",
                    }
                ]
            },
            BadArgumentError,
            "lines: Input should be greater than or equal to 1",
        ),
        (500, {"detail": "boom"}, ServerError, "boom"),
    ],
)
def test_server_errors_come_back_as_their_class(
    status: int, body: object, cls: type, message: str
) -> None:
    with pytest.raises(TrainyardError) as caught:
        _raise_for(_answer(status, body))
    assert type(caught.value) is cls and str(caught.value) == message


def test_a_bad_argument_exits_2_whichever_side_finds_it() -> None:
    """Issue 24: a bad value found by the server (400, or FastAPI's 422 on a query
    parameter) exited 4, the same found by the CLI 2 (click's usage error)."""
    for status in (400, 422):
        with pytest.raises(BadArgumentError) as caught:
            _raise_for(_answer(status, {"detail": [{"message": "m"}]}))
        assert caught.value.exit_code == 2
    table = dict(EXIT_CODES)
    assert "usage error" in table[BadArgumentError.exit_code]


def test_a_refused_request_exits_4_not_7() -> None:
    with pytest.raises(RefusedError) as caught:
        _raise_for(_answer(409, {"kind": "RefusedError", "detail": [{"message": "m"}]}))
    assert caught.value.exit_code == 4


def test_a_server_spec_error_keeps_every_problem() -> None:
    rows = [{"path": "workflow.name", "message": "bad", "line": 2, "file": "s.yaml"}]
    with pytest.raises(SpecError) as caught:
        _raise_for(_answer(422, {"kind": "SpecError", "detail": rows}))
    assert [str(p) for p in caught.value.problems] == ["s.yaml:2: workflow.name: bad"]


def test_query_shows_each_failure_reason_under_the_table(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from trainyard.cli.workflow_query import _query_table

    task = {
        "name": "t",
        "lead": False,
        "status": "FAILED_BACKEND_ERROR",
        "retry_id": 1,
        "exit_code": 3001,
        "node": "n",
        "start_time": None,
        "end_time": None,
        "failure_reason": "sbatch exited 1: sbatch: error: invalid partition [x]",
        "retries": [
            {
                "retry_id": 0,
                "status": "RESCHEDULED",
                "exit_code": 3,
                "node": "n",
                "start_time": None,
                "end_time": None,
                "failure_reason": None,
            }
        ],
    }
    _query_table(
        {
            "id": "w-1",
            "name": "w",
            "status": "FAILED",
            "submitted_by": "me",
            "submit_time": "now",
            "groups": [{"name": "g", "tasks": [task]}],
        }
    )
    out = capsys.readouterr().out
    assert "t retry 1 failed: sbatch exited 1: sbatch: error: invalid partition [x]" in out
    assert "retry 0 failed" not in out
