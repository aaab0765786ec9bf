"""Datasets belong to their creator (issue 11): through the real CLI against the real
server, another user reads only what is shared with them and may not add versions to,
tag, delete or share it (exit 8, the owner named); a task reads datasets as its
workflow's submitter (a dataset input not shared with them fails the task with 2010)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_e2e_support import Server

READER = """
workflow:
  name: reader
  tasks:
  - name: t
    command: [sh, -c, "cat {{input:0}}/x.txt"]
    inputs:
    - dataset: {name: {{ dataset }}}
default-values:
  dataset: none
"""

WRITER = """
workflow:
  name: writer
  tasks:
  - name: t
    command: [sh, -c, "echo x > {{output}}/x.txt"]
    outputs:
    - dataset: {name: {{ dataset }}}
default-values:
  dataset: none
"""

LATE_READER = """
workflow:
  name: late-reader
  tasks:
  - name: first
    command: [sleep, "8"]
  - name: read
    command: [sh, -c, "cat {{input:1}}/x.txt"]
    inputs:
    - task: first
    - dataset: {name: bobs-late}
"""


@pytest.fixture(scope="module")
def people(server: Server) -> dict[str, dict[str, str]]:
    env = {}
    for name in ("ds-bob", "ds-carol"):
        added = server.cli("server", "add-user", name)
        assert added.code == 0, added.err
        env[name] = {"TRAINYARD_TOKEN": added.out.strip()}
    return env


def upload(server: Server, tmp_path: Path, name: str, env: dict[str, str]) -> int:
    src = tmp_path / f"src-{name}"
    src.mkdir(exist_ok=True)
    (src / "x.txt").write_text(f"data of {name}\n")
    done = server.cli("dataset", "upload", name, f"{src}/", "--quiet", **env)
    return done.code


def test_another_user_reads_only_what_is_shared_and_never_writes(
    server: Server, people: dict[str, dict[str, str]], tmp_path: Path
) -> None:
    bob, carol = people["ds-bob"], people["ds-carol"]
    assert upload(server, tmp_path, "bobs-data", bob) == 0
    dest = tmp_path / "dest"
    refused = server.cli("dataset", "download", "bobs-data", str(dest), "--quiet", **carol)
    assert refused.code == 8, refused.err
    assert "dataset bobs-data belongs to ds-bob and is not shared with ds-carol" in refused.err
    assert not dest.exists() or not list(dest.iterdir())
    listed = json.loads(server.cli("dataset", "list", "-t", "json", **carol).out)
    assert "bobs-data" not in [d["name"] for d in listed]
    for args in (
        ("dataset", "delete", "bobs-data", "--yes"),
        ("dataset", "tag", "bobs-data:1", "gold"),
        ("dataset", "share", "bobs-data", "--user", "ds-carol"),
    ):
        got = server.cli(*args, **carol)
        assert got.code == 8 and "belongs to ds-bob" in got.err, (args, got.err)
    assert upload(server, tmp_path, "bobs-data", carol) == 8

    shared = server.cli("dataset", "share", "bobs-data", "--user", "ds-carol", **bob)
    assert shared.code == 0 and "readers: ds-carol" in shared.out, shared.err
    got = server.cli("dataset", "download", "bobs-data", str(dest), "--quiet", **carol)
    assert got.code == 0, got.err
    assert (dest / "x.txt").read_text() == "data of bobs-data\n"
    assert upload(server, tmp_path, "bobs-data", carol) == 8  # reading is not writing
    delete = server.cli("dataset", "delete", "bobs-data", "--yes", **carol)
    assert delete.code == 8 and "only they or an admin may delete it" in delete.err
    assert upload(server, tmp_path, "bobs-data", bob) == 0  # the owner: version 2
    gone = server.cli("dataset", "delete", "bobs-data", "--yes")  # the admin (home token)
    assert gone.code == 0, gone.err


def test_a_dataset_not_shared_is_refused_at_submit(
    server: Server, people: dict[str, dict[str, str]], tmp_path: Path
) -> None:
    bob, carol = people["ds-bob"], people["ds-carol"]
    assert upload(server, tmp_path, "bobs-private", bob) == 0
    spec = tmp_path / "reader.yaml"
    spec.write_text(READER)
    before = server.ids()
    refused = server.cli("workflow", "submit", str(spec), "--set", "dataset=bobs-private", **carol)
    assert refused.code == 8, refused.err
    assert (
        "task 't' input 0 (dataset bobs-private): dataset bobs-private belongs to ds-bob"
        in refused.err
    )
    writer = tmp_path / "writer.yaml"
    writer.write_text(WRITER)
    refused = server.cli(
        "workflow", "submit", str(writer), "--set", "dataset=bobs-private", **carol
    )
    assert refused.code == 8 and "only they or an admin may add a version" in refused.err
    assert server.ids() == before
    done = server.cli(
        "workflow", "submit", str(spec), "--set", "dataset=bobs-private", "--wait", **bob
    )
    assert done.code == 0, done.out + done.err


def test_a_task_reads_datasets_as_its_submitter(
    server: Server, people: dict[str, dict[str, str]], tmp_path: Path
) -> None:
    """The runner checks again: a dataset made (not shared) after submit fails the input."""
    bob, carol = people["ds-bob"], people["ds-carol"]
    spec = tmp_path / "late.yaml"
    spec.write_text(LATE_READER)
    done = server.cli("workflow", "submit", str(spec), "-t", "json", **carol)
    assert done.code == 0, done.err
    workflow_id = json.loads(done.out)["id"]
    assert upload(server, tmp_path, "bobs-late", bob) == 0  # while the first task sleeps
    final = server.wait(workflow_id)
    tasks = {t["name"]: t for g in final["groups"] for t in g["tasks"]}
    assert tasks["read"]["exit_code"] == 2010, final
    logs = server.logs(workflow_id)
    assert "belongs to ds-bob and is not shared with ds-carol" in logs, logs
    assert "data of bobs-late" not in logs
