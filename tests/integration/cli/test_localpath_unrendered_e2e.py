"""A spec whose text does not name ``localpath`` is sent by ``workflow submit`` without the
CLI rendering it (issue 15, fifth pass: PyYAML's import and the render off the CLI's start).
What that must not change, through the real CLI and a real server: a spec that names
``localpath`` still gets its file sent; a template that BUILDS the word (so the CLI sent no
file) is refused by the server with one clear line naming the field, and nothing is stored;
a template error of a spec without the word is refused by the server as the CLI refused it."""

from __future__ import annotations

import re
from pathlib import Path

from cli_e2e_support import Server

LINE = re.compile(r"^\S.*?(:\d+)?: .+$")  # FILE[:LINE]: [PATH:] MESSAGE

SPEC = """workflow:
  name: {name}
  tasks:
  - name: t
    command: [sh]
    args: [/tmp/run.sh]
    files:
    - path: /tmp/run.sh
      {key}: run.sh
"""


def _spec(tmp_path: Path, name: str, key: str) -> Path:
    (tmp_path / "run.sh").write_text("echo from-the-local-file\n")
    spec = tmp_path / f"{name}.yaml"
    spec.write_text(SPEC.format(name=name, key=key))
    return spec


def test_a_spec_that_names_localpath_still_sends_its_file(server: Server, tmp_path: Path) -> None:
    workflow_id = server.submit(_spec(tmp_path, "named", "localpath"))
    assert server.wait(workflow_id)["status"] == "COMPLETED"
    assert "from-the-local-file" in server.logs(workflow_id)


def test_a_template_that_builds_the_word_localpath_is_refused_and_nothing_is_stored(
    server: Server, tmp_path: Path
) -> None:
    spec = _spec(tmp_path, "built", "{{ 'local' ~ 'path' }}")
    before = server.ids()
    for extra in ((), ("--dry-run",)):
        got = server.main("workflow", "submit", str(spec), *extra)
        assert got.code == 2, (got.out, got.err)
        assert got.out == ""
        lines = got.err.splitlines()
        assert len(lines) == 1 and LINE.match(lines[0]), got.err
        assert "built.yaml" in lines[0] and "files[0].localpath" in lines[0], got.err
        assert "'run.sh' was not sent with the spec" in lines[0], got.err
        assert "not when a template builds the word" in lines[0], got.err
    assert server.ids() == before


def test_a_template_error_without_localpath_is_refused_by_the_server(
    server: Server, tmp_path: Path
) -> None:
    spec = tmp_path / "broken.yaml"
    spec.write_text(
        "workflow:\n  name: broken\n  tasks:\n  - name: t\n"
        "    command: ['{{ 1 | no_such_filter }}']\n"
    )
    before = server.ids()
    got = server.main("workflow", "submit", str(spec))
    assert got.code == 2, (got.out, got.err)
    lines = got.err.splitlines()
    assert lines and all(LINE.match(line) for line in lines), got.err
    assert any("broken.yaml" in line and "no_such_filter" in line for line in lines), got.err
    assert server.ids() == before
