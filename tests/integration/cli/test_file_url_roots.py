"""``file://`` URLs are limited to the pool's data roots (issue 11: they read and wrote any
host path as the server's user): refused at submit through the real CLI and server, with
the field named; a symlink inside a root that points out of it is refused too."""

from __future__ import annotations

from pathlib import Path

from cli_e2e_support import Server

SPEC = """
workflow:
  name: file-urls
  tasks:
  - name: t
    command: [sh, -c, "echo hi > {{output}}/a.txt"]
    inputs:
    - url: {{ input_url }}
    outputs:
    - url: {{ output_url }}
default-values:
  input_url: s3://bucket/in
  output_url: s3://bucket/out
"""


def submit(server: Server, tmp_path: Path, *sets: str) -> tuple[int, str]:
    path = tmp_path / "spec.yaml"
    path.write_text(SPEC)
    done = server.cli("workflow", "submit", str(path), "--set", *sets)
    return done.code, done.out + done.err


def stored(server: Server) -> set[str]:
    """This file's workflows (named ``file-urls``): other tests' workflows (the OSMO rows
    submitted in the background) may land meanwhile."""
    return {i for i in server.ids() if i.startswith("file-urls-")}


def test_a_host_path_outside_the_data_roots_is_refused_at_submit(
    server: Server, tmp_path: Path
) -> None:
    before = stored(server)
    code, text = submit(server, tmp_path, "input_url=file:///etc/", "output_url=file:///root/x/")
    assert code == 2, text
    assert "tasks[0].inputs[0].url" in text and "'file:///etc/' is a host path" in text, text
    assert "tasks[0].outputs[0].url" in text and "allowed_data_roots" in text, text
    home_code, home_text = submit(server, tmp_path, f"input_url=file://{server.home}/")
    assert home_code == 2 and "outside the pool's data roots" in home_text, home_text
    assert stored(server) == before  # nothing stored


def test_a_symlink_out_of_a_root_is_refused(server: Server, tmp_path: Path) -> None:
    root = server.home / "storage"
    root.mkdir(exist_ok=True)
    link = root / f"escape-{tmp_path.name}"
    link.symlink_to("/etc")
    code, text = submit(server, tmp_path, f"input_url=file://{link}/")
    assert code == 2 and "(/etc)" in text, text


def test_a_url_below_the_home_storage_runs(server: Server, tmp_path: Path) -> None:
    root = server.home / "storage" / tmp_path.name
    (root / "in").mkdir(parents=True)
    (root / "in" / "x.txt").write_text("x\n")
    code, text = submit(
        server, tmp_path, f"input_url=file://{root}/in/", f"output_url=file://{root}/out/"
    )
    assert code == 0, text
    workflow_id = text.split("Workflow submitted: ")[1].split()[0]
    assert server.wait(workflow_id)["status"] == "COMPLETED", server.logs(workflow_id)
    assert (root / "out" / "a.txt").read_text() == "hi\n"


def test_the_system_temp_folder_is_not_a_data_root_by_default(
    server: Server, tmp_path: Path
) -> None:
    """Issue 11: the default roots were ``$TRAINYARD_HOME/storage`` AND ``/tmp``, so any task
    could read and write the host's ``/tmp`` through a ``file://`` output. Now the default is
    the home's storage folder only; the error is one line naming the field and the option."""
    before = stored(server)
    code, text = submit(server, tmp_path, "output_url=file:///tmp/x")
    assert code == 2, text
    lines = [line for line in text.splitlines() if "tasks[0].outputs[0].url" in line]
    assert len(lines) == 1, text
    line = lines[0]
    assert "'file:///tmp/x' is a host path (/tmp/x) outside the pool's data roots" in line, text
    assert f"({server.home}/storage)" in line, text  # the default roots, the temp folder not
    assert "options.allowed_data_roots" in line and "pools.yaml" in line, text
    assert stored(server) == before  # nothing stored


def test_another_users_storage_is_refused_at_submit_and_validate(
    server: Server, tmp_path: Path
) -> None:
    """Issue 24: the submit-time check used the home owner's roots (all of ``storage``), so
    Bob's spec naming ``storage/<owner's folder>`` was accepted and his task only failed at
    run time (2010, "refused: ..."). Now submit and ``workflow validate`` refuse it as Bob,
    one line per URL naming the task, the field and Bob's roots; his own folder passes."""
    added = server.cli("server", "add-user", "roots-bob")
    assert added.code == 0, added.err
    bob = {"TRAINYARD_TOKEN": added.out.strip()}
    theirs = server.home / "storage" / f"owner-{tmp_path.name}"
    (theirs / "in").mkdir(parents=True)
    path = tmp_path / "spec.yaml"
    path.write_text(SPEC)
    sets = ["--set", f"input_url=file://{theirs}/in/", f"output_url=file://{theirs}/out/"]
    before = stored(server)
    for verb in ("submit", "validate"):
        done = server.cli("workflow", verb, str(path), *sets, **bob)
        text = done.out + done.err
        assert done.code == 2, text
        for field in ("inputs", "outputs"):
            lines = [ln for ln in text.splitlines() if f"tasks[0].{field}[0].url" in ln]
            assert len(lines) == 1, text
            assert f"task 't' {field[:-1]} 0:" in lines[0], text
            assert "outside the pool's data roots for user 'roots-bob'" in lines[0], text
            assert f"({server.home}/storage/roots-bob)" in lines[0], text
            assert "use a folder below one of them" in lines[0], text
    assert stored(server) == before  # nothing stored
    own = server.home / "storage" / "roots-bob" / tmp_path.name
    done = server.cli(
        "workflow",
        "validate",
        str(path),
        "--set",
        f"input_url=file://{own}/in/",
        f"output_url=file://{own}/out/",
        **bob,
    )
    assert done.code == 0, done.out + done.err
